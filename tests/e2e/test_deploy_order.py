"""Production start-up as the deploy/ artefacts run it: migrations first, from their own one-shot
``effectgate migrate``, then ``serve --no-migrate``; and TLS terminated by a proxy the gateway trusts."""

from __future__ import annotations

from pathlib import Path

import httpx
import psycopg
import pytest

from effectgate.ledger.migrate import discover

from .processes import Process, free_port, run

TOKEN = "deploy-view-token-0123456789"
CONFIG = """
[gateway]
run_reconciler = false
{gateway}

[sources.stripe]
scheme = "stripe"
secrets = ["DEPLOY_STRIPE_SECRET"]

[[operators]]
name = "viewer"
token_env = "DEPLOY_VIEW_TOKEN"
scopes = ["view"]
"""
ENV = {"DEPLOY_STRIPE_SECRET": "whsec_deploy", "DEPLOY_VIEW_TOKEN": TOKEN}


def _config(tmp_path: Path, gateway: str = "") -> Path:
    path = tmp_path / "effectgate.toml"
    path.write_text(CONFIG.format(gateway=gateway))
    return path


def _serve(tmp_path: Path, db_url: str, config: Path, name: str, *args: str) -> tuple[Process, str]:
    port = free_port()
    process = Process(
        ["serve", "--config", str(config), "--no-migrate", "--port", str(port), *args],
        {**ENV, "DATABASE_URL": db_url},
        tmp_path / f"{name}.log",
    )
    url = f"http://127.0.0.1:{port}"
    process.wait_http(f"{url}/healthz")
    return process, url


def _has_migrations_table(db_url: str) -> bool:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT to_regclass('effectgate.schema_migrations') IS NOT NULL").fetchone()
    assert row is not None
    return bool(row[0])


def test_serve_no_migrate_on_an_unmigrated_ledger_waits_for_migrate_then_is_ready(
    empty_db_url: str, tmp_path: Path
) -> None:
    config = _config(tmp_path)
    every_migration = [m.name for m in discover()]
    port = free_port()
    early = Process(
        ["serve", "--config", str(config), "--no-migrate", "--port", str(port), "--migration-wait", "300"],
        {**ENV, "DATABASE_URL": empty_db_url},
        tmp_path / "early.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        # It waits for the schema, saying what it waits for, and serves nothing meanwhile: no delivery can
        # meet a ledger without its tables.
        early.wait_log('"schema.migrations_pending"')
        assert ", ".join(every_migration).replace(", ", '", "') in early.log()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/healthz", timeout=2)
        # --no-migrate means the process did not touch the schema, not even the bookkeeping table.
        assert not _has_migrations_table(empty_db_url)

        migrated = run("migrate", env={"DATABASE_URL": empty_db_url})
        assert migrated.returncode == 0, migrated.stderr
        assert migrated.stdout.strip() == "applied: " + ", ".join(every_migration)

        early.wait_http(f"{url}/readyz", timeout=60)
        answer = httpx.get(f"{url}/readyz", timeout=10)
        assert (answer.status_code, answer.json()) == (200, {"status": "ready"})
    finally:
        assert early.stop() == 0


@pytest.mark.parametrize(
    ("gateway", "args", "secure"),
    [
        pytest.param('forwarded_allow_ips = ["127.0.0.1"]', (), True, id="proxy-trusted-in-config"),
        pytest.param("", ("--forwarded-allow-ips", "127.0.0.0/8"), True, id="proxy-trusted-by-flag"),
        pytest.param("", (), False, id="nobody-trusted-by-default"),
        pytest.param("", ("--forwarded-allow-ips", "10.0.0.0/8"), False, id="client-not-in-trusted-list"),
        pytest.param(
            'forwarded_allow_ips = ["127.0.0.1"]',
            ("--forwarded-allow-ips", ""),
            False,
            id="flag-empties-config",
        ),
    ],
)
def test_the_dashboard_cookie_is_secure_only_when_a_trusted_proxy_says_https(
    db_url: str, tmp_path: Path, gateway: str, args: tuple[str, ...], secure: bool
) -> None:
    process, url = _serve(tmp_path, db_url, _config(tmp_path, gateway), "gateway", *args)
    try:
        answer = httpx.post(
            f"{url}/ui/login",
            content=f"token={TOKEN}&next=/ui/".encode(),
            headers={"content-type": "application/x-www-form-urlencoded", "x-forwarded-proto": "https"},
            timeout=10,
        )
        assert answer.status_code == 303, answer.text
        cookie = answer.headers["set-cookie"]
        assert "httponly" in cookie.lower()
        assert ("secure" in [part.strip().lower() for part in cookie.split(";")]) is secure
    finally:
        process.stop()
