"""Calling Python code with a timeout.

Python code cannot be killed from inside its process: it runs in a daemon thread
that is abandoned at its timeout. Tools and health checks both use this.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Called:
    finished: bool  # False: still running at the timeout, and abandoned (``thread`` says if it ever ends)
    value: Any = None
    error: BaseException | None = None
    thread: threading.Thread | None = None


def call_with_timeout(fn: Callable[[], Any], timeout_s: float, *, name: str) -> Called:
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
        return Called(False, thread=worker)
    return Called(True, box.get("value"), box.get("error"), worker)
