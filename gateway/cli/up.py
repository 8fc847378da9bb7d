"""``effectgate up``: gateway and worker (and, for the demo, the fake providers) as child processes of this
one, on the embedded Postgres unless a database URL is given; and ``effectgate fake-providers``.

Without a configuration file ``up`` writes and runs the demo's. The supervisor migrates once, starts the
children with ``--no-migrate``, and passes every stop signal on to them as SIGTERM; a second Ctrl-C makes
the worker hand its running jobs back at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from .. import embedded
from ..config import DEFAULT_CONFIG_FILE, Config, load
from ..config.handler_imports import import_handlers
from ..config.operator import DEFAULT_OPERATOR_HOST
from ..examples import demo
from ..exit_codes import EXIT_FAILURE, EXIT_OK
from . import database, flags, migrate
from .common import SUPERVISED_ENV, check_port_free


def _wait_ready(url: str, procs: Sequence[subprocess.Popen[bytes]], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            return False
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return True
        time.sleep(0.2)
    return False


def cmd_up(args: argparse.Namespace) -> int:
    home = embedded.home_dir()
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    config_path = args.config or os.environ.get("EFFECTGATE_CONFIG")
    use_demo = config_path is None and not Path(DEFAULT_CONFIG_FILE).exists()
    host = args.host or "127.0.0.1"
    fake_port = 0
    if use_demo:
        port = args.port or 8000
        fake_port = args.fake_port or port + 1
        config_path = str(home / "demo.toml")
        Path(config_path).write_text(demo.demo_config(host=host, port=port, fake_port=fake_port))
        for key, value in demo.DEMO_ENV.items():
            env.setdefault(key, value)
    else:
        config_path = config_path or DEFAULT_CONFIG_FILE
    config = load(config_path, env=env)  # fail here, once, rather than in each child
    import_handlers(config)
    port = config.gateway.port if args.port is None else args.port
    if not use_demo:
        host = args.host or config.gateway.host
    check_port_free("--port" if args.port is not None else "gateway.port", host, port)
    wait = flags.database_wait(args, "startup_wait", config)

    with database.ledger_url(args, embedded_by_default=True) as url:
        # Both names: a child must not prefer an EFFECTGATE_DATABASE_URL of the environment to this choice.
        env["DATABASE_URL"] = env["EFFECTGATE_DATABASE_URL"] = url
        applied = asyncio.run(migrate.apply(url, wait, database.schema(config)))
        if applied:
            print(f"effectgate: applied migrations {', '.join(applied)}", flush=True)
        return _run_up(env, config, config_path, use_demo, host, port, fake_port, home)


def _operator_base(config: Config, base: str) -> str:
    """The URL of the dashboard and API: the operator listener's when it is apart, else ``base``."""
    if not config.operator.apart:
        return base
    host = config.operator.listen_host or DEFAULT_OPERATOR_HOST
    return f"http://{f'[{host}]' if ':' in host else host}:{config.operator.listen_port}"


def _run_up(
    env: dict[str, str],
    config: Config,
    config_path: str,
    use_demo: bool,
    host: str,
    port: int,
    fake_port: int,
    home: Path,
) -> int:
    stopping = False
    procs: list[subprocess.Popen[bytes]] = []

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        if stopping:
            # A second Ctrl-C or SIGTERM: passed on, so the worker hands its running jobs back now.
            print(
                "effectgate: stopping now: the worker hands its running jobs back",
                file=sys.stderr,
                flush=True,
            )
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
        stopping = True

    # Before the children start: a SIGTERM from here on stops them too, rather than leaving them behind.
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    me = [sys.executable, "-m", "effectgate.gateway.cli"]
    commands = []
    if use_demo:
        commands.append([*me, "fake-providers", "--host", "127.0.0.1", "--port", str(fake_port)])
    commands.append(
        [*me, "serve", "--config", config_path, "--no-migrate", "--host", host, "--port", str(port)]
    )
    commands.append([*me, "worker", "--config", config_path, "--no-migrate"])
    procs.extend(subprocess.Popen(c, env={**env, SUPERVISED_ENV: "1"}) for c in commands)
    names = {id(p): c[3] for p, c in zip(procs, commands, strict=True)}

    base = f"http://{host}:{port}"
    chosen = database.chosen_url(database.command_line())
    ledger = chosen[0] if chosen else f"embedded in {home}"
    if _wait_ready(f"{base}/healthz", procs):
        print(
            f"\neffectgate is up: {base}  (gateway, worker{', fake providers' if use_demo else ''})",
            flush=True,
        )
        print(f"configuration: {config_path}; database: {ledger}")
        if use_demo:
            print("\nTry a signed Stripe delivery (the signature is valid for five minutes):\n")
            print("  " + demo.curl_command(base) + "\n")
            print(f"or, at any time:  effectgate demo-delivery --url {base} --order 1234")
            print("or any example:   effectgate send --source stripe --example payment_intent.succeeded\n")
            token = env["EFFECTGATE_DEMO_OPERATOR_TOKEN"]
            print(f"Dashboard: {_operator_base(config, base)}/ui/  (operator token: {token})", flush=True)
        elif config.operator.apart:
            print(f"operator plane (/ui, /api, /metrics): {_operator_base(config, base)}", flush=True)
    exit_code = EXIT_OK
    while not stopping:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            print(
                f"effectgate: a process exited ({names[id(dead[0])]}, code {dead[0].returncode}); stopping",
                file=sys.stderr,
            )
            exit_code = EXIT_FAILURE
            break
        time.sleep(0.2)
    if stopping:
        print(
            f"effectgate: stopping: the worker drains for up to {config.worker.drain_timeout:g} s "
            "(its log says what); Ctrl-C again to stop now",
            file=sys.stderr,
            flush=True,
        )
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + config.worker.drain_timeout + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return exit_code


def cmd_fake_providers(args: argparse.Namespace) -> int:
    from ..fakes.providers import serve

    serve(args.host, args.port)
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``up`` to the command line."""
    up = flags.with_startup_wait(
        flags.with_config(
            sub.add_parser("up", help="gateway + worker on the embedded Postgres (demo config if none)")
        )
    )
    up.add_argument("--host")
    up.add_argument("--port", type=flags.port)
    up.add_argument(
        "--fake-port", type=flags.port, help="port of the demo's fake providers (default: port + 1)"
    )
    up.set_defaults(func=cmd_up)


def register_fake_providers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fake-providers`` to the command line."""
    fake = sub.add_parser("fake-providers", help="fake payment and shipping APIs for tests and demos")
    fake.add_argument("--host", default="127.0.0.1")
    fake.add_argument("--port", type=flags.port, required=True)
    fake.set_defaults(func=cmd_fake_providers)
