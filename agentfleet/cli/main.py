"""The entry point: every command's output masked, errors the CLI expects printed as one line."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rich.markup import escape

from agentfleet import constants as C
from agentfleet.config.settings import get_settings
from agentfleet.errors import AgentfleetError, ConfigurationError, ServiceUnreachable

if TYPE_CHECKING:
    pass
from agentfleet.cli.app import app
from agentfleet.cli.common import err


def main() -> None:
    with _masked_output():
        try:
            app()
        except AgentfleetError as exc:
            kind = "configuration" if isinstance(exc, ConfigurationError) else exc.code
            err.print(f"[red]error[/] {kind}: {escape(str(exc))}", soft_wrap=True)  # one line: a URL is never cut
            sys.exit(C.EXIT_UNREACHABLE if isinstance(exc, ServiceUnreachable) else C.EXIT_CONFIGURATION)


@contextlib.contextmanager
def _masked_output() -> Iterator[None]:
    """Everything this process prints passes the redactor the logs use: results, statuses, dead letters, error
    messages and tracebacks alike (``agentfleet artifacts --ref`` writes its bytes as they are, to a file or a
    pipe: that is data asked for, not output shown). The streams stay masked until the process exits: a crash's
    traceback is printed after ``main`` has returned, by the interpreter."""
    from agentfleet.redaction import RedactingStream, install_for

    with contextlib.suppress(Exception):  # settings that do not parse are the command's to report; patterns apply
        install_for(get_settings())
    sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
