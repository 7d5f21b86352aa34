"""codemode worker: runs one model-written Starlark program inside a single-use sandbox.

The worker imports nothing from ``codemode``. The host imports the pure-Python modules
``protocol``, ``shapes`` and ``values`` and runs its own copy of them on everything the
worker sends; ``interpreter`` and ``entry`` (which import ``starlark``) only run in the worker.
"""

from __future__ import annotations

PROTOCOL_VERSION = 1
"""Version carried by ``probe``, ``probe_ack`` and ``exec`` frames."""

WORKER_ENV_MARKER = "CODEMODE_WORKER"
"""The only environment variable a runtime sets for a worker (value ``"1"``)."""

__all__ = ["PROTOCOL_VERSION", "WORKER_ENV_MARKER"]
