"""What a pack reports about its upstreams' health, for the service's ``/metrics`` (docs/packs.md).

A pack that keeps sessions to an upstream server calls :func:`upstream_restarted` each time one of
them ended and is started again (or failed to start); the HTTP service shows the counts as
``codemode_upstream_restarts_total{upstream=...}``. Counts are per process and only grow. The name
is the upstream's configured name (operator data, a bounded set), never a subject or a value.
"""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["upstream_restarted", "upstream_restarts"]

_lock = threading.Lock()
_restarts: Counter[str] = Counter()


def upstream_restarted(upstream: str) -> None:
    """Count one restart (or failed start) of a session of ``upstream``.

    Args:
        upstream: the upstream's configured name.
    """
    with _lock:
        _restarts[upstream] += 1


def upstream_restarts() -> dict[str, int]:
    """Restarts counted so far in this process.

    Returns:
        Upstream name → restarts (and failed starts) of its sessions.
    """
    with _lock:
        return dict(_restarts)
