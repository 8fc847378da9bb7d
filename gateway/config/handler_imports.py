"""Importing the handler modules a configuration names, and checking what they declare against it:
every failure at once, at the user's file and line, before a process takes any delivery.
"""

from __future__ import annotations

import importlib
import logging
import sys
import traceback
from pathlib import Path

from effectgate.handlers.downstream.forward import register_declared
from effectgate.handlers.downstream.names import check_downstream_names
from effectgate.handlers.plan import check_identity, check_key_spaces
from effectgate.handlers.registry import REGISTRY, Registry

from . import Config, event_catalogue, handler_checks
from .reader import ConfigError as ConfigError
from .sources import Source

log = logging.getLogger("effectgate.config")


def app_dir(config: Config) -> Path:
    """Where handler modules are looked for first: the configuration file's directory, or the
    current directory when the configuration did not come from a file."""
    path = Path(config.path)
    return path.resolve().parent if path.is_file() else Path.cwd()


def import_handlers(config: Config, *, warn: bool = True) -> None:
    """Import the configured handler modules, which register their effects on import.

    The configuration file's directory goes first on ``sys.path`` (as uvicorn's ``--app-dir`` does), so
    a handler module kept next to ``effectgate.toml`` imports without ``PYTHONPATH``, from any working
    directory and in every process of ``serve --workers N``. Every module that fails is reported at
    once, with the error and what to do about it, and so is every mistaken ``@effect`` declaration and
    every effect of an unconfigured source (``handler_checks``), each at the user's file and line. An
    event pattern that can never match its source's scheme, and an event type its provider's published
    catalogue does not list (``event_catalogue``), are logged as warnings (``warn``).
    """
    directory = str(app_dir(config))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    where = f"{directory} (the configuration file's directory)" if Path(config.path).is_file() else directory
    problems = []
    with REGISTRY.collecting() as mistakes:
        for module in config.handler_modules:
            try:
                importlib.import_module(module)
            except Exception as exc:
                problems.append(
                    f"{config.path}: handlers.modules: cannot import {module!r}: {_import_failure(module, exc, where)}"
                )
    for declared in config.effects:
        try:
            register_declared(REGISTRY, declared)
        except ValueError as exc:
            problems.append(f"{config.path}: effects.{declared.name}: {exc} (by a handler module)")
    schemes = {name: source.scheme_name for name, source in config.sources.items()}
    problems.extend(handler_checks.problems(REGISTRY, mistakes, schemes, config.handler_skip_sources))
    if not problems:
        problems = [f"{config.path}: {p}" for p in identity_problems(config, REGISTRY)]
        problems += check_downstream_names(REGISTRY, config.downstream_names, config.handler_skip_sources)
    if problems:
        raise ConfigError(*problems)
    if warn:
        for warning in handler_checks.warnings(REGISTRY, schemes):
            log.warning("handlers.pattern_never_matches", extra={"problem": warning})
        for found in event_catalogue.uncatalogued(REGISTRY, schemes):
            shape = handler_checks.TYPE_SHAPES.get(found.scheme)
            # A type of the wrong shape was warned about just above; once is enough.
            if shape is None or handler_checks.pattern_can_match(shape, found.event_type):
                log.warning("handlers.event_type_not_in_catalogue", extra=found.log_fields())


def unsigned_fields(config: Config) -> dict[str, frozenset[str]]:
    """Per configured source, the event fields its signature leaves unsigned (``type`` or none; an
    unsigned id was already replaced with the signed body's digest by the scheme)."""
    return {
        name: frozenset() if (source.covers or source.scheme.covers).type else frozenset({"type"})
        for name, source in config.sources.items()
    }


def identity_problems(config: Config, registry: Registry) -> list[str]:
    """Effects whose key, lock-key or require function reads a field their source does not sign, without
    ``trust_unsigned=True`` (``handlers.plan.check_identity``), and key functions of two sources that can
    reach one tenant with no ``key_space`` declared (``check_key_spaces``): refused at start-up, named."""

    def overlapping(a: str, b: str) -> bool:
        x, y = config.sources.get(a), config.sources.get(b)
        return x is not None and y is not None and tenants_overlap(x, y)

    return check_identity(registry, unsigned_fields(config)) + check_key_spaces(registry, overlapping)


def tenants_overlap(x: Source, y: Source) -> bool:
    """Whether two sources can file effects under one tenant: their static tenants or allow-lists meet, a
    pattern matches the other's listed tenant, or both take patterns (which may always meet)."""
    listed_x = frozenset({x.tenant}) if x.tenant_from is None else x.tenants
    listed_y = frozenset({y.tenant}) if y.tenant_from is None else y.tenants
    if listed_x is not None and listed_y is not None and listed_x & listed_y:
        return True
    if x.tenant_pattern is not None and y.tenant_pattern is not None:
        return True
    for pattern, listed in ((x.tenant_pattern, listed_y), (y.tenant_pattern, listed_x)):
        if pattern is not None and listed and any(pattern.fullmatch(t) for t in listed):
            return True
    return False


def _import_failure(module: str, exc: Exception, where: str) -> str:
    """What went wrong importing ``module``, and how to fix it."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing is not None and (module == missing or module.startswith(missing + ".")):
        return (
            f"{type(exc).__name__}: {exc}. It was looked for in {where} and on the Python path; put the module there (a dotted name is a "
            "package path: 'myapp.handlers' is myapp/handlers.py), install it into this "
            "environment, or add its parent directory to PYTHONPATH"
        )
    if missing is not None:
        return (
            f"{type(exc).__name__}: {exc}; the module was found, but it imports {missing!r}, which "
            "is not installed in this environment"
        )
    frames = traceback.extract_tb(exc.__traceback__)
    # The innermost frame outside the import machinery is the line of the user's module that failed.
    user = [f for f in frames if "importlib" not in f.filename]
    at = f" (at {user[-1].filename}:{user[-1].lineno})" if user else ""
    if isinstance(exc, SyntaxError):
        at = ""  # its message already names the file and line
    return f"{type(exc).__name__}: {exc}{at}; the module was found, but importing it raised this error"
