"""The runtime interface: where workers run.

A runtime spawns *sandboxes*. A sandbox is one started, warm, single-use worker reachable through a
bidirectional byte stream. This module is the only thing the process, Docker and Kubernetes
runtimes implement; the execute pipeline and the pools know nothing else about them.

Besides ``Runtime`` and ``Sandbox``, the seam has optional parts, each a protocol checked with
``isinstance`` (never looked up by name):

* ``SubjectSpawner``: ``spawn_for(subject)`` hands out a sandbox for one subject and says whether it
  was started ahead of time (``Spawned``); the warm pool and the reuse pool. The executor uses it
  when the runtime has it, else ``spawn()`` (a cold start);
* ``SupervisingRuntime``: ``spawn_supervised()`` starts a reusable sandbox (Docker, Kubernetes), what
  the reuse pool (``codemode.runtimes.reuse``) is built on;
* ``ConcurrentRefill``: ``concurrent_refill``, whether workers cost this host little to start, so a
  pool may start many at once (Kubernetes, the process runtime's template);
* ``MemoryLimited``: ``memory_limited``, whether the runtime runs its workers under a memory limit of
  its own (an address-space rlimit, a cgroup limit): a worker that died of an allocation failure
  then hit that limit (``codemode.runtimes.exhaustion``). A pool says what its runtime says;
* ``LimitedLifetime``: ``max_lifetime``, the seconds after which the runtime ends any sandbox
  (Kubernetes' ``activeDeadlineSeconds``), which the reuse pool recycles before;
* ``ReusableSandbox``: ``reusable(worker_done)``, told by the executor that an execute ended cleanly
  (a lease of the reuse pool).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from ..common.errors import Internal, ResourceLimit

__all__ = [
    "CapacityExhausted",
    "ConcurrentRefill",
    "ExitInfo",
    "LimitedLifetime",
    "MemoryLimited",
    "OptionError",
    "ReusableSandbox",
    "Runtime",
    "RuntimeClosing",
    "RuntimeUnavailable",
    "Sandbox",
    "SandboxClosed",
    "SpawnFailed",
    "Spawned",
    "SubjectSpawner",
    "SupervisingRuntime",
    "concurrent_refill",
]


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


class OptionError(ValueError):
    """A refused runtime option (``ProcessOptions`` and the like, checked when they are made):
    ``option`` names its field, the message says why in one line (naming it too)."""

    def __init__(self, option: str, message: str) -> None:
        """Refused.

        Args:
            option: the option's field name (``memory``).
            message: the one-line reason.
        """
        super().__init__(message)
        self.option = option


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


@runtime_checkable
class ReusableSandbox(Sandbox, Protocol):
    """A sandbox that may serve its subject again (a lease of the reuse pool): the executor marks it
    when an execute ended cleanly; any other sandbox is single-use."""

    def reusable(self, worker_done: bool = False) -> None:
        """The execute ended cleanly: the sandbox may be scrubbed and leased again.

        Args:
            worker_done: the worker sent its own last frame and ends by itself (not when the host
                ended it while the worker waited for an answer).
        """


@dataclass(frozen=True)
class Spawned:
    """What ``spawn_for`` hands out: the ``sandbox`` and whether it was started ahead of time
    (``warm``: it waited in a pool; False for one started on demand)."""

    sandbox: Sandbox
    warm: bool = False


@runtime_checkable
class SubjectSpawner(Runtime, Protocol):
    """A runtime that hands sandboxes out per subject (the warm pool, the reuse pool)."""

    async def spawn_for(self, subject: str) -> Spawned:
        """A started sandbox for one subject.

        Args:
            subject: the subject id the execute runs for.

        Returns:
            The sandbox, and whether it was started ahead of time.

        Raises:
            SpawnFailed: this worker could not start.
            RuntimeUnavailable: the runtime (or pool) cannot create workers.
        """
        ...


#: What a supervising runtime starts (``codemode.runtimes.reuse.supervised.Supervised``; named by a type
#: variable because that module builds on this one).
BoxT_co = TypeVar("BoxT_co", covariant=True)


@runtime_checkable
class SupervisingRuntime(Runtime, Protocol[BoxT_co]):
    """A runtime that can start reusable sandboxes (Docker, Kubernetes): the reuse mode's seam."""

    async def spawn_supervised(self) -> BoxT_co:
        """A started reusable sandbox whose supervisor has said hello (its first worker is
        starting).

        Returns:
            The sandbox.

        Raises:
            SpawnFailed: this sandbox did not start.
            RuntimeUnavailable: the runtime cannot create sandboxes.
        """
        ...


@runtime_checkable
class ConcurrentRefill(Protocol):
    """A runtime that says whether its workers cost this host little to start (a pool then starts
    as many at once as it needs; otherwise one per CPU)."""

    @property
    def concurrent_refill(self) -> bool:
        """True when many workers may start at once."""
        ...


@runtime_checkable
class MemoryLimited(Protocol):
    """A runtime that says whether its workers run under a memory limit of its own."""

    @property
    def memory_limited(self) -> bool:
        """True with an address-space rlimit or a cgroup memory limit on every worker."""
        ...


@runtime_checkable
class LimitedLifetime(Protocol):
    """A runtime that ends every sandbox after ``max_lifetime`` seconds (Kubernetes)."""

    @property
    def max_lifetime(self) -> float:
        """Seconds a sandbox lives at most."""
        ...


def concurrent_refill(runtime: object) -> bool:
    """Whether a pool may start ``runtime``'s workers all at once (``ConcurrentRefill``).

    Args:
        runtime: the runtime a pool wraps.

    Returns:
        True when the runtime declares it.
    """
    return isinstance(runtime, ConcurrentRefill) and bool(runtime.concurrent_refill)
