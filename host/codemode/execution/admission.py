"""Admission to worker slots: who may take one (:class:`Admission`: slots, per-subject quota,
reserve, checked once in one wording) and which waiting execute gets the next free one
(:class:`FairAdmission`).

``max_concurrent_executions`` slots are shared by every subject. Two rules decide who gets one
(docs/service.md, "Fair slots"):

1. **Newcomers first.** When a slot frees, it goes to the waiting execute whose subject holds the
   fewest slots right now (first come, first served among equals). A subject with nothing in flight
   is therefore served before every subject that already holds a slot.
2. **Reserved slots.** The last ``reserved`` free slots are kept for subjects that hold none: a
   subject that already holds a slot waits while only ``reserved`` (or fewer) slots are free.

Consequence (proved in docs/service.md): at most ``slots - reserved`` slots are ever held by
subjects' second and later executes, and each subject holds at most one "first" slot, so every slot
can be busy only while at least ``reserved + 1`` distinct subjects hold slots. Fewer than
``reserved`` greedy subjects never make a newcomer wait at all; more of them make it wait at most
until the next slot frees.

Behind several replicas with a shared quota store (``codemode.execution.quota``), "holds" counts
the subject's executes on the other replicas too, as the store saw them at admission: a subject
busy elsewhere is no newcomer here.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from .limits import DEFAULT_SUBJECT_QUOTA

__all__ = ["Admission", "FairAdmission", "default_quota", "default_reserve"]


def default_reserve(slots: int) -> int:
    """The reserve used when none is configured: a quarter of the slots, at least 1, always leaving
    one slot a subject may take as its second (0 when there is a single slot).

    Args:
        slots: the number of worker slots.

    Returns:
        The number of reserved slots.
    """
    if slots <= 1:
        return 0
    return min(max(1, slots // 4), slots - 1)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _given_or_derived(slots: int, subject_quota: object, reserved_slots: object) -> object:
    """The library's reserve: as given, else derived when there is a quota, else none."""
    if reserved_slots is None:
        return default_reserve(slots) if subject_quota else 0
    return reserved_slots


@dataclass(frozen=True)
class Admission:
    """Who may take a worker slot: ``slots`` (``max_concurrent_executions``), the executes one
    subject may have in flight (``subject_quota``, 0 = no quota) and the slots kept for subjects with
    nothing in flight (``reserved_slots``). Constructing one checks it (:meth:`problems_of`); the
    library's ``Builder`` and the settings check with the same words, naming fields their own way.
    """

    slots: int
    subject_quota: int = 0
    reserved_slots: int = 0

    def __post_init__(self) -> None:
        problems = self.problems_of(self.slots, self.subject_quota, self.reserved_slots)
        if problems:
            raise ValueError("; ".join(problems))

    @staticmethod
    def problems_of(
        slots: int, subject_quota: object, reserved_slots: object, name: Callable[[str], str] = str
    ) -> list[str]:
        """What is wrong with this quota and reserve.

        Args:
            slots: ``max_concurrent_executions``.
            subject_quota: the per-subject quota (0: none).
            reserved_slots: the reserve (None: derived as in :meth:`derive`).
            name: renders a field's name (the settings give its flag and variable).

        Returns:
            The problems, each naming its field (empty when there are none).
        """
        if not _whole(slots) or slots < 1:
            return [f"{name('max_concurrent_executions')}: must be at least 1"]
        if not _whole(subject_quota):
            return [f"{name('subject_quota')}: must be a whole number, 0 or more (0 = no per-subject quota)"]
        reserved_slots = _given_or_derived(slots, subject_quota, reserved_slots)
        if not _whole(reserved_slots):
            return [f"{name('reserved_slots')}: must be a whole number, 0 or more (None = derived)"]
        assert isinstance(subject_quota, int) and isinstance(reserved_slots, int)  # for mypy
        slots_name = name("max_concurrent_executions")
        if reserved_slots >= slots:
            return [
                f"{name('reserved_slots')}: {reserved_slots} reserved of {slots} slots ({slots_name}): "
                "must be fewer than the slots"
            ]
        usable = slots - reserved_slots
        if subject_quota > usable:
            return [
                f"{name('subject_quota')}: {subject_quota} is more than one subject can ever hold: "
                f"{slots} slots ({slots_name}) minus {reserved_slots} reserved for subjects with nothing "
                f"in flight ({name('reserved_slots')}) leaves {usable}; lower the quota, raise the slots "
                "or lower the reserve"
            ]
        return []

    @classmethod
    def derive(cls, slots: int, subject_quota: int = 0, reserved_slots: int | None = None) -> Admission:
        """The library's rule: a reserve not given is derived (:func:`default_reserve`) only when
        there is a quota; without one, one subject may use every slot.

        Args:
            slots: ``max_concurrent_executions``.
            subject_quota: the per-subject quota (0: none).
            reserved_slots: the reserve (None: derived).

        Returns:
            The admission (checked on construction).
        """
        reserve = _given_or_derived(slots, subject_quota, reserved_slots)
        return cls(slots, subject_quota, reserve)  # type: ignore[arg-type]  # checked on construction


