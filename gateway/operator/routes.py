"""Every route of the operators' face, for ``create_app`` to mount."""

from __future__ import annotations

from starlette.routing import BaseRoute, Mount, Route

from . import api, dashboard, metrics


def operator_routes() -> list[BaseRoute]:
    """``/api/…``, ``/metrics`` and ``/ui/…``."""
    return [
        Mount("/api", routes=api.routes()),
        Route("/metrics", metrics.endpoint, methods=["GET"]),
        Mount("/ui", routes=dashboard.routes()),
    ]
