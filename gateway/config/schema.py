"""A JSON Schema (draft 2020-12) of ``effectgate.toml``, made from the settings declaration.

For editors: taplo and Even Better TOML complete keys, show each one's meaning and default, and mark
a misspelt key or a wrong type as the file is written (docs/configuration.md says how to point them at
it). The schema checks each key alone; the rules across keys (claim_lock_timeout below
claim_statement_timeout, tenant_from with tenants, a secret that is set) are ``effectgate config check``'s.
"""

from __future__ import annotations

from typing import Any

from .settings import REQUIRED, SETTINGS, TABLES, Setting

DRAFT = "https://json-schema.org/draft/2020-12/schema"
_NAME_PATTERN = "^[A-Za-z0-9_-]+$"


def value_schema(setting: Setting) -> dict[str, Any]:
    """The schema of one key's value."""
    kind = setting.kind
    out: dict[str, Any]
    if kind == "strings":
        out = {"type": "array", "items": {"type": "string"}}
    elif kind == "table":
        out = {"type": "object"}
    elif kind == "header":
        out = {"anyOf": [{"type": "string", "minLength": 1}, {"const": False}]}
    elif kind == "days":
        days: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0}
        out = {"anyOf": [days, {"const": "forever"}]} if setting.key == "tombstones_days" else days
    else:
        out = {"type": kind}
        if setting.minimum is not None:
            out["exclusiveMinimum" if setting.exclusive_minimum else "minimum"] = setting.minimum
        if setting.maximum is not None:
            out["maximum"] = setting.maximum
        if setting.choices is not None:
            out["enum"] = list(setting.choices)
    description = setting.doc
    if setting.secret:
        description += " (names a secret; never the secret itself)"
    if setting.default_text is not None:
        description += f". Default: {setting.default_text}"
    out["description"] = description
    if setting.default is not None and setting.default is not REQUIRED:
        out["default"] = setting.default
    return out


def _table(path: str) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
    if path in TABLES:
        node["description"] = TABLES[path]
    return node


def schema() -> dict[str, Any]:
    """The whole schema, a JSON-ready dict."""
    root: dict[str, Any] = {
        "$schema": DRAFT,
        "title": "effectgate.toml",
        "description": "effectgate's configuration (docs/configuration.md)",
        **_table(""),
        "required": ["sources"],
    }
    nodes: dict[str, dict[str, Any]] = {"": root}

    def node_of(path: str) -> dict[str, Any]:
        if path in nodes:
            return nodes[path]
        parent_path, _, name = path.rpartition(".")
        parent = node_of(parent_path)
        node = _table(path)
        if name == "*":
            parent["additionalProperties"] = node
            parent["propertyNames"] = {"pattern": _NAME_PATTERN}
            parent.pop("properties", None)
            if parent_path == "sources":
                parent["minProperties"] = 1
        elif name.endswith("[]"):
            parent["properties"][name[:-2]] = {"type": "array", "items": node, "description": TABLES[path]}
        else:
            parent["properties"][name] = node
        nodes[path] = node
        return node

    for setting in SETTINGS:
        table = node_of(setting.table)
        table["properties"][setting.key] = value_schema(setting)
        if setting.required:
            table.setdefault("required", []).append(setting.key)
    return root
