"""``agentfleet console``: the web console, served by this process."""

from __future__ import annotations

from typing import Annotated

import typer

from agentfleet.cli.app import app
from agentfleet.cli.common import _runtime, out
from agentfleet.config.settings import get_settings


@app.command()
def console(
    host: Annotated[str | None, typer.Option(help="Address to listen on (default AGENTFLEET_CONSOLE_HOST, "
                                                  "127.0.0.1; another needs AGENTFLEET_CONSOLE_CREDENTIALS)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default AGENTFLEET_CONSOLE_PORT, 5580)")] = None,
) -> None:
    """Serve the web console: runs and their trees, approvals, dead letters, the fleet, activity; live."""
    from agentfleet.console.server import server

    settings = get_settings()
    chosen_host, chosen_port = host or settings.console_host, settings.console_port if port is None else port
    serving = server(settings, _runtime(settings), host=chosen_host, port=chosen_port,
                     log_level=settings.log_level)
    who = "sign-in required" if settings.console_credentials else "no sign-in (loopback only)"
    out.print(f"console on http://{chosen_host}:{chosen_port}/ ({who})", markup=False, highlight=False)
    serving.run()
