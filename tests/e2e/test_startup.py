"""Starting and stopping like a product: no private ledger by accident, no embedded Postgres left
behind, a database that comes up late, a port that is taken, handler modules next to the config."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .processes import free_port, wait_until
from .user_cli import SECRET, cli, wait_log

HANDLERS = """
import os
from pathlib import Path

from effectgate import EffectContext, Event, effect

# Each process that imports this module says so, so a test can count the processes that did.
marker = os.environ.get("STARTUP_IMPORT_MARKER")
if marker:
    with Path(marker).open("a") as f:
        f.write(f"{os.getpid()}\\n")


@effect(source="shop", events=["order.paid"], key=lambda ev: f"order:{ev.payload['id']}", name="startup.noop")
async def noop(ctx: EffectContext, ev: Event) -> None:
    return None
"""


def write_project(root: Path) -> Path:
    """A user's project: effectgate.toml and the handler module beside it, nothing installed."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "startup_effects.py").write_text(HANDLERS)
    config = root / "effectgate.toml"
    config.write_text(
        '[handlers]\nmodules = ["startup_effects"]\n\n'
        '[sources.shop]\nscheme = "stripe"\nsecrets = ["STARTUP_SECRET"]\n\n'
        "[worker]\npoll_interval = 0.5\n\n[reconciler]\ntick = 0.5\n"
    )
    return config


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "effectgate.gateway.cli", *args],
        cwd=cwd,
        env={**base, "STARTUP_SECRET": SECRET, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def wait_ready(proc: subprocess.Popen[bytes], log: Path, url: str, timeout: float = 90) -> None:
    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode}:\n{log.read_text()}")
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(ready, timeout, f"{url} to answer 200")


def postmaster_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "postmaster.pid").read_text().splitlines()[0])
    except FileNotFoundError:
        return None


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited postmaster nobody has reaped yet is gone for our purpose)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def postgres_processes_on(data_dir: Path) -> list[int]:
    """Every live process whose command line names ``data_dir``: the process table's view."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(data_dir) in cmdline and running(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """One EFFECTGATE_HOME for the module: the embedded cluster is initialised once, started and
    stopped by each test. Outside pytest's base directory: every pytest session on the machine resets
    that to mode 0700, which would lock the embedded server's own user out of its data directory."""
    path = Path(tempfile.mkdtemp(prefix="effectgate-startup-home-"))
    yield path
    # A failed test may have left the server running: stop it (fast shutdown) before its data goes.
    pid = postmaster_pid(path / "pgdata")
    if pid is not None and running(pid):
        os.kill(pid, signal.SIGINT)
        wait_until(lambda: not running(pid), 60, "the leftover embedded Postgres to stop")
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_project(tmp_path_factory.mktemp("project")).parent


