"""The Kubernetes runtime: one hardened, single-use pod per execute, through the Kubernetes API
(docs/kubernetes.md; the settings: docs/reference/runtimes.md).

The package, one concept per module: ``runtime`` (``KubernetesRuntime`` and its sandbox),
``options`` (``KubernetesOptions``, every option, checked), ``pod`` (the manifest and the pod's
status, pure), ``nodes`` (silent nodes and their quarantine), ``upgrade`` (the bounded websocket
upgrade); internal: ``_launch`` (create, attach, the worker's first answer), ``_attach`` (the
attach websocket), ``_orphans`` (the owner identity and the orphan rule), ``_api_errors``
(reading the API's errors).

Only ``options`` is imported with the package: the rest (and the Kubernetes client) loads on the
first use of a name that needs it, so the settings can hold ``KubernetesOptions`` on a host that
never starts a pod.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ...common.extras import require
from .options import (
    DEFAULT_IMAGE,
    DEFAULT_NAMESPACE,
    KUBERNETES_FEATURE,
    CleanupMode,
    KubernetesOptions,
    OptionError,
)

if TYPE_CHECKING:
    from ..base import SandboxClosed as SandboxClosed
    from ..streams import STDERR_TAIL as STDERR_TAIL
    from ._attach import not_running_yet
    from ._launch import CREATE_CONFLICT_RETRIES
    from .pod import CONTAINER_NAME, INSTANCE_LABEL, MIN_KUBERNETES, OWNER_LABEL, ROLE_LABEL, WORKER_UID
    from .pod import PROTOCOL_LABEL as PROTOCOL_LABEL
    from .runtime import KubernetesRuntime, KubernetesSandbox

__all__ = [
    "CONTAINER_NAME",
    "CREATE_CONFLICT_RETRIES",
    "DEFAULT_IMAGE",
    "DEFAULT_NAMESPACE",
    "INSTANCE_LABEL",
    "MIN_KUBERNETES",
    "OWNER_LABEL",
    "ROLE_LABEL",
    "WORKER_UID",
    "CleanupMode",
    "KubernetesOptions",
    "KubernetesRuntime",
    "KubernetesSandbox",
    "OptionError",
    "not_running_yet",
]

#: Where each lazily loaded name lives.
_LAZY = {
    "KubernetesRuntime": ".runtime",
    "KubernetesSandbox": ".runtime",
    "CREATE_CONFLICT_RETRIES": "._launch",
    "not_running_yet": "._attach",
    "CONTAINER_NAME": ".pod",
    "INSTANCE_LABEL": ".pod",
    "MIN_KUBERNETES": ".pod",
    "OWNER_LABEL": ".pod",
    "PROTOCOL_LABEL": ".pod",
    "ROLE_LABEL": ".pod",
    "WORKER_UID": ".pod",
    "SandboxClosed": "..base",
    "STDERR_TAIL": "..streams",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not module.startswith(".."):  # this package's own modules use the Kubernetes client
        require("kubernetes", "kubernetes", KUBERNETES_FEATURE)
    return getattr(importlib.import_module(module, __name__), name)
