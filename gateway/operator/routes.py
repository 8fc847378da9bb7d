"""Every route of the operators' face, for ``create_app`` to mount."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from . import api, dashboard, metrics


async def root(request: Request) -> Response:
    """``/`` is the dashboard: a browser pointed at the gateway lands on its overview."""
    return RedirectResponse("/ui/", status_code=307)


def operator_routes() -> list[BaseRoute]:
    """``/``, ``/api/…``, ``/metrics`` and ``/ui/…``."""
    return [
        Route("/", root, methods=["GET"]),
        Mount("/api", routes=api.routes()),
        Route("/metrics", metrics.endpoint, methods=["GET"]),
        Mount("/ui", routes=dashboard.routes()),
    ]
