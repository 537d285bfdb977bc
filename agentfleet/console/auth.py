"""Who may use the console, and proof that a POST came from its own page.

Sign-in is by name and password (``AGENTFLEET_CONSOLE_CREDENTIALS``, as Flower's basic auth); a signed session
cookie (HttpOnly, SameSite=Strict) carries who signed in and a random CSRF token, and every POST must send that
token back in its form. Without credentials the console serves loopback only, to whoever reaches it, and says
so; it refuses to listen on another interface without them.
"""

from __future__ import annotations

import getpass
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from typing import Any

from agentfleet.errors import ConfigurationError

SESSION_USER = "user"
SESSION_CSRF = "csrf"
CSRF_FIELD = "csrf_token"


@dataclass(frozen=True)
class Credentials:
    """Names and passwords people sign in with (none: the loopback-only, no-sign-in console)."""

    users: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, raw: str | None) -> Credentials:
        if not raw or not raw.strip():
            return cls()
        users = []
        for pair in raw.split(","):
            name, sep, password = pair.strip().partition(":")
            if not sep or not name or len(password) < 8:
                raise ConfigurationError("AGENTFLEET_CONSOLE_CREDENTIALS is name:password pairs, comma-separated, "
                                         "each password at least 8 characters")
            users.append((name, password))
        return cls(tuple(users))

    @property
    def required(self) -> bool:
        return bool(self.users)

    def check(self, name: str, password: str) -> bool:
        """Whether ``name`` signs in with ``password``: every pair is compared in constant time, known name or not."""
        ok = False
        for known, expected in self.users:
            ok |= hmac.compare_digest(known.encode(), name.encode()) & hmac.compare_digest(expected.encode(),
                                                                                             password.encode())
        return ok


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(host: str, credentials: Credentials) -> None:
    """Refuse to serve another interface to people who need not sign in."""
    if not credentials.required and not is_loopback(host):
        raise ConfigurationError(f"the console would serve {host} to anyone: set AGENTFLEET_CONSOLE_CREDENTIALS "
                                 "(name:password pairs) or listen on 127.0.0.1")


def local_user() -> str:
    """Who acts on a console without sign-in: the OS user that started it (as the CLI records)."""
    return f"{getpass.getuser()} (local console)"


def csrf_token(session: dict[str, Any]) -> str:
    token = session.get(SESSION_CSRF)
    if not isinstance(token, str) or len(token) < 32:
        token = secrets.token_urlsafe(32)
        session[SESSION_CSRF] = token
    return token


def csrf_ok(session: dict[str, Any], sent: object) -> bool:
    token = session.get(SESSION_CSRF)
    return (isinstance(token, str) and isinstance(sent, str) and len(token) >= 32
            and hmac.compare_digest(token.encode(), sent.encode()))
