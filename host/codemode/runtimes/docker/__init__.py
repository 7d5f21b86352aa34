"""The Docker runtime: one hardened, single-use container per execute, through the Docker Engine API
(docs/docker.md; the options: docs/reference/runtimes.md).

The package, one concept per module: ``runtime`` (``DockerRuntime``: spawn, check, orphans,
close; ``DockerSandbox``: one container and its ``destroy()``), ``options`` (``DockerOptions``, every
option, checked), ``container`` (what a worker container is made of: its hardening, pure),
``attach`` (the attach stream: demultiplexing, back-pressure, reading on the event loop),
``masked_paths`` (what a worker does not see of ``/proc`` and ``/sys``); internal:
``_orphans`` (the owner identity and the orphan rule), ``_api_errors`` (reading the engine's
errors).

Only ``options`` is imported with the package: the rest loads on the first use of a name that
needs it (and the Docker SDK on the first call to the engine), so the settings can hold
``DockerOptions`` on a host that never starts a container.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .options import (
    DEFAULT_IMAGE,
    DEFAULT_LABEL_PREFIX,
    DEFAULT_MEMORY_BYTES,
    CleanupMode,
    DockerOptions,
    OptionError,
)

if TYPE_CHECKING:
    from ..streams import STDERR_TAIL as STDERR_TAIL
    from ..testing import TESTING_ENTRY
    from .container import IMAGE_PROTOCOL_LABEL, IMAGE_ROLE_LABEL, WORKER_USER
    from .runtime import DockerRuntime, DockerSandbox

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_LABEL_PREFIX",
    "DEFAULT_MEMORY_BYTES",
    "IMAGE_PROTOCOL_LABEL",
    "IMAGE_ROLE_LABEL",
    "TESTING_ENTRY",
    "WORKER_USER",
    "CleanupMode",
    "DockerOptions",
    "DockerRuntime",
    "DockerSandbox",
    "OptionError",
]

#: Where each lazily loaded name lives.
_LAZY = {
    "DockerRuntime": ".runtime",
    "DockerSandbox": ".runtime",
    "IMAGE_PROTOCOL_LABEL": ".container",
    "IMAGE_ROLE_LABEL": ".container",
    "WORKER_USER": ".container",
    "TESTING_ENTRY": "..testing",
    "STDERR_TAIL": "..streams",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
