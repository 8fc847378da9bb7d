"""``[downstream.NAME]``: the APIs effects call, each with its key (never in the file in clear), timeouts,
idempotency header, and the pace of the workers' calls (``max_in_flight``, ``max_per_second``, ``pace_scope``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from effectgate.handlers.downstream import DEFAULT_IDEMPOTENCY_HEADER, PACE_SCOPES, DownstreamConfig

from .reader import ConfigError as ConfigError
from .reader import TableReader
from .secrets import env_or_file

_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _downstream(reader: TableReader, env: Mapping[str, str] | None) -> DownstreamConfig | None:
    """A ``[downstream.NAME]`` table; with ``env`` None (a role without downstream credentials) it is
    checked, and left out. The key comes from ``api_key_env`` (a variable, or ``NAME_FILE``, or
    ``$CREDENTIALS_DIRECTORY/NAME``) or ``api_key_file`` (a path, relative to the configuration file),
    never from the file in clear."""
    if not reader.table:
        return None
    base_url = reader.get("base_url", str, required=True)
    api_key = env_or_file(reader, env, "api_key", "keys")
    auth_scheme = reader.get("auth_scheme", str, "bearer")
    header = reader.get("idempotency_header", (str, bool), DEFAULT_IDEMPOTENCY_HEADER)
    idempotency_header: str | None = header if isinstance(header, str) else None
    if header is True or header == "":
        reader.problem("idempotency_header", "must be a header name, or false for an API that takes no key")
    timeout = reader.number("timeout", 10.0, minimum=0.001)
    connect_timeout = reader.number("connect_timeout", 5.0, minimum=0.001)
    max_in_flight = reader.number("max_in_flight", None, minimum=1, integer=True)
    max_per_second = reader.number("max_per_second", None, minimum=0.001)
    pace_scope = reader.get("pace_scope", str, "ledger")
    if isinstance(pace_scope, str) and pace_scope not in PACE_SCOPES:
        reader.problem("pace_scope", f"must be 'ledger' or 'process', got {pace_scope!r}")
    reader.no_unknown_keys()
    if reader.failed:
        return None
    try:
        config = DownstreamConfig(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            auth_scheme=auth_scheme,
            idempotency_header=idempotency_header,
            max_in_flight=max_in_flight,
            max_per_second=max_per_second,
            pace_scope=pace_scope,
        )
    except ValueError as exc:
        # DownstreamConfig's messages begin with the field they are about.
        key = str(exc).split(" ", 1)[0]
        if key == "api_key":
            key = "api_key_file" if "api_key_file" in reader.table else "api_key_env"
        reader.problem(key, str(exc))
        return None
    return config if env is not None else None


def read_downstreams(
    root: TableReader, env: Mapping[str, str] | None
) -> tuple[dict[str, DownstreamConfig], frozenset[str]]:
    """Every ``[downstream.NAME]``, any name: what ``ctx.downstream(NAME)`` reaches (none for a role
    without downstream credentials), and every name declared (in every role, to check handlers against)."""
    ds = root.table_of("downstream")
    configs = {}
    names = set()
    for name in ds.table:
        if not isinstance(ds.table[name], dict):
            ds.used.add(name)
            ds.problem(name, "must be a table ([downstream.NAME])")
            continue
        if not _NAME.fullmatch(name):
            ds.used.add(name)
            ds.problem(name, "downstream names may use letters, digits, '-' and '_' only")
            continue
        names.add(name)
        config = _downstream(ds.table_of(name), env)
        if config is not None:
            configs[name] = config
    return configs, frozenset(names)
