"""The plan of a server: everything ``Builder.build()`` checked, handed to ``Server`` (and on to the
executor) as one frozen value."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..authz import Authorizer
from ..catalog.capability import CompiledCapability
from ..runtimes.base import Runtime
from ..store import Store
from .admission import Admission
from .limits import Limits
from .observe import NullObserver, Observer
from .quota import LocalQuota, QuotaStore
from .tracing import Tracing

__all__ = ["Plan"]


@dataclass(frozen=True)
class Plan:
    """A checked server: the enabled capabilities (compiled, in registration order), the authorizer,
    the limits, who may take a worker slot, where workers run, the observer and the tracing (None:
    off). Made by ``Builder.build()``; nothing in it is checked again.

    Attributes:
        capabilities: the enabled capabilities, compiled, in registration order.
        authorizer: asked about every native call.
        limits: the limits.
        admission: who may take a worker slot (slots, quota, reserve).
        runtime: where workers run.
        observer: told about executes and calls.
        tracing: the tracing settings (None: off).
        quota_store: where the per-subject quota is counted (default: this process alone).
        store: where suspended executes and the state pack's keys are kept (``Builder.build()``
            gives a :class:`codemode.store.memory.MemoryStore` when none was given).
    """

    capabilities: tuple[CompiledCapability, ...]
    authorizer: Authorizer
    limits: Limits
    admission: Admission
    runtime: Runtime
    observer: Observer = field(default_factory=NullObserver)
    tracing: Tracing | None = None
    quota_store: QuotaStore = field(default_factory=LocalQuota)
    store: Store | None = None
