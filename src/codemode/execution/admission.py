"""Fair admission to worker slots: which waiting execute gets the next free slot.

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
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

__all__ = ["FairAdmission", "default_reserve"]


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


@dataclass(order=True)
class _Waiter:
    seq: int
    subject: str = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)


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

    def _may_take(self, subject: str) -> bool:
        if self.free <= 0:
            return False
        return self.held.get(subject, 0) == 0 or self.free > self.reserved

    def _grant(self, subject: str) -> None:
        self.free -= 1
        self.held[subject] = self.held.get(subject, 0) + 1

    def _dispatch(self) -> None:
        """Hand free slots to waiters, best first, while someone may take one."""
        while self.free > 0 and self._waiting:
            if self.fair:
                candidates = [w for w in self._waiting if self._may_take(w.subject)]
                if not candidates:
                    return
                best = min(candidates, key=lambda w: (self.held.get(w.subject, 0), w.seq))
            else:
                best = self._waiting[0]
            self._waiting.remove(best)
            self._grant(best.subject)
            best.future.set_result(None)

    async def acquire(self, subject: str) -> None:
        """Wait for a slot for ``subject``. Cancellation while waiting takes nothing.

        Args:
            subject: the subject id the slot is counted against.
        """
        waiter = _Waiter(next(self._seq), subject, asyncio.get_running_loop().create_future())
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
