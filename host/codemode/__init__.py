"""codemode: a code-mode MCP server library.

Three tools (search_api, describe_api, execute) over a typed catalog of host capabilities; programs
run in fresh single-use workers (a local process, a Docker container or a Kubernetes pod) and every
native call crosses back to the host to be rebound, authorized and dispatched.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

# regopy's shared library is loaded before anything of codemode brings numpy in (the redaction
# matcher does): with numpy's libstdc++ loaded first, building a Rego bundle aborts the process
# ("free(): invalid size"; regopy 1.5.2 with numpy 2.4). A program that imports numpy before
# codemode still meets that: import codemode first (docs/authz.md). Where regopy's library cannot
# load at all (no libatomic), there is no Rego to protect.
with contextlib.suppress(ImportError, OSError):
    import regopy  # noqa: F401

from . import authz
from .authz import Subject, allow_all
from .catalog.capability import Capability
from .catalog.search import SearchResponse
from .common.errors import (
    AgentError,
    CapabilityFailure,
    CodeModeError,
    Internal,
    InvalidArguments,
    InvalidProgram,
    InvalidRegistration,
    NotFound,
    PermissionDenied,
    PolicyFailure,
    ResourceLimit,
    Unauthenticated,
)
from .common.outcomes import ExecuteResult, LedgerEntry
from .execution.approval import ApprovalRequest, Approver
from .execution.builder import Builder
from .execution.context import CallContext
from .execution.limits import Limits
from .execution.observe import (
    ApprovalAnswer,
    CallDecision,
    CallEvent,
    CallOutcome,
    ExecuteEvent,
    ExecuteOutcome,
    NullObserver,
    Observer,
)
from .execution.quota import LocalQuota, QuotaStore
from .execution.quota_kubernetes import KubernetesQuota
from .execution.server import Description, Server
from .execution.tracing import Tracing
from .packs.lifecycle import PackOpenError
from .packs.registry import CapabilityPack, capability, capability_of
from .runtimes.base import ExitInfo, Runtime, Sandbox
from .runtimes.pool import WarmPool
from .runtimes.process import ProcessRuntime

if TYPE_CHECKING:
    from .runtimes.docker import DockerRuntime
    from .runtimes.kubernetes import KubernetesRuntime

__version__ = "0.1.0"

__all__ = [
    "AgentError",
    "ApprovalAnswer",
    "ApprovalRequest",
    "Approver",
    "Builder",
    "CallContext",
    "CallDecision",
    "CallEvent",
    "CallOutcome",
    "Capability",
    "CapabilityFailure",
    "CapabilityPack",
    "CodeModeError",
    "Description",
    "DockerRuntime",
    "ExecuteEvent",
    "ExecuteOutcome",
    "ExecuteResult",
    "ExitInfo",
    "Internal",
    "InvalidArguments",
    "InvalidProgram",
    "InvalidRegistration",
    "KubernetesQuota",
    "KubernetesRuntime",
    "LedgerEntry",
    "Limits",
    "LocalQuota",
    "NotFound",
    "NullObserver",
    "Observer",
    "PackOpenError",
    "PermissionDenied",
    "PolicyFailure",
    "ProcessRuntime",
    "QuotaStore",
    "ResourceLimit",
    "Runtime",
    "Sandbox",
    "SearchResponse",
    "Server",
    "Subject",
    "Tracing",
    "Unauthenticated",
    "WarmPool",
    "allow_all",
    "authz",
    "capability",
    "capability_of",
]


def __getattr__(name: str) -> Any:
    # The container runtimes import their SDKs lazily: a process-only host never loads them.
    if name == "DockerRuntime":
        from .runtimes.docker import DockerRuntime

        return DockerRuntime
    if name == "KubernetesRuntime":
        from .runtimes.kubernetes import KubernetesRuntime

        return KubernetesRuntime
    raise AttributeError(f"module 'codemode' has no attribute {name!r}")
