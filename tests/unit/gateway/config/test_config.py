"""Configuration: every mistake fails at start, naming the file, the key and what is wrong."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from effectgate.gateway.config import ConfigError, load, parse
from effectgate.gateway.config.gateway import PenaltySettings
from effectgate.gateway.config.handler_imports import app_dir, import_handlers
from effectgate.gateway.edge.client_slots import per_process
from effectgate.gateway.examples import EXAMPLE_TYPES
from effectgate.handlers.registry import REGISTRY
from effectgate.handlers.worker.config import DEFAULT_CONCURRENCY

ENV = {"S1": "whsec_one", "S2": "whsec_two"}
MINIMAL = """
[sources.stripe]
scheme = "stripe"
secrets = ["S1", "S2"]
"""


def test_minimal_configuration_has_documented_defaults() -> None:
    config = parse(MINIMAL, path="eg.toml", env=ENV)
    source = config.sources["stripe"]
    # Stripe retries a non-2xx for days and may disable the endpoint: a conflict is answered 200.
    assert (source.tenant, source.conflict_status, source.secret_envs) == ("default", 200, ("S1", "S2"))
    assert source.tenant_from is None
    assert config.gateway.max_body_bytes == 1024 * 1024
    assert (config.gateway.host, config.gateway.port) == ("127.0.0.1", 8000)
    assert config.worker.concurrency == DEFAULT_CONCURRENCY == 64
    assert config.worker.reconciler.tick == 15.0
    assert config.payments is None and config.handler_modules == ()


def test_secrets_are_read_from_the_environment_never_the_file() -> None:
    config = parse(MINIMAL, env=ENV)
    assert "whsec_one" not in repr(config.sources["stripe"].secret_envs)
    with pytest.raises(
        ConfigError, match=r"eg\.toml: sources\.stripe\.secrets: environment variable S2 is not set"
    ):
        parse(MINIMAL, path="eg.toml", env={"S1": "x"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[sources", r"eg\.toml: not valid TOML"),
        ("", r"eg\.toml: sources: at least one"),
        ('[sources.s]\nsecrets = ["S1"]', r"eg\.toml: sources\.s\.scheme: is required"),
        ('[sources.s]\nscheme = "stripe"', r"eg\.toml: sources\.s\.secrets: is required"),
        ('[sources.s]\nscheme = "stripe"\nsecrets = []', r"sources\.s\.secrets: must be a non-empty list"),
        ('[sources.s]\nscheme = "nope"\nsecrets = ["S1"]', r"sources\.s\.scheme: .*unknown scheme 'nope'"),
        (
            '[sources.s]\nscheme = "stripe"\nsecrets = ["S1"]\non_conflict = 500',
            r"sources\.s\.on_conflict: must be 409 or 200",
        ),
        (
            '[sources.s]\nscheme = "stripe"\nsecrets = ["S1"]\ntolerance = 0',
            r"sources\.s\.tolerance: must be >= 1",
        ),
        (
            '[sources.s]\nscheme = "stripe"\nsecrets = ["S1"]\nsecert = 1',
            r"sources\.s\.secert: is not a known setting",
        ),
        (
            '[sources.s]\nscheme = "stripe"\nsecrets = ["S1"]\ntenant = 5',
            r"sources\.s\.tenant: must be a string",
        ),
        ('[sources."a b"]\nscheme = "stripe"\nsecrets = ["S1"]', r"sources\.a b: source names may use"),
        (MINIMAL + "[gateway]\nport = 70000", r"gateway\.port: must be <= 65535"),
        (MINIMAL + "[gateway]\nport = true", r"gateway\.port: must be an integer, not a boolean"),
        (MINIMAL + "[gateway]\nmax_body_bytes = 0", r"gateway\.max_body_bytes: must be >= 1"),
        (MINIMAL + "[worker]\nconcurrency = 0", r"worker\.concurrency: must be >= 1"),
        (
            MINIMAL + "[worker]\nbackoff_base = 5\nbackoff_cap = 1",
            r"worker\.backoff_cap: must be >= backoff_base",
        ),
        (
            MINIMAL + "[handlers]\nmodules = [1]",
            r"handlers\.modules: must be a list of importable module names",
        ),
        (MINIMAL + "[downstream.payments]\nbase_url = 'ftp://x'", r"downstream\.payments\.base_url: .*http"),
        (MINIMAL + "[downstream.payments]\ntimeout = 1", r"downstream\.payments\.base_url: is required"),
        (MINIMAL + "[surprise]\nx = 1", r"eg\.toml: surprise: is not a known setting"),
    ],
)
def test_mistakes_name_the_file_and_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(text, path="eg.toml", env=ENV)


def test_a_missing_file_says_how_to_point_at_one(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"configuration file not found \(pass --config or set EFFECTGATE_CONFIG\)"
    ):
        load(tmp_path / "absent.toml")


def test_scheme_options_are_validated_at_start() -> None:
    text = '[sources.g]\nscheme = "github"\nsecrets = ["S1"]\noptions = { allow_sha2 = true }'
    with pytest.raises(ConfigError, match=r"sources\.g\.scheme: allow_sha2: unknown option"):
        parse(text, env=ENV)


def test_a_gateway_can_leave_the_reconciler_to_the_workers() -> None:
    assert parse(MINIMAL, env=ENV).gateway.run_reconciler is True
    assert parse(MINIMAL + "[gateway]\nrun_reconciler = false", env=ENV).gateway.run_reconciler is False
    with pytest.raises(ConfigError, match=r"gateway\.run_reconciler: must be a boolean"):
        parse(MINIMAL + '[gateway]\nrun_reconciler = "no"', env=ENV)


def test_maintenance_sections_configure_each_service() -> None:
    config = parse(
        MINIMAL
        + "[maintenance]\ntick = 5\n[maintenance.lease_rescuer]\nbatch = 50\npoison_threshold = 2\n"
        + "[maintenance.pending_waker]\npending_ttl = 60\n[maintenance.sweeps]\nenabled = false\n"
        + "[maintenance.partitions]\ninterval_hours = 0.5\npremake = 5\n",
        env=ENV,
    ).worker.reconciler
    assert config.tick == 5
    assert (config.rescuer_config().batch, config.rescuer_config().poison_threshold) == (50, 2)
    assert (config.waker_config().pending_ttl, config.waker_config().batch) == (60, 1000)
    assert config.sweeps.enabled is False
    assert (config.partitions.interval, config.partitions.premake) == (1800, 5)


def test_the_older_reconciler_section_still_works_and_cannot_be_mixed_with_maintenance() -> None:
    config = parse(MINIMAL + "[reconciler]\ntick = 3\npoison_threshold = 4\n", env=ENV).worker.reconciler
    assert (config.tick, config.rescuer_config().poison_threshold) == (3, 4)
    with pytest.raises(ConfigError, match=r"reconciler: is the older name of \[maintenance\]"):
        parse(MINIMAL + "[reconciler]\ntick = 3\n[maintenance]\ntick = 3\n", env=ENV)
    with pytest.raises(ConfigError, match=r"maintenance\.lease_rescuer\.batch: must be >= 1"):
        parse(MINIMAL + "[maintenance.lease_rescuer]\nbatch = 0\n", env=ENV)
    with pytest.raises(ConfigError, match=r"maintenance\.pending_waker\.typo: is not a known setting"):
        parse(MINIMAL + "[maintenance.pending_waker]\ntypo = 1\n", env=ENV)


SOURCE = "stripe"


def test_retention_windows_are_read_in_days_with_per_source_overrides() -> None:
    text = (
        MINIMAL
        + "[retention]\npayloads_days = 7\nhistory_days = 30\ntombstones_days = 10\nbatch = 500\n"
        + f'[retention.sources.{SOURCE}]\npayloads_days = 0.5\ntombstones_days = "forever"\n'
    )
    config = parse(text, env=ENV).worker.reconciler.retention_config()
    assert (config.payloads, config.history, config.tombstones, config.batch) == (
        7 * 86400,
        30 * 86400,
        10 * 86400,
        500,
    )
    assert config.source_payloads == {SOURCE: 43200}
    assert config.dedupe_window(SOURCE) is None
    # Without a [retention] section: the defaults, tombstones kept forever.
    default = parse(MINIMAL, env=ENV).worker.reconciler.retention_config()
    assert (default.payloads, default.history, default.tombstones) == (30 * 86400, 90 * 86400, None)


def test_a_dedupe_window_shorter_than_a_providers_retries_is_refused_naming_the_source() -> None:
    with pytest.raises(
        ConfigError, match=rf"retention\.tombstones_days: 1 days is shorter than source '{SOURCE}'"
    ):
        parse(MINIMAL + "[retention]\ntombstones_days = 1\n", env=ENV)
    with pytest.raises(
        ConfigError, match=rf"retention\.sources\.{SOURCE}\.tombstones_days: 2 days is shorter"
    ):
        parse(
            MINIMAL
            + f"[retention]\ntombstones_days = 40\n[retention.sources.{SOURCE}]\ntombstones_days = 2\n",
            env=ENV,
        )
    # At the provider's window it is accepted; an operator who knows the sender better may say so.
    assert parse(MINIMAL + "[retention]\ntombstones_days = 3\n", env=ENV)
    text = f"[retention]\ntombstones_days = 1\n[retention.sources.{SOURCE}]\nprovider_retry_hours = 24\n"
    assert parse(MINIMAL + text, env=ENV)


def test_retention_mistakes_name_the_key() -> None:
    for text, match in (
        ("[retention]\npayloads_days = 0\n", r"retention\.payloads_days: must be a number of days > 0"),
        ('[retention]\nhistory_days = "forever"\n', r"retention\.history_days: only tombstones_days"),
        ("[retention]\npayloads_days = 100\n", r"retention\.payloads_days: .*must not exceed history"),
        (
            "[retention.sources.nope]\npayloads_days = 1\n",
            r"retention\.sources\.nope: is not a configured source",
        ),
        ("[retention]\ntypo_days = 1\n", r"retention\.typo_days: is not a known setting"),
    ):
        with pytest.raises(ConfigError, match=match):
            parse(MINIMAL + text, env=ENV)


def test_the_conflict_answer_defaults_per_provider_and_on_conflict_overrides_it() -> None:
    env = {"S": "secret-value-for-github"}
    github = parse('[sources.gh]\nscheme = "github"\nsecrets = ["S"]', env=env).sources["gh"]
    assert github.conflict_status == 409  # GitHub never retries: the 409 costs nothing
    strict = parse(MINIMAL + "on_conflict = 409\n", env=ENV).sources["stripe"]
    assert strict.conflict_status == 409


def test_tenant_from_is_a_json_pointer_into_the_payload() -> None:
    source = parse(MINIMAL + 'tenant_from = "/account"\ntenants = ["acct_1"]\n', env=ENV).sources["stripe"]
    assert source.tenant_from is not None and source.tenant_from.tokens == ("account",)


def test_tenant_from_names_the_tenants_it_may_take() -> None:
    listed = parse(MINIMAL + 'tenant_from = "/account"\ntenants = ["acct_1", "acct_2"]\n', env=ENV)
    rule = listed.sources["stripe"].tenant_rule
    assert (rule.allows("acct_1"), rule.allows("default"), rule.allows("acct_1x")) == (True, False, False)
    pattern = parse(MINIMAL + 'tenant_from = "/account"\ntenant_pattern = "acct_[0-9]+"\n', env=ENV)
    rule = pattern.sources["stripe"].tenant_rule
    # The whole tenant must match: a pattern is not a prefix test.
    assert (rule.allows("acct_12"), rule.allows("acct_12 default"), rule.allows("default")) == (
        True,
        False,
        False,
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            'tenant_from = "account"',
            r"sources\.stripe\.tenant_from: JSON Pointer 'account' must start with '/'",
        ),
        ('tenant_from = "/a~2"', r"sources\.stripe\.tenant_from: .*'~' must be followed by 0 or 1"),
        ('tenant_from = ""', r"sources\.stripe\.tenant_from: must point inside the payload"),
        (
            'tenant_from = "/account"\ntenant = "acme"',
            r"sources\.stripe\.tenant_from: set tenant or tenant_from",
        ),
        ("tenant_from = 1", r"sources\.stripe\.tenant_from: must be a string"),
        # Without an allow-list a sender could name any tenant, "default" or another source's included.
        ('tenant_from = "/account"', r"sources\.stripe\.tenant_from: needs the tenants it may name"),
        ('tenant_from = "/account"\ntenants = []', r"sources\.stripe\.tenants: must be a non-empty list"),
        ('tenant_from = "/account"\ntenant_pattern = "("', r"sources\.stripe\.tenant_pattern: not a regular"),
        (
            'tenant_from = "/account"\ntenant_pattern = ".*"',
            r"sources\.stripe\.tenant_pattern: must not match",
        ),
        ('tenants = ["a"]', r"sources\.stripe\.tenants: only meaningful with tenant_from"),
    ],
)
def test_a_bad_tenant_from_names_the_key(line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(MINIMAL + line + "\n", path="eg.toml", env=ENV)


def test_the_connection_guard_metrics_token_and_dashboard_sessions_are_configured() -> None:
    defaults = parse(MINIMAL, env=ENV)
    assert (defaults.gateway.header_timeout, defaults.gateway.body_timeout) == (10.0, 30.0)
    assert defaults.gateway.max_header_bytes == 16384
    assert defaults.metrics_token_sha256 is None
    assert (defaults.dashboard.session_secret, defaults.dashboard.session_ttl) == (None, 8 * 3600)
    text = (
        MINIMAL
        + "[gateway]\nheader_timeout = 2.5\nbody_timeout = 4\nmax_header_bytes = 8192\n"
        + '[metrics]\ntoken_env = "M"\n'
        + '[dashboard]\nsession_secret_env = "D"\nsession_ttl = 600\n'
    )
    config = parse(text, env={**ENV, "M": "m" * 20, "D": "d" * 32})
    assert config.gateway.limits.header_timeout == 2.5 and config.gateway.limits.max_header_bytes == 8192
    assert config.metrics_token_sha256 is not None and b"m" * 20 not in config.metrics_token_sha256
    assert (config.dashboard.session_secret, config.dashboard.session_ttl) == (b"d" * 32, 600)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[gateway]\nheader_timeout = 0", r"gateway\.header_timeout: must be >= 0\.001"),
        ("[gateway]\nbody_timeout = -1", r"gateway\.body_timeout: must be >= 0\.001"),
        ("[gateway]\nmax_header_bytes = 100", r"gateway\.max_header_bytes: must be >= 1024"),
        ('[metrics]\ntoken_env = "ABSENT"', r"metrics\.token_env: environment variable ABSENT is not set"),
        ('[metrics]\ntoken_env = "SHORT"', r"metrics\.token_env: the secret in SHORT is shorter than 16"),
        ("[metrics]\ntoken = 'x'", r"metrics\.token: is not a known setting"),
        ('[dashboard]\nsession_secret_env = "ABSENT"', r"dashboard\.session_secret_env: environment"),
        ("[dashboard]\nsession_ttl = 5", r"dashboard\.session_ttl: must be >= 60"),
    ],
)
def test_guard_metrics_and_dashboard_mistakes_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(MINIMAL + text, path="eg.toml", env={**ENV, "SHORT": "short"})


def test_a_misspelt_key_is_reported_as_the_typo_with_a_suggestion_not_as_a_missing_key() -> None:
    text = '[sources.stripe]\nscheme = "stripe"\nsecret = ["S1"]'
    with pytest.raises(ConfigError) as caught:
        parse(text, path="eg.toml", env=ENV)
    assert caught.value.problems == (
        "eg.toml: sources.stripe.secret: is not a known setting; did you mean 'secrets'?",
    )


def test_every_mistake_is_reported_in_one_pass() -> None:
    text = """
