"""Prometheus's multiprocess mode for prefork workers, chosen before prometheus-client is first imported.

Under ``--pool prefork`` tasks run in child processes, whose counters the parent's
endpoint cannot see. prometheus-client's answer is a directory where every process
writes its values and the parent sums them when scraped; it must be named (in
``PROMETHEUS_MULTIPROC_DIR``) before the library is imported, which is why this
module does not import it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"


def use_multiprocess_metrics(role: str) -> Path:
    """Point prometheus-client at a directory of this worker's own (emptied: a restart counts from zero)."""
    given = os.environ.get(ENV)
    path = Path(given) if given else Path(tempfile.mkdtemp(prefix=f"agentfleet-metrics-{role}-"))
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    os.environ[ENV] = str(path)
    return path


def multiprocess() -> bool:
    return bool(os.environ.get(ENV))
