"""The context a handler and an authorizer receive for one native call."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ..common.passed import passed_as
from ..store import Store
from .limits import Limits

__all__ = ["CallContext"]


@passed_as("ctx")  # a capability function's parameter annotated CallContext receives it
@dataclass
class CallContext:
    """Per-execute context.

    ``deadline`` is a ``time.monotonic()`` instant; ``worker_id`` the runtime's id of the execute's
    worker (for logs); ``cancelled`` is set when the execution ends for
    any reason (success, failure, deadline, client cancellation). Handlers are cooperative: they
    should stop work when ``cancelled`` is set or ``remaining()`` reaches zero. The execute call
    does not wait for a handler that ignores both. ``store`` is the server's store
    (``codemode.packs.Store``: the state pack keeps its keys there, namespaced by the trusted
    subject the handler is given) and ``limits`` the server's limits (the state pack's per-subject
    bounds ``max_state_keys`` and ``max_state_bytes``); both None outside an execute.
    """

    deadline: float
    worker_id: str = ""
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    store: Store | None = None
    limits: Limits | None = None

    def remaining(self) -> float:
        """Seconds until the deadline.

        Returns:
            The seconds left, never negative.
        """
        return max(0.0, self.deadline - time.monotonic())

    @property
    def is_cancelled(self) -> bool:
        """True once the execution has ended (``cancelled`` is set) or its deadline has passed: a
        long handler checks it and stops early."""
        return self.cancelled.is_set() or self.remaining() <= 0.0