[gateway]
port = "8000"
max_body_bytes = 0

[worker]
concurency = 4

[sources.stripe]
scheme = "stripe"
secrets = ["S1", "UNSET_ONE"]
on_conflict = 500

[sources.github]
scheme = "github"

[[operators]]
name = "alice"
scopes = ["view"]
"""
    with pytest.raises(ConfigError) as caught:
        parse(text, path="eg.toml", env=ENV)
    assert sorted(caught.value.problems) == sorted(
        [
            "eg.toml: gateway.port: must be an integer, not str '8000'",
            "eg.toml: gateway.max_body_bytes: must be >= 1, got 0",
            "eg.toml: worker.concurency: is not a known setting; did you mean 'concurrency'?",
            "eg.toml: sources.stripe.secrets: environment variable UNSET_ONE is not set (or empty), and "
            "neither UNSET_ONE_FILE nor $CREDENTIALS_DIRECTORY/UNSET_ONE names a file holding it",
            "eg.toml: sources.stripe.on_conflict: must be 409 or 200, got 500",
            "eg.toml: sources.github.secrets: is required",
            "eg.toml: operators[0].token_sha256: set exactly one of token_sha256 and token_env",
        ]
    )
    assert str(caught.value) == "\n".join(caught.value.problems)


def test_an_unknown_key_with_nothing_close_still_says_so() -> None:
    with pytest.raises(ConfigError) as caught:
        parse(MINIMAL + "[gateway]\nzzz = 1", path="eg.toml", env=ENV)
    assert caught.value.problems == ("eg.toml: gateway.zzz: is not a known setting (a typo?)",)


def test_the_idle_in_transaction_bound_is_configurable_and_checked() -> None:
    assert parse(MINIMAL, env=ENV).database.idle_bound == 30.0
    assert parse(MINIMAL + "[database]\nidle_in_transaction_timeout = 5", env=ENV).database.idle_bound == 5
    # 0 is no bound, as Postgres reads it: ledger.db takes None.
    assert parse(MINIMAL + "[database]\nidle_in_transaction_timeout = 0", env=ENV).database.idle_bound is None
    with pytest.raises(ConfigError, match=r"database\.idle_in_transaction_timeout: must be >= 0"):
        parse(MINIMAL + "[database]\nidle_in_transaction_timeout = -1", env=ENV)


def test_the_startup_wait_is_configurable_and_checked() -> None:
    assert parse(MINIMAL, env=ENV).database.startup_wait == 30.0
    assert parse(MINIMAL + "[database]\nstartup_wait = 0", env=ENV).database.startup_wait == 0
    with pytest.raises(ConfigError, match=r"database\.startup_wait: must be >= 0"):
        parse(MINIMAL + "[database]\nstartup_wait = -1", env=ENV)
    with pytest.raises(ConfigError, match=r"database\.startup_wat: is not a known setting; did you mean"):
        parse(MINIMAL + "[database]\nstartup_wat = 5", env=ENV)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's project directory, with the test run from another directory and the import state
    restored afterwards, and the process registry empty (other tests' handler modules registered into it)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    for attribute in ("_kinds", "_sweeps"):
        monkeypatch.setattr(REGISTRY, attribute, {})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    root = tmp_path / "project"
    root.mkdir()
    return root


def _project_config(root: Path, *modules: str) -> Path:
    config = root / "effectgate.toml"
    config.write_text(f"[handlers]\nmodules = {list(modules)!r}\n" + MINIMAL)
    return config


def test_a_handler_module_next_to_the_config_imports_from_any_directory(project: Path) -> None:
    name = f"eg_user_handlers_{uuid.uuid4().hex[:8]}"
    (project / f"{name}.py").write_text("LOADED = True\n")
    (project / "pkg").mkdir()
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / f"{name}.py").write_text("LOADED = True\n")
    config = load(_project_config(project, name, f"pkg.{name}"), env=ENV)
    import_handlers(config)
    assert sys.modules[name].LOADED and sys.modules[f"pkg.{name}"].LOADED
    assert sys.path[0] == str(project)
    assert app_dir(config) == project


def test_without_a_file_the_current_directory_is_the_app_dir(project: Path) -> None:
    name = f"eg_cwd_handlers_{uuid.uuid4().hex[:8]}"
    (Path.cwd() / f"{name}.py").write_text("LOADED = True\n")
    import_handlers(parse(f"[handlers]\nmodules = [{name!r}]\n" + MINIMAL, env=ENV))
    assert sys.modules[name].LOADED


def test_every_unimportable_handler_module_is_named_with_its_error_and_the_fix(project: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    (project / f"needs_dep_{tag}.py").write_text(f"import no_such_dependency_{tag}\n")
    (project / f"raises_{tag}.py").write_text("X = 1\nraise RuntimeError('bad handler config')\n")
    config = load(_project_config(project, f"absent_{tag}", f"needs_dep_{tag}", f"raises_{tag}"), env=ENV)
    with pytest.raises(ConfigError) as caught:
        import_handlers(config)
    absent, needs_dep, raises = caught.value.problems
    prefix = f"{config.path}: handlers.modules: cannot import"
    assert absent.startswith(f"{prefix} 'absent_{tag}': ModuleNotFoundError: No module named 'absent_{tag}'")
    assert f"looked for in {project} (the configuration file's directory)" in absent
    assert "PYTHONPATH" in absent
    assert needs_dep.startswith(f"{prefix} 'needs_dep_{tag}': ModuleNotFoundError")
    assert f"it imports 'no_such_dependency_{tag}', which is not installed" in needs_dep
    assert raises.startswith(f"{prefix} 'raises_{tag}': RuntimeError: bad handler config")
    assert f"raises_{tag}.py:2" in raises


def test_every_retention_mistake_is_reported_with_the_others_at_once() -> None:
    text = (
        '[sources.stripe]\nscheme = "stripe"\nsecrets = ["S"]\n'
        "[retention]\npayloads_days = -1\ntombstones_days = 1\n"
        "[retention.sources.nope]\npayloads_days = 1\n"
        "[gateway]\nprot = 8000\n"
    )
    with pytest.raises(ConfigError) as caught:
        parse(text, path="x.toml", env={"S": "whsec_x"})
    lines = str(caught.value).splitlines()
    assert "x.toml: gateway.prot: is not a known setting; did you mean 'port'?" in lines
    assert "x.toml: retention.payloads_days: must be a number of days > 0, got -1" in lines
    assert "x.toml: retention.sources.nope: is not a configured source (known: stripe)" in lines
    assert any(
        line.startswith("x.toml: retention.tombstones_days: 1 days is shorter than source 'stripe'")
        for line in lines
    )


def test_tenants_overlap_when_two_sources_can_file_under_one_tenant() -> None:
    from effectgate.gateway.config.handler_imports import tenants_overlap

    text = (
        MINIMAL.replace("[sources.stripe]", "[sources.a]")
        + '[sources.b]\nscheme = "stripe"\nsecrets = ["S1"]\n'
        + '[sources.c]\nscheme = "stripe"\nsecrets = ["S1"]\ntenant_from = "/account"\n'
        + 'tenant_pattern = "acct_[0-9]+"\n'
        + '[sources.d]\nscheme = "stripe"\nsecrets = ["S1"]\ntenant_from = "/account"\n'
        + 'tenants = ["default"]\n'
    )
    s = parse(text, env=ENV).sources
    assert tenants_overlap(s["a"], s["b"])  # both "default"
    assert not tenants_overlap(s["a"], s["c"])  # "default" is not an acct_ number
    assert tenants_overlap(s["a"], s["d"])  # d may name "default"
    assert not tenants_overlap(s["c"], s["d"])


def test_a_worker_without_webhook_secrets_still_knows_what_each_source_signs() -> None:
    from effectgate.gateway.config.handler_imports import identity_problems, unsigned_fields
    from effectgate.handlers.registry import Registry

    text = (
        '[sources.gh]\nscheme = "github"\nsecrets = ["GH"]\n'
        '[sources.partner]\nscheme = "hmac"\nsecrets = ["P"]\n'
        'options = { header = "X-Sig", type_header = "X-Type" }\n'
        '[sources.stripe]\nscheme = "stripe"\nsecrets = ["S1"]\n'
    )
    gateway = parse(text, env={"GH": "g", "P": "p", "S1": "whsec_x"}, role="gateway")
    worker = parse(text, env={}, role="worker")
    expected = {"gh": frozenset({"type"}), "partner": frozenset({"type"}), "stripe": frozenset()}
    assert unsigned_fields(gateway) == unsigned_fields(worker) == expected

    async def noop(ctx: object, ev: object) -> None:
        return None

    reg = Registry()
    reg.effect(source="gh", events=["*"], name="typed", key=lambda ev: ev.type)(noop)  # type: ignore[arg-type]
    assert identity_problems(gateway, reg) == identity_problems(worker, reg) != []


def test_the_penalty_box_is_configured_under_gateway() -> None:
    assert parse(MINIMAL, env=ENV).gateway.penalty_box == PenaltySettings()
    text = (
        MINIMAL + "[gateway.penalty_box]\nfailures = 5\nwindow = 2\ncooling = 30\nhold = 0\nmax_clients = 9\n"
    )
    assert parse(text, env=ENV).gateway.penalty_box == PenaltySettings(True, 5, 2.0, 30.0, 0, 9)
    assert not parse(
        MINIMAL + "[gateway.penalty_box]\nenabled = false\n", env=ENV
    ).gateway.penalty_box.enabled
    for bad, message in [
        ("failures = 0", r"gateway\.penalty_box\.failures: must be >= 1"),
        ("cooling = 0", r"gateway\.penalty_box\.cooling: must be >= 0\.001"),
        ("hold = -1", r"gateway\.penalty_box\.hold: must be >= 0"),
        ("enabled = 1", r"gateway\.penalty_box\.enabled: must be a boolean"),
        ("failurs = 5", r"gateway\.penalty_box\.failurs: is not a known setting; did you mean 'failures'"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse(MINIMAL + "[gateway.penalty_box]\n" + bad + "\n", env=ENV)


def test_client_concurrency_builds_each_process_its_slots_trusted_proxies_exempt() -> None:
    defaults = parse(MINIMAL, env=ENV).gateway
    slots = per_process(defaults)
    assert slots is not None and slots.per_client == 64 and slots.limits("127.0.0.1")
    assert per_process(defaults) is not slots
    assert per_process(parse(MINIMAL + "[gateway]\nclient_concurrency = 0\n", env=ENV).gateway) is None
    text = MINIMAL + '[gateway]\nclient_concurrency = 3\nforwarded_allow_ips = ["10.0.3.0/24"]\n'
    proxied = per_process(parse(text, env=ENV).gateway)
    assert proxied is not None and proxied.per_client == 3
    assert not proxied.limits("10.0.3.7") and proxied.limits("10.0.4.7")
    with pytest.raises(ConfigError, match=r"gateway\.client_concurrency: must be >= 0"):
        parse(MINIMAL + "[gateway]\nclient_concurrency = -1\n", env=ENV)


BAD_HANDLERS = """\
from effectgate import effect


