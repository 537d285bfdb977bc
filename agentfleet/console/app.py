"""The console's web app: routes, the sign-in gate and sessions, static files, the public feed's lifetime."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from agentfleet.config.settings import Settings
from agentfleet.console import actions, pages, signin, streams
from agentfleet.console.auth import Credentials
from agentfleet.console.limits import BodyLimit
from agentfleet.console.live import FleetWatch, PublicFeed
from agentfleet.console.rendering import HERE, NO_STORE, Console
from agentfleet.roles.runtime import Runtime

SESSION_COOKIE = "agentfleet_console"
SESSION_MAX_AGE_S = 12 * 3600


def _refused(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return PlainTextResponse(str(detail), status_code=status, headers=NO_STORE)


def create_console(settings: Settings, rt: Runtime, *, feed: PublicFeed | None = None) -> Starlette:
    """The console for ``rt``'s fleet. Its credentials and session key come from ``settings``."""
    credentials = Credentials.parse(settings.console_credentials.get_secret_value()
                                    if settings.console_credentials else None)
    key = settings.console_secret.get_secret_value() if settings.console_secret else secrets.token_urlsafe(32)
    console = Console(rt=rt, feed=feed or PublicFeed(rt), fleet=FleetWatch(rt), credentials=credentials)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        console.feed.start()
        console.fleet.start()
        try:
            yield
        finally:
            console.feed.stop()
            console.fleet.stop()

    routes = [
        Route("/", pages.home),
        Route("/healthz", pages.healthz),
        Route("/login", signin.login_page, methods=["GET"]),
        Route("/login", signin.login, methods=["POST"]),
        Route("/logout", signin.logout, methods=["POST"]),
        Route("/runs", pages.runs),
        Route("/runs/table", pages.runs_table),
        Route("/runs/{run_id:str}", pages.run),
        Route("/runs/{run_id:str}/body", pages.run_body),
        Route("/runs/{run_id:str}/cancel", actions.cancel, methods=["POST"]),
        Route("/approvals", pages.approvals),
        Route("/approvals/list", pages.approvals_list),
        Route("/approvals/{run_id:str}/{call_id:str}", actions.answer_approval, methods=["POST"]),
        Route("/dlq", pages.dlq),
        Route("/dlq/{letter_id:str}", pages.dlq_letter),
        Route("/dlq/{letter_id:str}/replay", actions.replay, methods=["POST"]),
        Route("/fleet", pages.fleet),
        Route("/fleet/scale", actions.scale, methods=["POST"]),
        Route("/activity", pages.activity),
        Route("/events/runs", streams.runs_events),
        Route("/events/runs/{run_id:str}", streams.run_events),
        Route("/events/approvals", streams.approvals_events),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [
        Middleware(BodyLimit),  # outermost: nothing reads a body before its size is known to be bounded
        Middleware(SessionMiddleware, secret_key=key, session_cookie=SESSION_COOKIE, max_age=SESSION_MAX_AGE_S,
                   same_site="strict", https_only=False),
        Middleware(signin.SignInRequired),
    ]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={HTTPException: _refused, 404: pages.missing})
    app.state.console = console
    return app
