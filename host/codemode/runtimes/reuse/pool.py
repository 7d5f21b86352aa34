"""The reuse mode: reusable sandboxes, each leased to one subject (an operator's choice).

The default is one fresh sandbox per execute (the product's contract). With ``ReusePool`` a
container or pod whose PID 1 is ``codemode_worker.supervisor`` serves several executes of **one
subject**, one at a time, each in a fresh worker process that the supervisor forks; after each
execute it kills every other process, removes what the worker left (files, IPC objects) and
verifies the sandbox against the baseline it took before the first worker (see
``codemode_worker.supervisor`` and ``codemode_worker.scrub``). The guarantee becomes "a fresh process
in a scrubbed sandbox of the same subject" (docs/reference/runtimes.md).

Rules (each has its test):

* **one subject per sandbox, for its whole life**: a sandbox is bound to the subject of its first
  lease and only ever leased to that subject again; nothing moves it to another one;
* **recycled** (the container or pod removed) after ``max_executes`` executes, after
  ``idle_seconds`` without one, after ``max_age`` seconds, and at once when an execute did not end
  cleanly (a deadline, a limit, a worker that misbehaved or died: the executor marks a lease
  ``reusable()`` only when its program ended with a result or a program error) or the supervisor
  reports an anomaly, breaks the channel or does not finish within ``end_timeout``;
* **a successor before the end**: once a sandbox has served all but its last few executes (a
  number drawn per sandbox between a tenth and a fifth of ``max_executes``, so that sandboxes started
  together do not all end together), a successor is started for its subject in the background,
  bound to that subject from the start and never leased to another one; when it is up, the old
  sandbox is recycled (at once if idle, else when its lease ends). The subject's next execute then
  finds a started sandbox instead of waiting for a new container or pod. Only while the idle and
  starting sandboxes, the old one not counted, are fewer than ``size``, within
  ``refill_concurrency``, and with ``per_subject`` 2 or more; otherwise the sandbox serves its
  ``max_executes`` and the subject's next execute starts one, as without successors;
* **sized from demand** (as the warm pool, ``codemode.runtimes.pool``): with a ``maximum`` above
  ``size``, the number of sandboxes kept (``size`` below: the target) is
  ``clamp(active + ceil(rate × spawn_time × headroom), size, maximum)``, where ``active`` is the
  subjects served within the last ``recent_seconds`` or waiting (each keeps a sandbox of its own),
  ``rate`` the leases per second that found no idle sandbox of their subject (each took a warm one or
  started one; measured over ``window`` seconds) and ``spawn_time`` the measured start of a sandbox
  (``codemode.runtimes.demand``). The target rises at once and falls after ``hold`` seconds of
  lower demand; idle sandboxes above it are then recycled, the one idle longest first (each exactly
  once: it leaves the pool before its removal starts). Without a ``maximum`` (or with one equal to
  ``size``) the target is ``size``, as it always was;
* **bounded and fair per subject**: at most ``size`` sandboxes are kept idle in all (bound to a
  subject or warm, never leased yet), at most ``per_subject`` of them bound to one subject; when
  more come back, the one idle longest is recycled, whoever it belongs to, so no subject keeps more
  than its own ``per_subject`` idle. A subject that has no idle sandbox takes a warm one, or starts
  one (under the slot the executor already holds: fair admission decides who runs,
  ``codemode.execution.admission``). Subjects that hold ``size`` sandboxes between them leave no
  warm one, and a rarely executing subject's idle sandbox is the one recycled first: its executes
  then start cold (docs/reference/runtimes.md: "Between subjects");
* **the share bites only under contention**: while another subject waits for a sandbox from this
  pool or was served by it within the last ``recent_seconds`` (``codemode.runtimes.contention``),
  a subject holding ``max(1, floor(size × subject_share))`` sandboxes (in use or idle for it)
  starts its next one instead of taking a warm one, so that a flood of one subject's executes
  cannot take every warm sandbox; a lone subject takes any warm one;
* **refilled for the others**: the warm ones are refilled in the background while the sandboxes
  kept (idle, in use and starting) are fewer than ``size``, where a subject's sandboxes in use past
  its share do not count while another subject competes (they would keep the refill from ever
  replacing the warm ones the others need), nor, up to as many, the warm ones a lone subject took
  past its share until a refill has replaced them. A sandbox recycled to keep no more idle than
  the target counts until its removal has ended (a container or pod being removed still holds its memory and
  its place in a quota; at most ``maximum + 1 - size`` of them count, so a removal that never ends
  cannot stop the refill), so demand that falls and rises again does not start sandboxes on top of
  those; one recycled for any other reason is replaced at once. Live sandboxes that are not being
  removed never exceed ``max_concurrent_executions + maximum + 1`` (the one: a successor starting
  while its predecessor is still idle); a new subject's lease does not wait for removals, so
  sandboxes being removed come on top.

``spawn()`` (no subject: operator tools) returns a fresh single-use sandbox of the runtime, never a
reusable one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import os
import random
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..base import (
    LimitedLifetime,
    RuntimeClosing,
    RuntimeUnavailable,
    Sandbox,
    Spawned,
    SpawnFailed,
    SupervisingRuntime,
    concurrent_refill,
)
from ..contention import RECENT_SECONDS, Contention
from ..demand import Demand, Shares
from ..exhaustion import memory_limited
from ..handshake import probe
from .supervised import Supervised

__all__ = ["ReusePool"]

log = logging.getLogger("codemode.runtimes.reuse")


def _log_failed_removal(task: asyncio.Task[Any]) -> None:
    """A removal that raised is logged once (nothing else reads its result)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("reuse pool: removing a sandbox failed: %s: %s", type(exc).__name__, exc)


