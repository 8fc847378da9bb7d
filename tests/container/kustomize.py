"""The Kubernetes package rendered the way a GitOps tool renders it: ``kubectl kustomize`` (kustomize v5
built into kubectl) or a ``kustomize`` binary, whichever is on PATH. Tests and ``make deploy-run`` read
the rendered objects, so they check what ships, not the sources before kustomize changes them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
CI_OVERLAY = KUBERNETES / "overlays" / "ci"
PRODUCTION_OVERLAY = KUBERNETES / "overlays" / "production"


class RenderError(RuntimeError):
    pass


def command() -> list[str]:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    raise RenderError("neither kustomize nor kubectl is on PATH: install one to render deploy/kubernetes")


def render_text(directory: Path) -> str:
    done = subprocess.run([*command(), str(directory)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RenderError(f"rendering {directory} failed: {done.stderr.strip()}")
    return done.stdout


def render(directory: Path = CI_OVERLAY) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(render_text(directory)) if doc]


def logical_name(doc: dict[str, Any]) -> str:
    """The name without what kustomize or the release adds: the ConfigMap's content hash and the
    migrate Job's version suffix (``effectgate-config-5fk8m2`` -> ``effectgate-config``)."""
    name: str = doc["metadata"]["name"]
    if doc["kind"] == "ConfigMap":
        return name.rsplit("-", 1)[0]
    if doc["kind"] == "Job":
        return re.sub(r"-v\d+-\d+-\d+$", "", name)
    return name


def by_name(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(doc["kind"], logical_name(doc)): doc for doc in docs}
