"""Two planes on two listeners: the public edge and the operator plane, told apart by the local port.

With ``[operator] listen`` set (or ``serve --operator-port``), each gateway process listens on two
sockets and serves one app on both; this middleware, outermost, decides what each socket may reach:

- the **public** listener (the one the internet's proxy forwards to): ``/webhooks/*``, ``/healthz`` and
  ``/readyz``; anything else is ``404 not_found``, so the dashboard, the bearer API and the metrics
  are not reachable from there at all, whatever a proxy forwards;
- the **operator** listener: ``/ui``, ``/api``, ``/metrics``, ``/`` and the two probes; a webhook sent
  there is ``404`` too, so a provider pointed at the wrong port hears it at once.

One app for both (rather than two apps) keeps one pool, one claim batcher and one reconciler tick per
process; the ``serve --workers N`` children are handed both sockets by the supervisor, so every
process serves both planes. The local port is the socket's own (``scope["server"]``), which no client
header can change.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from .ingress import error

PUBLIC_PREFIXES = ("/webhooks/",)
PROBES = ("/healthz", "/readyz")


def public_path(path: str) -> bool:
    """Whether the public listener serves ``path``."""
    return path in PROBES or path.startswith(PUBLIC_PREFIXES)


class PlaneGate:
    """ASGI middleware: each listener answers only its plane's paths; others are 404."""

    def __init__(self, app: ASGIApp, operator_port: int | None) -> None:
        self.app = app
        self.operator_port = operator_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.operator_port is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        server = scope.get("server")
        on_operator = server is not None and server[1] == self.operator_port
        path: str = scope["path"]
        if on_operator:
            allowed = not path.startswith(PUBLIC_PREFIXES) and path != "/webhooks"
            plane = "the operator listener serves /ui, /api, /metrics and the probes, not webhooks"
        else:
            allowed = public_path(path)
            plane = "this listener serves /webhooks/*, /healthz and /readyz only"
        if allowed:
            await self.app(scope, receive, send)
            return
        await error(404, "not_found", plane)(scope, receive, send)