#: Seconds between target checks while the target may still move (it decays with time).
_TICK = 0.5


def _closed() -> RuntimeClosing:
    """A sandbox asked of a closed reuse pool: one line, no traceback."""
    log.warning("no sandbox is leased: the reuse pool is closing")
    return RuntimeClosing("the reuse pool is closing")


class ReusePool:
    """Reusable sandboxes leased per subject (see the module docstring); itself a Runtime.

    Args (of the constructor):
        runtime: the runtime whose ``spawn_supervised()`` makes the sandboxes.
        size: how many sandboxes to keep started (idle or leased); the fewest when ``maximum`` is
            given.
        maximum: the largest number the measured demand may keep (None: ``size``, a fixed pool).
        max_executes: executes one sandbox serves before it is recycled.
        idle_seconds: how long a sandbox stays bound to its subject unused.
        per_subject: sandboxes one subject may hold at once.
        max_age: seconds a sandbox lives at most (default: 0.9 of the runtime's ``max_lifetime``).
        probe_timeout: seconds a new worker in a sandbox has to answer the probe.
        retry_delay: seconds between refills after a failed start.
        refill_concurrency: warm sandboxes started at once at most (None: ``size`` on a runtime
            with ``concurrent_refill`` (Kubernetes), one per CPU otherwise (Docker)).
        subject_share: a subject holding ``max(1, floor(size × subject_share))`` sandboxes (in use
            or idle for it) while another subject competes starts its next one instead of taking a
            warm one (1: no cap).
        recent_seconds: how long after its last request a subject still competes for the warm
            sandboxes (``codemode.runtimes.contention``), and counts as active for the target.
        window: seconds over which the arrival rate is measured.
        hold: seconds the target stays at its highest recent value before it shrinks.
        headroom: factor on ``rate × spawn_time``.
        clock: seconds from a monotonic clock (the demand's and the contention's).

    Raises (the constructor):
        ValueError: a negative size, a maximum below it, or a bound below 1 (``idle_seconds`` not
            positive, a refill concurrency below 1), or a share outside (0, 1].
    """

    def __init__(
        self,
        runtime: SupervisingRuntime[Supervised],
        size: int,
        *,
        max_executes: int = 100,
        idle_seconds: float = 60.0,
        per_subject: int = 2,
        max_age: float | None = None,
        probe_timeout: float = 10.0,
        retry_delay: float = 0.5,
        refill_concurrency: int | None = None,
        subject_share: float = 0.5,
        recent_seconds: float = RECENT_SECONDS,
        maximum: int | None = None,
        window: float = 2.0,
        hold: float = 10.0,
        headroom: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if size < 0 or max_executes < 1 or per_subject < 1 or idle_seconds <= 0:
            raise ValueError("size >= 0, max_executes >= 1, per_subject >= 1 and idle_seconds > 0")
        maximum = size if maximum is None else maximum
        if maximum < size:
            raise ValueError("pool maximum must not be below the pool size")
        if not 0 < subject_share <= 1:
            raise ValueError("subject_share must be in (0, 1]")
        self.subject_share = subject_share
        #: Warm sandboxes lone subjects took past their share that no refill has replaced yet.
        self.shares = Shares(subject_share)
        self.contention = Contention(recent_seconds, clock)
        if refill_concurrency is not None and refill_concurrency < 1:
            raise ValueError("refill_concurrency >= 1")
        self.inner = runtime
        self.minimum = size
        self.maximum = maximum
        self.demand = Demand(size, maximum, window=window, hold=hold, headroom=headroom, clock=clock)
        self.max_executes = max_executes
        self.idle_seconds = idle_seconds
        self.per_subject = per_subject
        if max_age is None and isinstance(runtime, LimitedLifetime):
            max_age = 0.9 * runtime.max_lifetime  # before Kubernetes' activeDeadlineSeconds ends the pod
        self.max_age = max_age
        self.probe_timeout = probe_timeout
        self.retry_delay = retry_delay
        self.concurrent = concurrent_refill(runtime)
        if refill_concurrency is None:  # as codemode.runtimes.pool: all at once, or one per CPU
            refill_concurrency = max(1, maximum if self.concurrent else (os.cpu_count() or 1))
        self.refill_concurrency = refill_concurrency
        self._refilling = 0
        #: Idle sandboxes bound to each subject (most recently used last).
        self._idle: dict[str, list[Supervised]] = {}
        #: Sandboxes of each subject leased right now.
        self._busy: dict[str, set[Supervised]] = {}
        #: Started sandboxes never leased yet (bound to nobody).
        self._warm: collections.deque[Supervised] = collections.deque()
        self._in_use = 0
        self._starting = 0
        #: Sandboxes recycled by ``_trim`` whose removal has not ended (``_recycle``).
        self._removing = 0
        self._closed = False
        self._wake: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Removals under way: ``aclose`` waits for them instead of cancelling them.
        self._removals: set[asyncio.Task[Any]] = set()
        self.last_error: str | None = None
        #: Seconds each of the last 1000 sandbox starts took (the service's pool metrics).
        self.refill_seconds: list[float] = []
        #: Counters for benchmarks and logs.
        self.leases = 0
        self.reused = 0
        self.cold = 0
        self.recycled = 0
        self.successors = 0
        #: The executes after which each sandbox gets its successor (drawn when it starts).
        self._successor_due: weakref.WeakKeyDictionary[Supervised, int] = weakref.WeakKeyDictionary()
        #: Sandboxes whose successor is started: recycled when their lease ends.
        self._leaving: weakref.WeakSet[Supervised] = weakref.WeakSet()

    # -- Runtime protocol ------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"{self.inner.name}+reuse"

    @property
    def size(self) -> int:
        """The number of sandboxes to keep now (the target: ``minimum`` ≤ target ≤ ``maximum``;
        see the module docstring)."""
        return self.demand.target(self.contention.active())

    @property
    def memory_limited(self) -> bool:
        """What its runtime says (``codemode.runtimes.exhaustion``)."""
        return memory_limited(self.inner)

    @property
    def idle(self) -> int:
        """Sandboxes ready right now (bound or warm)."""
        return len(self._warm) + sum(len(v) for v in self._idle.values())

    def warm(self) -> bool:
        """Whether the pool keeps its minimum number of sandboxes (for readiness and benchmarks; a
        fixed pool's minimum is its target).

        Returns:
            True at or above the minimum.
        """
        return self.idle + self._in_use >= self.minimum

    async def wait_warm(self, timeout: float = 60.0) -> None:
        """Wait until the pool is at target.

        Args:
            timeout: seconds to wait at most.

        Raises:
            TimeoutError: not at target in time.
        """
        async with asyncio.timeout(timeout):
            while not self.warm():
                await asyncio.sleep(0.02)

    async def start(self) -> None:
        await self.inner.start()
        self._wake = asyncio.Event()
        self._background(self._refill_loop())
        self._background(self._sweep_loop())

    async def check(self) -> None:
        await self.inner.check()

    async def spawn(self) -> Sandbox:
        """A fresh single-use sandbox (callers without a subject): never a reusable one."""
        if self._closed:
            raise _closed()
        return await self.inner.spawn()

    async def spawn_for(self, subject: str) -> Spawned:
        """A worker in a sandbox of the subject's own (reused, warm or new).

        Args:
            subject: the subject id the sandbox is leased to.

        Returns:
            The probed worker (a ``ReusableSandbox``), ``warm`` when its sandbox was running before
            this lease (reused or warm; not one started for it).

        Raises:
            RuntimeUnavailable: the pool is closed or its runtime cannot create sandboxes.
        """
        if self._closed:
            raise _closed()
        with self.contention.waiting(subject):
            self._kick()  # another subject's sandboxes past its share may stop counting now
            return await self._lease_for(subject)

    async def _lease_for(self, subject: str) -> Spawned:
        counted = False
        while True:
            box = self._take_own(subject)
            if box is None and await self._ending(subject):
                continue  # its sandbox came back (or was recycled): look again
            if box is None and not counted:
                counted = True
                self.demand.arrival()  # a lease that needs a sandbox not of its own
            if box is None and self._may_take_warm(subject):
                past_share = self.subject_share < 1 and self._held(subject) >= self._cap()
                box = self._take_warm()
                if box is not None and past_share:
                    self.shares.took(subject)  # alone: the refill replaces it for the others
            cold = box is None
            if box is None:
                box = await self._new_box()
                self.cold += 1
            box.subject = subject
            lease = box.new_lease(self._ended)
            self._in_use += 1
            self._busy.setdefault(subject, set()).add(box)
            try:
                if not lease.ready:  # else the supervisor probed this worker before saying so
                    await probe(lease, self.probe_timeout)
            except BaseException as exc:
                info = await lease.destroy()  # never marked reusable: the sandbox is recycled
                if isinstance(exc, SpawnFailed):
                    log.warning(
                        "worker %s failed to start: %s (exit %s, signal %s, stderr %r)",
                        lease.worker_id,
                        exc,
                        info.exit_code,
                        info.signal,
                        info.stderr_tail[-512:],
                    )
                if cold or not isinstance(exc, SpawnFailed):
                    raise
                continue
            self.leases += 1
            if box.executes:
                self.reused += 1
            return Spawned(lease, warm=not cold)

    async def aclose(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
            # Wait for the removals, never cancel them: one cancelled before it began would leave
            # its sandbox. asyncio.wait, not gather: a close cancelled meanwhile leaves them running.
            while self._removals:
                await asyncio.wait(set(self._removals))
        finally:  # even when the close itself is cancelled: the idle ones and the runtime's own close
            boxes = list(self._warm) + [b for v in self._idle.values() for b in v]
            self._warm.clear()
            self._idle.clear()
            await asyncio.gather(*(b.destroy() for b in boxes), return_exceptions=True)
            await self.inner.aclose()

    # -- bookkeeping -----------------------------------------------------------------------

    def _take_own(self, subject: str) -> Supervised | None:
        """The idle sandbox ``subject`` used last, if any."""
        own = self._idle.get(subject)
        while own:
            box = own.pop()
            if not own:
                del self._idle[subject]
            if self._fresh(box):
                self._kick()
                return box
            self._recycle(box, "it died while idle")
            own = self._idle.get(subject)
        return None

    def _cap(self) -> int:
        return max(1, math.floor(self.size * self.subject_share + 1e-9))

    def _held(self, subject: str) -> int:
        return len(self._busy.get(subject, ())) + len(self._idle.get(subject, ()))

    def _may_take_warm(self, subject: str) -> bool:
        """Whether ``subject`` may take a warm sandbox: when it holds fewer sandboxes (in use, idle
        for it) than its share of the pool, or when no other subject competes (a warm one it takes
        past its share is then owed: the refill replaces it; see the module docstring)."""
        if self.subject_share >= 1 or self._held(subject) < self._cap():
            return True
        return not self.contention.others(subject)

    def _uncounted(self) -> int:
        """Sandboxes in use that do not keep the refill back: each subject's past its share while
        another subject competes, else at most as many as the warm ones it took past its share
        alone and no refill has replaced yet."""
        if self.subject_share >= 1:
            return 0
        cap = self._cap()
        total = 0
        for subject, busy in self._busy.items():
            over = min(len(busy), max(0, self._held(subject) - cap))
            total += over if self.contention.others(subject) else min(over, self.shares.owed(subject))
        return total

    def _take_warm(self) -> Supervised | None:
        """A started sandbox nobody has used yet, if any."""
        while self._warm:
            box = self._warm.popleft()
            if self._fresh(box):
                self._kick()
                return box
            self._recycle(box, "it died while warm")
        return None

    async def _ending(self, subject: str) -> bool:
        """Wait for a sandbox of ``subject`` whose lease is ending (its scrub takes milliseconds, a
        new sandbox far longer): True when one ended, False when none is ending."""
        ending = [
            b.lease.ended for b in self._busy.get(subject, ()) if b.lease is not None and b.lease.ending
        ]
        if not ending:
            return False
        waits = [asyncio.ensure_future(event.wait()) for event in ending]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        return True

    def _fresh(self, box: Supervised) -> bool:
        return box.usable() and (self.max_age is None or time.monotonic() - box.created < self.max_age)

    def _ended(self, box: Supervised) -> None:
        """A lease of ``box`` ended (its sandbox scrubbed and verified, or recycled already)."""
        self._in_use -= 1
        self._kick()
        if box.subject is not None:
            busy = self._busy.get(box.subject)
            if busy is not None:
                busy.discard(box)
                if not busy:
                    del self._busy[box.subject]
        if box.broken is not None:
            self.recycled += 1
            return
        if self._closed:
            self._recycle(box, "the pool is closing", anomaly=False)
        elif box.executes >= self.max_executes:
            self._recycle(box, f"it served {box.executes} executes", anomaly=False)
        elif box in self._leaving:
            self._recycle(box, "its successor is started", anomaly=False)
        elif not self._fresh(box):
            self._recycle(box, "it reached its maximum age", anomaly=False)
        else:
            assert box.subject is not None
            own = self._idle.setdefault(box.subject, [])
            own.append(box)
            while len(own) > self.per_subject:
                self._recycle(own.pop(0), "its subject keeps enough idle sandboxes", anomaly=False)
            self._trim()
            self._maybe_succeed(box)

    def _maybe_succeed(self, box: Supervised) -> None:
        """Start the successor of ``box`` (idle for its subject right now) once it is due (see the
        module docstring)."""
        due = self._successor_due.get(box)
        if due is None or box.executes < due or self.per_subject < 2 or box.subject is None:
            return
        del self._successor_due[box]  # at most one successor per sandbox
        if any(other is not box for other in self._idle.get(box.subject, ())):
            return  # the subject has another sandbox already
        # ``box`` leaves when its successor is there: it does not count against the room.
        room = self.size - (self.idle - 1 + self._starting + self._held_back())
        if room <= 0 or self._refilling >= self.refill_concurrency:
            return  # no room: its subject's next execute after the recycle starts one
        self._starting += 1
        self._refilling += 1
        self._background(self._succeed(box))

    async def _succeed(self, predecessor: Supervised) -> None:
        """Start a sandbox bound to the predecessor's subject, then recycle the predecessor (now
        if it is idle, else when its lease ends); counted as starting and refilling by the caller."""
        subject = predecessor.subject
        assert subject is not None
        try:
            box = await self._new_box(counted=True)
        except (SpawnFailed, RuntimeUnavailable) as exc:
            log.warning("starting a successor sandbox failed: %s", getattr(exc, "reason", None) or exc)
            return
        finally:
            self._refilling -= 1
            self._kick()
        if self._closed:
            await box.destroy()
            return
        box.subject = subject
        self.successors += 1
        own = self._idle.setdefault(subject, [])
        if predecessor in own:
            own.remove(predecessor)
            self._recycle(predecessor, "its successor is started", anomaly=False)
        elif predecessor.usable():
            self._leaving.add(predecessor)  # recycled when its lease ends
        own.insert(0, box)
        while len(own) > self.per_subject:
            self._recycle(own.pop(), "its subject keeps enough idle sandboxes", anomaly=False)
        self._trim()

    def _trim(self) -> None:
        """At most ``size`` idle sandboxes: recycle the one idle longest, whoever it belongs to."""
        while self.idle > self.size:
            candidates = [(b.idle_since, 0, b) for b in self._warm] + [
                (b.idle_since, 1, b) for v in self._idle.values() for b in v
            ]
            _, _, oldest = min(candidates, key=lambda c: (c[0], c[1]))
            if oldest in self._warm:
                self._warm.remove(oldest)
            else:
                assert oldest.subject is not None
                own = self._idle[oldest.subject]
                own.remove(oldest)
                if not own:
                    del self._idle[oldest.subject]
            self._recycle(oldest, "the pool keeps at most its size idle", anomaly=False, counted=True)

    def _recycle(self, box: Supervised, reason: str, *, anomaly: bool = True, counted: bool = False) -> None:
        """Retire ``box`` and remove it in the background.

        ``counted``: it goes to keep no more idle than the target (``_trim``: the target fell, or
        more came back than it keeps), and it keeps the refill back until its removal has ended (a
        container or pod being removed still holds its memory and its place in a quota), so a target
        that falls and rises again does not start sandboxes on top of those still being removed. Any
        other recycle is a one-for-one replacement (served its executes, aged, died, succeeded): the
        refill replaces it at once, as a subject's next execute would otherwise start cold.
        """
        self._successor_due.pop(box, None)
        box.retire(reason, anomaly=anomaly)
        self.recycled += 1
        if counted:
            self._removing += 1
        self._background(self._remove(box, counted), self._removals).add_done_callback(_log_failed_removal)

    async def _remove(self, box: Supervised, counted: bool) -> None:
        try:
            await box.destroy()
        finally:
            if counted:
                self._removing -= 1
            self._kick()  # a sandbox fewer: the refill looks again (an idle one swept, for one)

    def _held_back(self) -> int:
        """The removals that keep the refill back: at most ``maximum + 1 - minimum`` of them, so a
        removal that never ends (a hung daemon) cannot stop the refill for good."""
        return min(self._removing, self.maximum + 1 - self.minimum)

    def _background(self, coro: Any, tasks: set[asyncio.Task[Any]] | None = None) -> asyncio.Task[Any]:
        """Run ``coro`` as a task kept in ``tasks`` (default: those ``aclose`` cancels) until it ends."""
        into = self._tasks if tasks is None else tasks
        task = asyncio.get_running_loop().create_task(coro)
        into.add(task)
        task.add_done_callback(into.discard)
        return task

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- starting sandboxes ----------------------------------------------------------------

    async def _new_box(self, *, counted: bool = False) -> Supervised:
        """Start a sandbox (``counted``: the caller counted it as starting already)."""
        if not counted:
            self._starting += 1
        started = time.monotonic()
        try:
            box = await self.inner.spawn_supervised()
        finally:
            self._starting -= 1
        seconds = time.monotonic() - started
        self.refill_seconds.append(seconds)
        del self.refill_seconds[:-1000]
        self.demand.spawned(seconds)
        lead = random.randint(max(1, self.max_executes // 10), max(1, self.max_executes // 5))
        if self.max_executes > lead:
            self._successor_due[box] = self.max_executes - lead
        return box

    def _missing(self) -> int:
        live = self.idle + self._in_use - self._uncounted() + self._starting + self._held_back()
        return self.size - live

    async def _refill_loop(self) -> None:
        assert self._wake is not None
        while not self._closed:
            self._trim()  # the target may have fallen: give back idle sandboxes above it
            for _ in range(max(0, min(self._missing(), self.refill_concurrency - self._refilling))):
                self._starting += 1
                self._refilling += 1
                self._background(self._refill_one())
            self._wake.clear()
            if self.demand.fixed:
                await self._wake.wait()
            else:  # the target decays with time: look again now and then
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), _TICK)

    async def _refill_one(self) -> None:
        """Start one warm sandbox (counted as starting and refilling by the caller)."""
        try:
            await self._refill()
        finally:
            self._refilling -= 1
            self._kick()

    async def _refill(self) -> None:
        try:
            box = await self._new_box(counted=True)
        except (SpawnFailed, RuntimeUnavailable) as exc:
            self.last_error = str(getattr(exc, "reason", None) or exc)
            log.warning("reuse pool refill failed: %s", self.last_error)
            await asyncio.sleep(self.retry_delay)
            self._kick()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("reuse pool refill failed unexpectedly")
            await asyncio.sleep(self.retry_delay)
            self._kick()
            return
        self.last_error = None
        if self._closed:
            await box.destroy()
            return
        self._warm.append(box)
        self.shares.replaced()
        self._trim()
        self._kick()

    async def _sweep_loop(self) -> None:
        period = max(0.5, min(5.0, self.idle_seconds / 4))
        while not self._closed:
            await asyncio.sleep(period)
            now = time.monotonic()
            for subject, own in list(self._idle.items()):
                for box in [b for b in own if now - b.idle_since >= self.idle_seconds or not self._fresh(b)]:
                    own.remove(box)
                    self._recycle(box, f"idle for {now - box.idle_since:.0f} s", anomaly=False)
                if not own:
                    self._idle.pop(subject, None)
            for box in [b for b in self._warm if not self._fresh(b)]:
                self._warm.remove(box)
                self._recycle(box, "it died or aged while warm", anomaly=False)
