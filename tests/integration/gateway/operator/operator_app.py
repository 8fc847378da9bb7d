"""The operator surfaces of the real app over a ledger: two operators' tokens and the configuration naming them, the
API as a client (``gateway``) with a check of each answer against the OpenAPI document, and the dashboard as a
signed-in client (``dashboard``)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from jsonschema import Draft202012Validator
from referencing import Registry as SchemaRegistry
from referencing import Resource
from referencing.jsonschema import DRAFT202012

from effectgate.gateway.app import create_app
from effectgate.gateway.config import parse
from effectgate.gateway.operator.auth import hash_token
from effectgate.gateway.operator.openapi import DOCUMENT
from effectgate.handlers.registry import Registry

VIEW_TOKEN = "view-token-0123456789abcdef"
OPERATE_TOKEN = "operate-token-0123456789abcdef"
# The seeded ledger lies in 2025: a reconciler on the real clock would repair it under the tests.
CONFIG = f"""
[gateway]
run_reconciler = false

[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]

[[operators]]
name = "viewer"
token_env = "VIEW_TOKEN"
scopes = ["view"]

[[operators]]
name = "admin"
token_sha256 = "{hash_token(OPERATE_TOKEN)}"
scopes = ["operate"]
"""
VIEW = {"Authorization": f"Bearer {VIEW_TOKEN}"}
OPERATE = {"Authorization": f"Bearer {OPERATE_TOKEN}"}

_URN = "urn:effectgate:openapi"
_SCHEMAS = SchemaRegistry().with_resource(
    _URN, Resource.from_contents(DOCUMENT, default_specification=DRAFT202012)
)


def check(response: httpx.Response, template: str, method: str = "get") -> Any:
    """Validate an answer against the schema the document gives for its path, method and status."""
    status = str(response.status_code)
    responses = DOCUMENT["paths"][template][method]["responses"]
    assert status in responses, f"{method.upper()} {template} answered {status}, which is not documented"
    pointer = "/paths/{}/{}/responses/{}/content/application~1json/schema".format(
        template.replace("~", "~0").replace("/", "~1"), method, status
    )
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    Draft202012Validator(
        {"$ref": f"{_URN}#{pointer}"}, registry=_SCHEMAS, format_checker=Draft202012Validator.FORMAT_CHECKER
    ).validate(body)
    return body


@asynccontextmanager
async def gateway(url: str, *, keep_open: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    config = parse(CONFIG, env={"STRIPE_SECRET": "whsec_test", "VIEW_TOKEN": VIEW_TOKEN})
    app = create_app(config, Registry(), url)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        if keep_open:
            async with app.router.lifespan_context(app):
                yield client
        else:
            # The lifespan has run and closed the pool: every ledger read now fails as unavailable.
            async with app.router.lifespan_context(app):
                pass
            yield client


@asynccontextmanager
async def dashboard(url: str, token: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        parse(CONFIG, env={"STRIPE_SECRET": "whsec_test", "VIEW_TOKEN": VIEW_TOKEN}), Registry(), url
    )
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client,
        app.router.lifespan_context(app),
    ):
        if token is not None:
            response = await client.post("/ui/login", data={"token": token, "next": "/ui/"})
            assert response.status_code == 303
        yield client


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