@effect(source="strip", events=["payment_intent.succeeded"], name="typo_source")
async def typo_source(ctx, ev):
    return None


@effect(source="stripe", events=["payment_intent.succeeded"], name="plain_def")
def plain_def(ctx, ev):
    return None


@effect(
    source="stripe",
    events=["payment_intent.succeeded"],
    name="bad_arguments",
    lease_ttl=-1,
    orphan_policy="retry",
)
async def bad_arguments(ctx, ev):
    return None


@effect(source="stripe", events=["PaymentIntentSucceeded", "charge.*"], name="never_matches")
async def never_matches(ctx, ev):
    return None
"""


def test_every_handler_mistake_is_refused_at_once_at_the_users_line(
    project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"eg_bad_handlers_{uuid.uuid4().hex[:8]}"
    (project / f"{name}.py").write_text(BAD_HANDLERS)
    config = load(_project_config(project, name), env=ENV)
    with pytest.raises(ConfigError) as caught:
        import_handlers(config)
    at = f"{project / name}.py"
    assert list(caught.value.problems) == [
        f"{at}:9: effect 'plain_def': the handler must be a coroutine function (async def), not a plain def",
        f"{at}:14: effect 'bad_arguments': orphan_policy must be 'redrive' or 'park', got 'retry'",
        f"{at}:14: effect 'bad_arguments': lease_ttl must be a finite number of seconds > 0, got -1",
        f"{at}:4: effect 'typo_source': source 'strip' is not configured, so it would never run "
        "(configured sources: 'stripe'); did you mean 'stripe'? Configure [sources.strip], or list it in "
        "[handlers] skip_sources if this deployment does not take it.",
    ]
    # Once the mistakes are fixed, the pattern that can never match a Stripe type is a warning.
    REGISTRY.clear()
    (project / f"{name}_fixed.py").write_text(
        BAD_HANDLERS.replace('"strip"', '"stripe"')
        .replace("def plain_def", "async def plain_def")
        .replace("lease_ttl=-1", "lease_ttl=1")
        .replace('"retry"', '"park"')
        .replace("name=", "name='fixed.' + ")
    )
    with caplog.at_level("WARNING", logger="effectgate.config"):
        import_handlers(load(_project_config(project, f"{name}_fixed"), env=ENV))
    problems = [r.problem for r in caplog.records if r.getMessage() == "handlers.pattern_never_matches"]
    assert problems == [
        f"{project / name}_fixed.py:25: effect 'fixed.never_matches': event pattern "
        "'PaymentIntentSucceeded' can never match a stripe event of source 'stripe': stripe types are "
        "lower-case words joined by dots, such as " + ", ".join(repr(t) for t in EXAMPLE_TYPES["stripe"])
    ]


def test_a_source_listed_in_skip_sources_is_not_refused(project: Path) -> None:
    name = f"eg_skip_{uuid.uuid4().hex[:8]}"
    (project / f"{name}.py").write_text(
        "from effectgate import effect\n\n"
        "@effect(source='shopify', events=['orders/paid'], name='skip.shopify')\n"
        "async def ship(ctx, ev):\n    return None\n"
    )
    config = project / "effectgate.toml"
    config.write_text(f'[handlers]\nmodules = ["{name}"]\nskip_sources = ["shopify"]\n' + MINIMAL)
    import_handlers(load(config, env=ENV))
    assert REGISTRY.get("skip.shopify") is not None
    with pytest.raises(ConfigError, match=r"handlers\.skip_sources: must be a list of source names"):
        parse("[handlers]\nskip_sources = [1]\n" + MINIMAL, env=ENV)
