"""Who is at the dashboard: sign-in and sign-out, the session cookie, and ``view``, the wrapper every page runs in.

A browser cannot send a bearer header by itself, so ``/ui/login`` takes the operator token once and
keeps it in an ``HttpOnly``, ``SameSite=Strict`` cookie scoped to ``/ui``; each request checks it like
the API checks its header. Forms that act (redrive, cancel, resolve) also carry a token derived from the
operator's token hash, which a page of another site can neither read nor compute.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from effectgate.ledger import db
from effectgate.ledger.errors import LedgerError, LedgerUnavailable

from ...bodies import MAX_OPERATOR_BODY_BYTES, BodyTooLarge, read_body
from ...config.operator import OperatorToken
from .. import sessions
from ..auth import authenticate
from ..params import PARAMETER_ERRORS
from ..sessions import COOKIE, SignedIn
from ..throttle import FailureThrottle, client_key, retry_after
from .rendering import message, render

log = logging.getLogger("effectgate.operator")
MAX_FORM_BYTES = MAX_OPERATOR_BODY_BYTES


def signed_in_operator(request: Request, scope: str) -> SignedIn | None:
    """The operator whose session cookie this request carries, or None."""
    return sessions.read(
        request.app.state.session_key, request.cookies.get(COOKIE), request.app.state.config.operators
    )


def _throttle(request: Request) -> FailureThrottle:
    throttle: FailureThrottle = request.app.state.auth_throttle
    return throttle


def _safe_next(value: str | None) -> str:
    # Only a path of this dashboard: a login link must not send the operator elsewhere.
    if value and value.startswith("/ui/") and not value.startswith("/ui//") and "\\" not in value:
        return value
    return "/ui/"


async def read_form(request: Request) -> dict[str, str]:
    """The posted form, one value a field."""
    # Bounded before it is read: past the limit, BodyTooLarge becomes form_too_large's 413 page.
    body = await read_body(request, MAX_FORM_BYTES)
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


def form_too_large(exc: BodyTooLarge) -> Response:
    """The dashboard's answer to a form over the limit: a 413 page, read no further."""
    return message(
        "Form too large", f"The form is over {exc.limit} bytes (payload_too_large).", None, status=413
    )


View = Callable[[Request, db.Conn, OperatorToken, dict[str, str]], Awaitable[Response]]


def view(scope: str = "view") -> Callable[[View], Callable[[Request], Awaitable[Response]]]:
    """Wrap a page: require a signed-in operator with ``scope``, open a connection, render errors."""

    def wrap(fn: View) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            operator = signed_in_operator(request, "view")
            if operator is None:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"/ui/login?{urlencode({'next': target})}", status_code=303)
            if not operator.allows(scope):
                return message(
                    "Not allowed", f"operator {operator.name} lacks the {scope} scope", operator, status=403
                )
            query = {k: v for k, v in request.query_params.items() if v != ""}
            try:
                async with db.connection(request.app.state.pool) as conn:
                    return await fn(request, conn, operator, query)
            except PARAMETER_ERRORS as exc:
                return message(
                    "Bad filter", f"{exc.parameter}: {exc.detail} ({exc.code})", operator, status=400
                )
            except LedgerUnavailable:
                return message(
                    "Ledger unavailable", "The ledger database cannot be reached.", operator, status=503
                )
            except LedgerError:
                return message(
                    "Ledger error", "The ledger could not answer; see the gateway log.", operator, status=500
                )

        return run

    return wrap


async def login_form(request: Request) -> Response:
    """The sign-in form."""
    return _login_page(_safe_next(request.query_params.get("next")), "")


def _login_page(target: str, problem: str, status: int = 200) -> HTMLResponse:
    return render("login.html", "Sign in", None, status=status, target=target, problem=problem)


async def login(request: Request) -> Response:
    """Check the token; on success start a session. Wrong tokens are throttled per client (``throttle``),
    and the right one is let in whatever the throttle says, so no one can lock an operator out."""
    form = await read_form(request)
    target = _safe_next(form.get("next"))
    client = client_key(request)
    token = form.get("token", "").strip()
    who = authenticate(f"Bearer {token}", request.app.state.config.operators, "view")
    if not isinstance(who, OperatorToken):
        wait = _throttle(request).failed(client)
        if wait > 0:
            response = _login_page(target, "Too many wrong tokens from this address; try again later.", 429)
            response.headers["Retry-After"] = retry_after(wait)
            return response
        log.info("dashboard.sign_in_failed", extra={"client": client})
        return _login_page(target, "That token is not a configured operator token.", 401)
    ttl = request.app.state.config.dashboard.session_ttl
    signed_in = RedirectResponse(target, status_code=303)
    signed_in.set_cookie(
        COOKIE,
        sessions.issue(request.app.state.session_key, who, ttl),
        max_age=int(ttl),
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=secure_cookie(request),
    )
    log.info("dashboard.signed_in", extra={"operator": who.name, "client": client})
    return signed_in


def secure_cookie(request: Request) -> bool:
    """Whether the session cookie is ``Secure``: as ``[operator] secure_cookies`` says, else when the
    request came over https (directly, or as a trusted proxy's ``X-Forwarded-Proto`` says)."""
    configured: bool | None = request.app.state.config.operator.secure_cookies
    return request.url.scheme == "https" if configured is None else configured


async def logout(request: Request) -> Response:
    """Sign out: a POST carrying the session's form token, so another site cannot sign anyone out."""
    operator = signed_in_operator(request, "view")
    form = await read_form(request)
    if operator is not None and not hmac.compare_digest(form.get("csrf", ""), operator.csrf):
        return message("Not allowed", "The form was not sent from this dashboard.", operator, status=403)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/ui")
    return response
