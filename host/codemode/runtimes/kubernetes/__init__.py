"""The Kubernetes runtime: one hardened, single-use pod per execute, through the Kubernetes API
(docs/kubernetes.md; the settings: docs/reference/runtimes.md).

The package, one concept per module: ``runtime`` (``KubernetesRuntime`` and its sandbox),
``pod`` (the manifest and the pod's status, pure), ``nodes`` (silent nodes and their
quarantine), ``upgrade`` (the bounded websocket upgrade); internal: ``_launch`` (create, attach,
the worker's first answer), ``_attach`` (the attach websocket), ``_orphans`` (the owner identity
and the orphan rule), ``_api_errors`` (reading the API's errors).
"""

from __future__ import annotations

from ..base import SandboxClosed as SandboxClosed
from ..streams import STDERR_TAIL as STDERR_TAIL
from ._attach import not_running_yet
from ._launch import CREATE_CONFLICT_RETRIES
from ._orphans import CleanupMode
from .pod import (
    CONTAINER_NAME,
    DEFAULT_IMAGE,
    INSTANCE_LABEL,
    MIN_KUBERNETES,
    OWNER_LABEL,
    ROLE_LABEL,
    WORKER_UID,
)
from .pod import PROTOCOL_LABEL as PROTOCOL_LABEL
from .runtime import DEFAULT_NAMESPACE, KubernetesRuntime, KubernetesSandbox

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
    "KubernetesRuntime",
    "KubernetesSandbox",
    "not_running_yet",
]
