"""Serving the console: check where it may listen, then run it under uvicorn in this process."""

from __future__ import annotations

import uvicorn

from agentfleet.config.settings import Settings
from agentfleet.console.app import create_console
from agentfleet.console.auth import Credentials, check_listen
from agentfleet.roles.runtime import Runtime


def server(settings: Settings, rt: Runtime, *, host: str, port: int, log_level: str = "warning") -> uvicorn.Server:
    """A console server, not yet started (``.run()``; tests run it in a thread). ConfigurationError when it would
    serve an interface other than loopback to people who need not sign in."""
    credentials = Credentials.parse(settings.console_credentials.get_secret_value()
                                    if settings.console_credentials else None)
    check_listen(host, credentials)
    config = uvicorn.Config(create_console(settings, rt), host=host, port=port, log_level=log_level.lower(),
                            access_log=False, server_header=False, proxy_headers=False)
    return uvicorn.Server(config)
