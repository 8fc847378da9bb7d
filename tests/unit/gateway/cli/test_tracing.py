"""Tracing's configuration and its cost when off: ``[tracing]`` validated at start, the ``otel`` extra named
when it is missing, and nothing of OpenTelemetry imported unless tracing is configured."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from effectgate.gateway.config import ConfigError, parse
from effectgate.handlers import tracing

ROOT = Path(__file__).resolve().parents[4]
ENV = {"S1": "whsec_one"}
MINIMAL = '[sources.stripe]\nscheme = "stripe"\nsecrets = ["S1"]\n'
# Run first in a child interpreter: makes every `opentelemetry` import fail, as when the extra is absent.
BLOCK_OTEL = """
import importlib.abc, sys
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Absent())
"""


def python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_no_tracing_table_means_no_tracing() -> None:
    assert parse(MINIMAL, env=ENV).tracing is None


def test_the_tracing_table_with_its_defaults() -> None:
    config = parse(MINIMAL + '[tracing]\nendpoint = "http://collector:4318/v1/traces"\n', env=ENV).tracing
    assert config == tracing.TracingConfig("http://collector:4318/v1/traces", "effectgate", 1.0, 10.0)
    text = (
        MINIMAL + '[tracing]\nendpoint = "https://c/v1/traces"\nservice_name = "hooks"\nsample_ratio = 0.25\n'
    )
    assert parse(text, env=ENV).tracing == tracing.TracingConfig("https://c/v1/traces", "hooks", 0.25, 10.0)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('service_name = "x"', r"eg\.toml: tracing\.endpoint: is required"),
        ('endpoint = "collector:4318"', r"tracing\.endpoint: endpoint must be an http\(s\) URL"),
        ('endpoint = "http://c"\nsample_ratio = 1.5', r"tracing\.sample_ratio: must be <= 1"),
        ('endpoint = "http://c"\nsample_ratio = -0.1', r"tracing\.sample_ratio: must be >= 0"),
        ('endpoint = "http://c"\nservice_name = ""', r"tracing\.service_name: must not be empty"),
        ('endpoint = "http://c"\nprotocol = "grpc"', r"tracing\.protocol: is not a known setting"),
    ],
)
def test_tracing_mistakes_name_the_key(table: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(MINIMAL + "[tracing]\n" + table + "\n", path="eg.toml", env=ENV)


def test_tracing_off_imports_nothing_of_opentelemetry_and_spans_are_one_shared_no_op() -> None:
    result = python(
        """
        import sys
        from effectgate.gateway import app, cli, ingress
        from effectgate.handlers import context, downstream, tracing, worker
        with tracing.span("x", {"a": 1}) as s:
            s.set_attribute("b", 2)
        headers = {}
        tracing.inject(headers)
        assert tracing.span("y") is tracing.NO_SPAN and headers == {}
        print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_tracing_table_without_the_extra_is_a_configuration_error_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "eg.toml"
    config.write_text(MINIMAL + '[tracing]\nendpoint = "http://127.0.0.1:1/v1/traces"\n')
    result = python(
        BLOCK_OTEL
        + f"""
import sys
from effectgate.gateway.cli import main
sys.exit(main(["serve", "--config", {str(config)!r}]))
""",
        S1="whsec_one",
        DATABASE_URL="postgresql://nobody@127.0.0.1:1/x",
    )
    assert result.returncode == 2, result.stderr
    assert "tracing: the otel extra is not installed" in result.stderr
    assert "pip install 'effectgate[otel]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_without_the_extra_everything_else_still_runs() -> None:
    result = python(
        BLOCK_OTEL
        + """
from effectgate.gateway.config import parse
from effectgate.handlers import tracing
config = parse('[sources.s]\\nscheme = "stripe"\\nsecrets = ["S1"]\\n', env={"S1": "whsec_x"})
tracing.configure(config.tracing, role="gateway")
with tracing.span("x"):
    pass
print("ok", tracing.enabled())
"""
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok False"
