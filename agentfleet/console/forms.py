"""A POST's form, taken only from the console's own pages: signed in, same origin, the session's CSRF token."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request

from agentfleet.console.auth import CSRF_FIELD, csrf_ok

MAX_FORM_FIELDS = 50
MAX_FIELD_BYTES = 64 * 1024


async def checked_form(request: Request) -> FormData:
    """The form, or 403: a POST from another origin, or without the token this session's pages carry."""
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host"):
        raise HTTPException(403, "a form from another site")
    form = await request.form(max_files=0, max_fields=MAX_FORM_FIELDS, max_part_size=MAX_FIELD_BYTES)
    if not csrf_ok(request.session, form.get(CSRF_FIELD)):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
    return form


def text(form: FormData, name: str, limit: int = 2000) -> str:
    value: Any = form.get(name)
    return value.strip()[:limit] if isinstance(value, str) else ""
