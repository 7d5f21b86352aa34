"""The warm pool's size from measured demand, and each subject's share of it.

``Demand`` measures two things and derives the pool's target from them:

* the **arrival rate**: workers asked of the pool per second (warm or not), as an exponentially
  decayed count over ``window`` seconds (``count ← count·e^(−Δt/window) + 1`` per arrival; the rate
  is ``count / window``; a steady rate λ converges to λ, and with no arrivals the rate decays to 0
  with time constant ``window``);
* the **spawn time**: seconds one worker takes to start, as an exponentially weighted moving average
  of the starts seen (weight ``alpha`` for the newest).

``want = clamp(ceil(rate × spawn_time × headroom), minimum, maximum)``: by Little's law
``rate × spawn_time`` workers are asked for while one replacement starts, so a pool that holds that
many (times the headroom for bursts) has a warm worker for each of them. Before the first start is
measured it is ``minimum``.

The target grows at once and shrinks late: it rises with ``want`` at once, and falls (to ``want``
then) only once ``want`` has stayed below it for ``hold`` seconds. The rate window is short so that
a burst raises the target while it is still arriving; the hold keeps the pool at that size through
the gaps between bursts, and gives the workers back only after ``hold`` seconds of lower demand
(measured: ``tests/benchmarks/pool_burst.py``).

Nothing here sleeps or reads a clock of its own: the clock is injected (tests drive it by hand).

``Shares`` keeps one subject from taking every warm worker: a subject that took ``cap`` warm workers
the pool has not yet replaced takes no more until the refills catch up (it gets a cold start; the
others keep finding warm ones). The pools ask it only while another subject competes
(``codemode.runtimes.contention``): a lone subject takes any warm worker.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable

__all__ = ["Demand", "Shares"]


class Demand:
    """Arrival rate and spawn time, measured, and the pool target they give (module docstring).

    Args (of the constructor):
        minimum: the smallest target (the operator's ``--pool``).
        maximum: the largest target (``--pool-max``; equal to ``minimum``: a fixed pool).
        window: seconds over which the arrival rate is measured (its decay time constant).
        hold: seconds the target stays at its highest recent value before it may shrink.
        headroom: factor on ``rate × spawn_time`` for bursts.
        alpha: weight of the newest spawn time in its moving average.
        clock: seconds from a monotonic clock.

    Raises (the constructor):
        ValueError: a negative minimum, a maximum below it, a negative hold, or a non-positive
            window, headroom or alpha (or alpha above 1).
    """

    def __init__(
        self,
        minimum: int,
        maximum: int,
        *,
        window: float = 2.0,
        hold: float = 10.0,
        headroom: float = 2.0,
        alpha: float = 0.3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if minimum < 0 or maximum < minimum:
            raise ValueError("pool bounds: 0 <= minimum <= maximum")
        # Written so that NaN fails each test (every comparison with NaN is false).
        if not (
            0 < window < math.inf and 0 <= hold < math.inf and 0 < headroom < math.inf and 0 < alpha <= 1
        ):
            raise ValueError(
                "pool demand: window > 0, hold >= 0, headroom > 0 and 0 < alpha <= 1, all finite"
            )
        self.minimum = minimum
        self.maximum = maximum
        self.window = window
        self.hold = hold
        self.headroom = headroom
        self.alpha = alpha
        self._clock = clock
        self._count = 0.0
        self._at = clock()
        self._spawn: float | None = None
        self._peak = minimum
        self._peak_at = self._at

    @property
    def fixed(self) -> bool:
        """Whether the target never moves (``minimum == maximum``)."""
        return self.minimum == self.maximum

    def arrival(self) -> None:
        """One worker was asked of the pool (warm or not)."""
        now = self._clock()
        self._count = self._decayed(now) + 1.0
        self._at = now

    def spawned(self, seconds: float) -> None:
        """One worker took ``seconds`` to start.

        Args:
            seconds: its start time (negative values and NaN count as 0; an infinite one is
                ignored: it would make the target infinite).
        """
        if math.isinf(seconds):
            return
        seconds = max(0.0, seconds)  # max(0.0, nan) is 0.0
        previous = self._spawn
        self._spawn = seconds if previous is None else previous + self.alpha * (seconds - previous)

    def rate(self) -> float:
        """Arrivals per second, now.

        Returns:
            The decayed rate.
        """
        return self._decayed(self._clock()) / self.window

    def spawn_seconds(self) -> float | None:
        """The measured spawn time (None before the first start).

        Returns:
            Seconds.
        """
        return self._spawn

    def want(self, base: int = 0) -> int:
        """The size the demand measured right now asks for.

        Args:
            base: workers needed besides the ones for arrivals (the reuse pool: the sandboxes its
                active subjects hold; 0 for the warm pool).

        Returns:
            ``clamp(base + ceil(rate × spawn_time × headroom), minimum, maximum)``.
        """
        if self.fixed:
            return self.minimum
        if self._spawn is None:
            return max(self.minimum, min(self.maximum, base))
        # A tiny epsilon keeps an exact product (2.0000000001 from float error) from rounding up.
        wanted = self.rate() * self._spawn * self.headroom - 1e-9
        if not wanted < self.maximum:  # past the maximum, inf or NaN: rounding one would raise
            wanted = float(self.maximum)
        want = base + math.ceil(wanted)
        return max(self.minimum, min(self.maximum, want))

    def target(self, base: int = 0) -> int:
        """How many idle workers the pool should hold now: :meth:`want` when it is at least the
        target so far, or when it has stayed below that for ``hold`` seconds; else the target so far
        (the pool asks on every arrival and every half second).

        Args:
            base: as for :meth:`want`.

        Returns:
            The target.
        """
        want = self.want(base)
        now = self._clock()
        if want >= self._peak or now - self._peak_at >= self.hold:
            self._peak, self._peak_at = want, now
        return self._peak

    def _decayed(self, now: float) -> float:
        elapsed = max(0.0, now - self._at)
        return self._count * math.exp(-elapsed / self.window)


class Shares:
    """Warm workers each subject took that the pool has not replaced yet, and whether it may take
    another: at most ``max(1, floor(target × share))`` outstanding per subject.

    Args (of the constructor):
        share: the fraction of the target one subject may hold outstanding (1: no cap).

    Raises (the constructor):
        ValueError: a share outside (0, 1].
    """

    def __init__(self, share: float) -> None:
        if not 0 < share <= 1:
            raise ValueError("pool subject share must be in (0, 1]")
        self.share = share
        self._owed: dict[str, int] = {}
        self._order: collections.deque[str] = collections.deque()

    def cap(self, target: int) -> int:
        """Outstanding warm workers one subject may have at this target.

        Args:
            target: the pool's target now.

        Returns:
            The cap (at least 1).
        """
        return max(1, math.floor(target * self.share + 1e-9))

    def may_take(self, subject: str, target: int) -> bool:
        """Whether ``subject`` may take a warm worker now.

        Args:
            subject: the subject id.
            target: the pool's target now.

        Returns:
            True when its outstanding count is below the cap.
        """
        return self.share >= 1 or self._owed.get(subject, 0) < self.cap(target)

    def took(self, subject: str) -> None:
        """``subject`` took a warm worker.

        Args:
            subject: the subject id.
        """
        self._owed[subject] = self._owed.get(subject, 0) + 1
        self._order.append(subject)

    def replaced(self) -> None:
        """The pool started one worker in place of a taken one: the oldest debt is paid."""
        if self._order:
            subject = self._order.popleft()
            left = self._owed[subject] - 1
            if left:
                self._owed[subject] = left
            else:
                del self._owed[subject]

    def clear(self) -> None:
        """The pool is full again: nothing is owed."""
        self._owed.clear()
        self._order.clear()

    def owed(self, subject: str) -> int:
        """Warm workers ``subject`` took that are not replaced yet.

        Args:
            subject: the subject id.

        Returns:
            The count.
        """
        return self._owed.get(subject, 0)