def default_quota(slots: int, reserved_slots: int) -> int:
    """The HTTP service's quota when none is configured: :data:`DEFAULT_SUBJECT_QUOTA`, lowered so
    that one subject can reach it (``slots - reserved_slots``), at least 1.

    Args:
        slots: ``max_concurrent_executions``.
        reserved_slots: the reserve.

    Returns:
        The quota.
    """
    return max(1, min(DEFAULT_SUBJECT_QUOTA, slots - reserved_slots))


@dataclass(order=True)
class _Waiter:
    seq: int
    subject: str = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)
    elsewhere: int = field(default=0, compare=False)


class FairAdmission:
    """Counting slots with per-subject accounting; use from one event loop.

    ``fair=False`` gives plain first-come-first-served slots without a reserve (what an
    ``asyncio.Semaphore`` does); it exists so benchmarks can measure the difference in one run.

    Args:
        slots: the number of slots, at least 1.
        reserved: slots kept for subjects that hold none (default: :func:`default_reserve`).
        fair: whether the two rules apply (else first come, first served, no reserve).

    Raises:
        ValueError: ``slots`` is below 1, or ``reserved`` is negative or not below ``slots``.
    """

    def __init__(self, slots: int, reserved: int | None = None, *, fair: bool = True) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        reserve = default_reserve(slots) if reserved is None else reserved
        if not 0 <= reserve < slots:
            raise ValueError("reserved slots must be at least 0 and fewer than the slots")
        self.slots = slots
        self.reserved = reserve if fair else 0
        self.fair = fair
        self.free = slots
        self.held: dict[str, int] = {}
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        """Executes waiting for a slot."""
        return len(self._waiting)

    def _busy(self, waiter: _Waiter) -> int:
        """The slots a waiter's subject holds, here and (as its store saw at admission) elsewhere."""
        return self.held.get(waiter.subject, 0) + waiter.elsewhere

    def _may_take(self, waiter: _Waiter) -> bool:
        if self.free <= 0:
            return False
        return self._busy(waiter) == 0 or self.free > self.reserved

    def _grant(self, subject: str) -> None:
        self.free -= 1
        self.held[subject] = self.held.get(subject, 0) + 1

    def _dispatch(self) -> None:
        """Hand free slots to waiters, best first, while someone may take one.

        A waiter whose wait is already cancelled is dropped, never granted: a deadline cancels the
        future its task awaits at once, but the task's ``except`` branch runs only on its next
        step, and a slot freed in between (a reap ending in the same loop iteration) must go to a
        waiter that is still waiting (granting it raised ``InvalidStateError`` into
        the releasing execute and lost the slot).
        """
        if any(w.future.done() for w in self._waiting):
            self._waiting = [w for w in self._waiting if not w.future.done()]
        while self.free > 0 and self._waiting:
            if self.fair:
                candidates = [w for w in self._waiting if self._may_take(w)]
                if not candidates:
                    return
                best = min(candidates, key=lambda w: (self._busy(w), w.seq))
            else:
                best = self._waiting[0]
            self._waiting.remove(best)
            self._grant(best.subject)
            best.future.set_result(None)

    async def acquire(self, subject: str, elsewhere: int = 0) -> None:
        """Wait for a slot for ``subject``. Cancellation while waiting takes nothing.

        Args:
            subject: the subject id the slot is counted against.
            elsewhere: the subject's executes in flight on other replicas (a shared quota store
                says; 0 with the local one): the two rules count them as slots it holds.
        """
        waiter = _Waiter(next(self._seq), subject, asyncio.get_running_loop().create_future(), elsewhere)
        self._waiting.append(waiter)
        self._dispatch()
        if waiter.future.done():
            return
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif waiter.future.done() and not waiter.future.cancelled():
                # Granted just as we were cancelled: give the slot back.
                self.release(subject)
            raise

    def release(self, subject: str) -> None:
        """Return one slot ``subject`` holds.

        Args:
            subject: the subject id.

        Raises:
            RuntimeError: the subject holds no slot.
        """
        held = self.held.get(subject, 0)
        if held <= 0:
            raise RuntimeError("release() of a slot the subject does not hold")
        if held == 1:
            del self.held[subject]
        else:
            self.held[subject] = held - 1
        self.free += 1
        self._dispatch()
