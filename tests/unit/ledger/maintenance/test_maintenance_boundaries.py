"""The maintenance loop is reached without the gateway importing the worker, or the worker the gateway."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_the_gateway_app_runs_maintenance_without_importing_the_worker() -> None:
    assert "effectgate.handlers.worker.runtime" not in imports(ROOT / "gateway" / "app.py")
    assert "effectgate.handlers.worker.maintenance" in imports(ROOT / "gateway" / "app.py")


def test_the_worker_and_the_maintenance_wiring_import_nothing_of_the_gateway() -> None:
    for name in ("runtime.py", "maintenance.py"):
        assert not {
            m for m in imports(ROOT / "handlers" / "worker" / name) if m.startswith("effectgate.gateway")
        }


def test_the_maintenance_services_import_nothing_outside_the_ledger() -> None:
    for name in ("service.py", "scheduler.py", "rescuer.py", "waker.py", "retention.py", "sweeps.py"):
        project = {m for m in imports(ROOT / "ledger" / "maintenance" / name) if m.startswith("effectgate")}
        assert project == set(), name
