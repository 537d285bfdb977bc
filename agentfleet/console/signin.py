"""Signing in and out, and the gate every other route is behind (an ASGI middleware: no route can forget it)."""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from agentfleet.console.auth import SESSION_USER, is_loopback
from agentfleet.console.forms import checked_form, text
from agentfleet.console.rendering import console_of, render, user_of

log = logging.getLogger(__name__)
OPEN_PATHS = frozenset({"/login", "/healthz"})
FAILED_SIGN_IN_DELAY_S = 0.5  # a wrong password costs the guesser this long


def _safe_next(raw: str) -> str:
    """Only a path on this console (never ``//host`` or a scheme): no open redirect."""
    return raw if raw.startswith("/") and not raw.startswith("//") and "\\" not in raw else "/runs"


def login_page(request: Request) -> Response:
    if user_of(request) is not None:
        return RedirectResponse(_safe_next(request.query_params.get("next", "/runs")), status_code=303)
    return render(request, "login.html", next=_safe_next(request.query_params.get("next", "/runs")), error=None)


async def login(request: Request) -> Response:
    form = await checked_form(request)
    name, password = text(form, "username", 255), text(form, "password", 1024)
    target = _safe_next(text(form, "next", 2000))
    if console_of(request).credentials.check(name, password):
        request.session.clear()  # a new session on sign-in: nothing from before it carries over
        request.session[SESSION_USER] = name
        log.info("console sign-in", extra={"user": name})
        return RedirectResponse(target, status_code=303)
    log.warning("console sign-in refused", extra={"user": name[:64]})
    await asyncio.sleep(FAILED_SIGN_IN_DELAY_S)
    return render(request, "login.html", 401, next=target, error="wrong name or password")


async def logout(request: Request) -> Response:
    await checked_form(request)
    request.session.clear()
    return RedirectResponse("/login", status_code=303)


def _loopback_host(scope: Scope) -> bool:
    host = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"host"), "")
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1:].split("]", 1)[0]
    return is_loopback(name)


class SignInRequired:
    """Every path but sign-in, health and static files needs a signed-in session when the console has
    credentials; a page asked for is sent to sign-in and back, anything else is answered 401."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        console = scope["app"].state.console
        if not console.credentials.required and not _loopback_host(scope):
            # No sign-in is safe only for this machine: a page of another site whose name was rebound to 127.0.0.1
            # (DNS rebinding) would otherwise read the console as its own origin.
            await PlainTextResponse("without sign-in the console answers loopback names only", 403)(
                scope, receive, send)
            return
        signed_in = isinstance(scope.get("session", {}).get(SESSION_USER), str)
        if path in OPEN_PATHS or path.startswith("/static/") or signed_in or not console.credentials.required:
            await self.app(scope, receive, send)
            return
        response: Response
        if scope["method"] == "GET" and not path.startswith("/events/"):
            query = scope.get("query_string", b"").decode("latin-1")
            response = RedirectResponse(f"/login?next={quote(path + ('?' + query if query else ''))}", 303)
        else:
            response = PlainTextResponse("sign in first", status_code=401)
        await response(scope, receive, send)
