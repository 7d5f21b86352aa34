"""codemode worker: runs one model-written Starlark program inside a single-use sandbox.

The worker imports nothing from ``codemode``. The host imports the pure-Python modules
``protocol``, ``shapes`` and ``values`` and runs its own copy of them on everything the
worker sends; ``interpreter`` and ``entry`` (which import ``starlark``) only run in the worker.
"""

from __future__ import annotations

PROTOCOL_VERSION = 1
"""Version carried by ``probe``, ``probe_ack`` and ``exec`` frames."""

WORKER_ENV_MARKER = "CODEMODE_WORKER"
"""The environment variable every runtime sets for a worker (value ``"1"``)."""

STDERR_VARIABLE = "CODEMODE_WORKER_STDERR"
"""Set to ``STDERR_BOUNDED`` (the Kubernetes runtime does), the worker passes on only the first
8 KiB of what it writes to stderr once confined (``confinement``, ``stderr_relay``)."""
STDERR_BOUNDED = "bounded"

__all__ = ["PROTOCOL_VERSION", "STDERR_BOUNDED", "STDERR_VARIABLE", "WORKER_ENV_MARKER"]
