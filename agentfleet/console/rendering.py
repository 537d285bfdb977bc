"""Pages from templates, masked on the way out, and what every page knows: who is signed in, the CSRF token.

Everything a page shows comes from ``ops/`` and is masked there (``redact``) as the public exchange is; the
finished HTML is masked once more as text, so a secret that reached a template some other way (a message, a
name) still does not leave.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse

from agentfleet.console.auth import SESSION_USER, Credentials, csrf_token, local_user
from agentfleet.console.live import FleetWatch, PublicFeed
from agentfleet.redaction import active, redact
from agentfleet.roles.runtime import Runtime

HERE = Path(__file__).parent
NO_STORE = {"Cache-Control": "no-store", "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin",
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                                       "script-src 'self'; frame-ancestors 'none'; form-action 'self'"}


@dataclass
class Console:
    """What the console's handlers share: the fleet's runtime, the public feed, the look at the fleet, who may sign
    in."""

    rt: Runtime
    feed: PublicFeed
    fleet: FleetWatch
    credentials: Credentials


def console_of(request: Request) -> Console:
    return request.app.state.console  # type: ignore[no-any-return]


def user_of(request: Request) -> str | None:
    """Who is signed in (None: nobody yet); without credentials, the local user."""
    if not console_of(request).credentials.required:
        return local_user()
    user = request.session.get(SESSION_USER)
    return user if isinstance(user, str) else None


def _ago(value: Any) -> str:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    if not isinstance(value, datetime):
        return "-"
    seconds = (datetime.now(UTC) - value).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{max(seconds, 0):.0f}s ago"


def _ago_ts(value: Any) -> str:
    return _ago(datetime.fromtimestamp(value, UTC)) if isinstance(value, int | float) else "-"


def _cost(cost: Any, unpriced: Any = False) -> str:
    value = float(cost or 0.0)
    if unpriced:
        return f"${value:.4f}+?" if value else "unpriced"
    return f"${value:.4f}"


def _ms(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f} ms"


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False, separators=(", ", ": "))


templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]),
                        trim_blocks=True, lstrip_blocks=True)
templates.filters.update(ago=_ago, ago_ts=_ago_ts, cost=_cost, ms=_ms, tojson_text=_json)


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """A template filled with masked data, the page masked again as text, with headers no page goes without."""
    page = templates.get_template(name).render(
        **{k: v if isinstance(v, Markup) else redact(v) for k, v in context.items()},  # charts: numbers only
        user=user_of(request), csrf_token=csrf_token(request.session), path=request.url.path,
        signing_in=console_of(request).credentials.required)
    return HTMLResponse(active().text(page), status_code=status_code, headers=NO_STORE)
