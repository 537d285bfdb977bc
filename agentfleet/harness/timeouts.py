"""Calling Python code with a timeout.

Python code cannot be killed from inside its process: it runs in a daemon thread
that is abandoned at its timeout. Tools and health checks both use this.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def call_with_timeout(fn: Callable[[], Any], timeout_s: float, *, name: str) -> tuple[bool, Any, BaseException | None]:
    """``(finished, value, error)``: ``finished`` is False when ``fn`` was still running at the timeout."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=target, name=name, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return False, None, None
    return True, box.get("value"), box.get("error")