# -- no silent private ledger ---------------------------------------------------------------------


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_serve_and_worker_without_database_url_refuse_and_say_what_to_set(
    command: str, project: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    result = run([command, "--config", str(project / "effectgate.toml")], tmp_path, EFFECTGATE_HOME=str(home))
    assert result.returncode == 2, result.stderr
    assert "effectgate: DATABASE_URL is not set: set it to the ledger's Postgres" in result.stderr
    assert "or pass --embedded for a single-machine trial" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (home / "pgdata").exists(), "no embedded Postgres may be started"


def test_a_missing_database_url_is_reported_with_the_configuration_mistakes(tmp_path: Path) -> None:
    config = tmp_path / "effectgate.toml"
    config.write_text('[sources.shop]\nscheme = "stripe"\nsecret = ["STARTUP_SECRET"]\n')
    result = run(["serve", "--config", str(config)], tmp_path, EFFECTGATE_HOME=str(tmp_path / "home"))
    assert result.returncode == 2
    typo, database = result.stderr.splitlines()
    assert (
        typo == f"effectgate: {config}: sources.shop.secret: is not a known setting; did you mean 'secrets'?"
    )
    assert database.startswith("effectgate: DATABASE_URL is not set")


def test_embedded_and_a_database_url_together_is_a_usage_error(project: Path, tmp_path: Path) -> None:
    result = run(
        ["worker", "--embedded", "--config", str(project / "effectgate.toml")],
        tmp_path,
        DATABASE_URL="postgresql://postgres@127.0.0.1:1/x",
        EFFECTGATE_HOME=str(tmp_path / "home"),
    )
    assert result.returncode == 2
    assert "--embedded: DATABASE_URL is set too" in result.stderr


# -- the embedded Postgres goes when its process goes ---------------------------------------------


def _start(command: str, home: Path, project: Path, tmp_path: Path) -> subprocess.Popen[bytes]:
    """Start ``command`` on the embedded Postgres in ``home`` and wait until it serves."""
    log = tmp_path / f"{command}.log"
    env = {"EFFECTGATE_HOME": str(home)}
    config = str(project / "effectgate.toml")
    if command == "serve":
        port = free_port()
        proc = cli(["serve", "--embedded", "--config", config, "--port", str(port)], log, tmp_path, **env)
        wait_ready(proc, log, f"http://127.0.0.1:{port}/readyz")
    elif command == "worker":
        proc = cli(["worker", "--embedded", "--config", config], log, tmp_path, **env)
        wait_log(proc, log, "worker.started")
    else:
        # The quick start: no configuration in the directory, so the demo runs (with fake providers).
        empty = tmp_path / "empty"
        empty.mkdir()
        port = free_port()
        proc = cli(["up", "--port", str(port), "--fake-port", str(free_port())], log, empty, **env)
        wait_log(proc, log, "effectgate is up")
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("command", ["serve", "worker", "up"])
def test_an_embedded_postgres_is_stopped_when_its_process_is_stopped(
    command: str, sig: signal.Signals, home: Path, project: Path, tmp_path: Path
) -> None:
    data_dir = home / "pgdata"
    proc = _start(command, home, project, tmp_path)
    try:
        pid = postmaster_pid(data_dir)
        assert pid is not None and running(pid), "the embedded Postgres runs while the process does"
        proc.send_signal(sig)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / f"{command}.log").read_text(errors="replace")
    assert code == 0, log
    assert postmaster_pid(data_dir) is None, "postmaster.pid is left behind"
    assert not running(pid)
    assert postgres_processes_on(data_dir) == []


def test_a_holder_that_was_killed_does_not_keep_the_embedded_postgres_running(
    home: Path, project: Path, tmp_path: Path
) -> None:
    data_dir = home / "pgdata"
    killed = _start("worker", home, project, tmp_path / "killed")
    killed.kill()  # SIGKILL: no chance to release; its pid stays in the holders' list
    killed.wait()
    pid = postmaster_pid(data_dir)
    assert pid is not None and running(pid), "a SIGKILLed process leaves the server running"

    survivor = _start("serve", home, project, tmp_path)
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(timeout=120) == 0
    assert postmaster_pid(data_dir) is None
    assert not running(pid)
    assert postgres_processes_on(data_dir) == []


@pytest.fixture(autouse=True)
def _subdirs(tmp_path: Path) -> None:
    (tmp_path / "killed").mkdir()


# -- a database that is not there yet -------------------------------------------------------------


