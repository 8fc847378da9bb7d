# One entry point for checks: CI runs `make check` exactly as the README shows it.
PYTHON ?= python3
PY_SOURCES = gateway ledger handlers tests

.PHONY: install check lint typecheck test chaos bench bench-short up

install:
	$(PYTHON) -m pip install -q -e '.[dev]'

check: install lint typecheck test

lint:
	$(PYTHON) -m ruff format --check $(PY_SOURCES)
	$(PYTHON) -m ruff check $(PY_SOURCES)

# mypy cannot follow setuptools' package-dir mapping, so it checks a tree of links laid out the way the
# wheel installs the folders: build/typecheck/effectgate/{__init__.py,gateway,handlers,ledger}.
TYPECHECK_TREE = build/typecheck/effectgate
typecheck:
	rm -rf build/typecheck && mkdir -p $(TYPECHECK_TREE)
	ln -s ../../../handlers/_effectgate/__init__.py ../../../handlers/_effectgate/py.typed $(TYPECHECK_TREE)/
	ln -s ../../../gateway ../../../handlers ../../../ledger ../../../migrations $(TYPECHECK_TREE)/
	cd build/typecheck && $(PYTHON) -m mypy --config-file ../../pyproject.toml --strict -p effectgate

test:
	$(PYTHON) -m pytest -q

# The long chaos run (the suite runs a short one): CHAOS_ORDERS, CHAOS_KILLS, CHAOS_SEED to vary it.
chaos:
	CHAOS_ORDERS=$${CHAOS_ORDERS:-200} CHAOS_KILLS=$${CHAOS_KILLS:-10} $(PYTHON) -m pytest -q -s -m chaos tests/e2e/test_chaos.py

# Benchmarks print figures and assert nothing. `bench-short` is the version CI runs to keep them working.
# `bench` measures every performance target side by side in one run (tests/bench/compare.py) and prints the
# ratios. PgQueuer comes from the bench extra; without it (no registry) that one figure says n/a.
bench:
	-$(PYTHON) -m pip install -q -e '.[bench]'
	$(PYTHON) -m tests.bench.compare
	$(PYTHON) -m tests.bench.reports

bench-short:
	-$(PYTHON) -m pip install -q -e '.[bench]'
	$(PYTHON) -m tests.bench.compare --short
	$(PYTHON) -m tests.bench.reports --effects 20000

up:
	$(PYTHON) -m pip install -q -e .
	effectgate up
