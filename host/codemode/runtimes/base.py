"""The runtime interface: where workers run.

A runtime spawns *sandboxes*. A sandbox is one started, warm, single-use worker reachable through a
bidirectional byte stream. This module is the only thing the process, Docker and Kubernetes
runtimes implement; the execute pipeline and the warm pool know nothing else about them.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..common.errors import Internal, ResourceLimit

__all__ = [
    "SPAWNED_WARM",
    "CapacityExhausted",
    "ExitInfo",
    "Runtime",
    "RuntimeClosing",
    "RuntimeUnavailable",
    "Sandbox",
    "SandboxClosed",
    "SpawnFailed",
]


#: Set during ``spawn()`` by a runtime that hands out sandboxes started ahead of time (``WarmPool``):
#: True for one that was waiting, False for one started on demand; unset means started on demand.
#: The caller reads it right after ``await runtime.spawn()`` (same task, same context): traces
#: say whether an execute got a warm worker (codemode.execution.tracing).
SPAWNED_WARM: ContextVar[bool | None] = ContextVar("codemode_spawned_warm", default=None)


class RuntimeUnavailable(Exception):
    """The runtime cannot create workers (daemon down, image missing, ...). Host-log detail only."""


class SpawnFailed(Exception):
    """One worker could not be started or did not become ready."""


class RuntimeClosing(RuntimeUnavailable, Internal):
    """The runtime or pool is closing: a worker start in flight was given up, or a worker was asked
    of it after its close. Shutdown, not a fault: the raiser logs one line (no traceback) and the
    client gets ``internal failure``. The host-log detail is ``reason``."""

    def __init__(self, reason: str) -> None:
        """Closing.

        Args:
            reason: what was given up (host log only).
        """
        Internal.__init__(self)
        self.reason = reason


class CapacityExhausted(SpawnFailed, ResourceLimit):
    """No room for another worker (a quota, or no node can take it): the client gets
    ``resource limit exceeded: concurrency``; the runtime has logged what the operator should change.
    The host-log detail is ``reason``; ``str()`` is the coarse client text."""

    def __init__(self, reason: str) -> None:
        """No room for this worker.

        Args:
            reason: what the operator should change (host log only).
        """
        ResourceLimit.__init__(self, "concurrency")
        self.reason = reason


class SandboxClosed(Exception):
    """Writing to a sandbox whose input is closed or whose worker is gone."""


@dataclass(frozen=True)
class ExitInfo:
    """How a worker ended, as far as the runtime can tell: ``exit_code`` (None when unknown),
    ``signal`` (the one that killed it), ``oom_killed`` (its memory limit), ``cpu_limited`` (its CPU
    time limit), ``stderr_tail`` (the bounded end of its stderr, for host logs) and ``lost`` (the
    host lost the worker before it ended: its stream broke while the worker was, as far as anyone
    could tell, still running, e.g. its node died; how it ended is unknown, so ``exit_code`` and
    ``signal`` are None)."""

    exit_code: int | None
    signal: int | None = None
    oom_killed: bool = False
    cpu_limited: bool = False
    stderr_tail: bytes = b""
    lost: bool = False

    @property
    def resource_killed(self) -> bool:
        """The sandbox's own limits (memory, CPU) ended the worker."""
        return self.oom_killed or self.cpu_limited


@runtime_checkable
class Sandbox(Protocol):
    """One single-use worker. All methods are safe to call after the worker has died."""

    @property
    def worker_id(self) -> str:
        """The runtime's id of this worker (a process, container or pod name), for host logs."""
        ...

    async def write(self, data: bytes) -> None:
        """Send bytes to the worker's stdin.

        Args:
            data: the bytes.

        Raises:
            SandboxClosed: the input is closed or the worker is gone.
        """

    async def read(self, max_bytes: int) -> bytes:
        """Read from the worker's stdout.

        Args:
            max_bytes: at most this many bytes.

        Returns:
            What arrived (at least one byte), or ``b""`` at end of stream.
        """

    async def close_input(self) -> None:
        """Close the worker's stdin (idempotent)."""

    def alive(self) -> bool:
        """Whether the worker has not been seen to exit (best effort).

        Returns:
            False once it is known to have exited.
        """

    async def destroy(self) -> ExitInfo:
        """Close streams, kill if still running, reap exactly once. Idempotent: later calls
        return the same ExitInfo without touching the worker again.

        Returns:
            How the worker ended.
        """


@runtime_checkable
class Runtime(Protocol):
    """Creates sandboxes. ``spawn`` returns a started worker that has answered the probe."""

    @property
    def name(self) -> str:
        """The runtime's kind for logs and metrics: ``process``, ``docker``, ``kubernetes``, ..."""
        ...

    async def start(self) -> None:
        """One-time start-up work (e.g. removing orphans of a crashed host)."""

    async def spawn(self) -> Sandbox:
        """Start a new worker and wait until it answered the probe.

        Returns:
            The started, warm sandbox.

        Raises:
            SpawnFailed: this worker could not start (``CapacityExhausted``: no room for it).
            RuntimeUnavailable: the runtime cannot create workers at all.
        """

    async def check(self) -> None:
        """Readiness probe.

        Raises:
            RuntimeUnavailable: with a precise host-log message.
        """

    async def aclose(self) -> None:
        """Stop background work and destroy every sandbox this runtime still owns."""