class Proxy:
    """A loopback TCP port forwarding to the test Postgres: opened when the test says so, so a process
    can be started while nothing listens and then see its database appear."""

    def __init__(self, port: int, target_url: str) -> None:
        self.port = port
        params = conninfo_to_dict(target_url)
        host = str(params.get("host") or "127.0.0.1")
        target_port = int(params.get("port") or 5432)
        if host.startswith("/"):
            self.target: tuple[int, object] = (socket.AF_UNIX, f"{host}/.s.PGSQL.{target_port}")
        else:
            self.target = (socket.AF_INET, (host, target_port))
        self.listener: socket.socket | None = None
        self.sockets: list[socket.socket] = []

    def open(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.socket(self.target[0], socket.SOCK_STREAM)
            upstream.connect(self.target[1])
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
        for s in self.sockets:
            s.close()


@pytest.fixture
def proxy(empty_db_url: str) -> Iterator[Proxy]:
    p = Proxy(free_port(), empty_db_url)
    yield p
    p.close()


def test_a_process_started_before_its_database_waits_for_it_and_then_serves(
    proxy: Proxy, empty_db_url: str, project: Path, tmp_path: Path
) -> None:
    url = make_conninfo(empty_db_url, host="127.0.0.1", port=str(proxy.port))
    port = free_port()
    log = tmp_path / "serve.log"
    proc = cli(
        ["serve", "--config", str(project / "effectgate.toml"), "--port", str(port), "--startup-wait", "300"],
        log,
        tmp_path,
        DATABASE_URL=url,
    )
    try:
        # Two tries refused, each logged with where and why, and the process still waiting.
        wait_log(proc, log, '"attempt": 2')
        text = log.read_text()
        assert '"event": "database.unreachable"' in text
        assert f"port {proxy.port}" in text and "Connection refused" in text
        proxy.open()
        wait_ready(proc, log, f"http://127.0.0.1:{port}/readyz")
        assert '"event": "database.reachable"' in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_database_that_never_comes_is_exit_1_after_the_wait(project: Path, tmp_path: Path) -> None:
    port = free_port()
    result = run(
        ["worker", "--config", str(project / "effectgate.toml"), "--startup-wait", "1"],
        tmp_path,
        DATABASE_URL=f"postgresql://app:hunter2-secret@127.0.0.1:{port}/ledger",
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"effectgate: cannot connect to Postgres at host 127.0.0.1, port {port}, database 'ledger', "
        "user 'app': Connection refused"
    )
    assert "gave up after" in last and "startup_wait" in last
    assert result.stderr.count('"event": "database.unreachable"') >= 1
    assert "hunter2-secret" not in result.stderr and "Traceback" not in result.stderr


# -- a port already in use ------------------------------------------------------------------------


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_is_exit_1_saying_so(workers: str, db_url: str, project: Path, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run(
            [
                "serve",
                "--config",
                str(project / "effectgate.toml"),
                "--no-migrate",
                "--port",
                str(port),
                *("--workers", workers),
            ],
            tmp_path,
            DATABASE_URL=db_url,
        )
    assert result.returncode == 1, result.stderr
    assert (
        f"effectgate: --port: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(another process listens there: stop it, or choose another port)"
    ) in result.stderr
    assert "Traceback" not in result.stderr


# -- handler modules next to the configuration ----------------------------------------------------


def test_handler_modules_beside_the_config_import_in_every_serve_process_from_another_directory(
    db_url: str, tmp_path: Path
) -> None:
    project = write_project(tmp_path / "project").parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    marker = tmp_path / "imported-by"
    port = free_port()
    log = tmp_path / "serve.log"
    proc = cli(
        [
            "serve",
            "--config",
            str(project / "effectgate.toml"),
            "--no-migrate",
            "--port",
            str(port),
            *("--workers", "2"),
        ],
        log,
        elsewhere,
        DATABASE_URL=db_url,
        STARTUP_IMPORT_MARKER=str(marker),
    )
    try:
        wait_ready(proc, log, f"http://127.0.0.1:{port}/readyz")

        def three_importers() -> bool:
            return marker.exists() and len(set(marker.read_text().split())) >= 3

        # The parent (which checks the configuration) and both gateway processes imported it.
        wait_until(three_importers, 60, "the parent and both children to import the handler module")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert "cannot import" not in log.read_text()


# -- handler mistakes never reach a worker ---------------------------------------------------------

MISTAKEN_HANDLERS = """\
from effectgate import effect


@effect(source="strip", events=["payment_intent.succeeded"], name="mistaken.typo_source")
async def typo_source(ctx, ev):
    return None


@effect(source="shop", events=["payment_intent.succeeded"], name="mistaken.plain_def")
def plain_def(ctx, ev):
    return None


@effect(
    source="shop",
    events=["payment_intent.succeeded"],
    name="mistaken.arguments",
    max_attempts=0,
    key_space="everywhere",
)
async def arguments(ctx, ev):
    return None
"""


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_every_handler_mistake_is_refused_at_start_at_the_users_line(
    command: str, db_url: str, tmp_path: Path
) -> None:
    project = write_project(tmp_path / "project").parent
    (project / "startup_effects.py").write_text(MISTAKEN_HANDLERS)
    result = run([command, "--config", "effectgate.toml", "--no-migrate"], project, DATABASE_URL=db_url)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines == [
        "effectgate: startup_effects.py:9: effect 'mistaken.plain_def': the handler must be a coroutine "
        "function (async def), not a plain def",
        "effectgate: startup_effects.py:14: effect 'mistaken.arguments': key_space must be 'source' or "
        "'shared', got 'everywhere'",
        "effectgate: startup_effects.py:14: effect 'mistaken.arguments': max_attempts must be an integer "
        ">= 1, got 0",
        "effectgate: startup_effects.py:4: effect 'mistaken.typo_source': source 'strip' is not configured, "
        "so it would never run (configured sources: 'shop'). Configure "
        "[sources.strip], or list it in [handlers] skip_sources if this deployment does not take it.",
    ]
