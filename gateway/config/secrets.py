"""Where a secret named in ``effectgate.toml`` is read from, and which process reads which secrets.

The configuration names every secret by a variable name (``secrets = ["STRIPE_WEBHOOK_SECRET"]``,
``api_key_env = "PAYMENTS_API_KEY"``, ``token_env = …``). A secret ``NAME`` is read from, in order:

1. the environment variable ``NAME``;
2. the file the environment variable ``NAME_FILE`` names (Docker and Kubernetes secrets mounted as
   files, so the value never sits in the process environment, where ``/proc/PID/environ`` and child
   processes can read it);
3. the file ``$CREDENTIALS_DIRECTORY/NAME``, where systemd puts a unit's ``LoadCredential=NAME:…``.

Setting both ``NAME`` and ``NAME_FILE`` is a mistake, reported at start: a stale variable would
otherwise hide a rotated file. One trailing newline (as ``echo`` writes) is dropped from a file; a file
larger than ``MAX_SECRET_BYTES``, unreadable or not UTF-8 is reported naming the variable and the file.

**Roles.** Each process loads and validates only the secrets its role uses (``ROLE_SECRETS``), so a
missing secret of another role never stops it and the secret is never read into it:

- ``gateway`` (``serve``): webhook secrets, operator tokens and the dashboard's session secret, the
  metrics token;
- ``worker``: downstream API keys, the metrics token;
- ``all`` (``up``, and the tools): everything.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

from .reader import TableReader

MAX_SECRET_BYTES = 64 * 1024
CREDENTIALS_DIRECTORY = "CREDENTIALS_DIRECTORY"

Role = Literal["all", "gateway", "worker"]
Kind = Literal["webhook", "operator", "downstream", "metrics"]
ROLE_SECRETS: Mapping[Role, frozenset[Kind]] = {
    "all": frozenset({"webhook", "operator", "downstream", "metrics"}),
    "gateway": frozenset({"webhook", "operator", "metrics"}),
    "worker": frozenset({"downstream", "metrics"}),
}


def missing(name: str) -> str:
    """The message for a secret found nowhere, naming every place it was looked for."""
    return (
        f"environment variable {name} is not set (or empty), and neither {name}_FILE nor "
        f"$CREDENTIALS_DIRECTORY/{name} names a file holding it"
    )


class SecretEnv(Mapping[str, str]):
    """A read-only view of the environment in which ``get(NAME)`` also finds ``NAME_FILE`` and
    ``$CREDENTIALS_DIRECTORY/NAME``. A file that cannot be used is recorded in ``problems`` (each
    naming the variable and the file, never the content) and reads as absent."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[str] = []
        self._cache: dict[str, str | None] = {}

    def __getitem__(self, name: str) -> str:
        value = self._resolve(name)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.env)

    def __len__(self) -> int:
        return len(self.env)

    def _resolve(self, name: str) -> str | None:
        if name not in self._cache:
            self._cache[name] = self._read(name)
        return self._cache[name]

    def _read(self, name: str) -> str | None:
        value = self.env.get(name)
        pointer = self.env.get(f"{name}_FILE")
        if value and pointer:
            self.problems.append(f"secret {name}: both {name} and {name}_FILE are set; keep one")
            return None
        if value:
            return value
        if pointer:
            return self._file(name, Path(pointer), f"{name}_FILE={pointer}")
        directory = self.env.get(CREDENTIALS_DIRECTORY)
        if directory:
            path = Path(directory) / name
            if path.exists():
                return self._file(name, path, f"$CREDENTIALS_DIRECTORY/{name} ({path})")
        return None

    def _file(self, name: str, path: Path, where: str) -> str | None:
        try:
            return read_file(path)
        except ValueError as exc:
            self.problems.append(f"secret {name}: {where}: {exc}")
            return None


def read_file(path: Path) -> str:
    """A secret held in a file, without one trailing newline; ``ValueError`` says why it cannot be used
    (never quoting the content)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_SECRET_BYTES:
        raise ValueError(f"larger than {MAX_SECRET_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    return text


def env_or_file(reader: TableReader, env: Mapping[str, str] | None, key: str, what: str) -> str | None:
    """The secret a table names by ``{key}_env`` (a variable, or ``NAME_FILE``, or
    ``$CREDENTIALS_DIRECTORY/NAME``, as ``env`` resolves them) or by ``{key}_file`` (a path, relative to the
    configuration file), never in clear under ``key`` (``what`` names such values in that message). Each
    mistake is recorded on ``reader``, naming the key; with ``env`` None (a role without these credentials)
    the keys are checked and nothing is read."""
    name = reader.get(f"{key}_env", str)
    file_name = reader.get(f"{key}_file", str)
    if key in reader.table:
        reader.used.add(key)
        reader.problem(
            key, f"{what} are never read from the configuration in clear; use {key}_env or {key}_file"
        )
    if name and file_name:
        reader.problem(f"{key}_file", f"set {key}_env or {key}_file, not both")
        return None
    if env is None:
        return None
    if name:
        value = env.get(name)
        if not value:
            reader.problem(f"{key}_env", missing(name))
        return value or None
    if file_name:
        path = Path(file_name)
        if not path.is_absolute() and not reader.path.startswith("<"):
            path = Path(reader.path).parent / path
        try:
            return read_file(path)
        except ValueError as exc:
            reader.problem(f"{key}_file", f"{path}: {exc}")
    return None
