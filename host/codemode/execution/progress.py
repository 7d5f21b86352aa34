"""Progress of one execute while it runs: what a client that asked for it sees before the result
(docs/reference/tools.md#progress).

An execute reports three kinds of event, each one something its final result carries too:

- a native call started: ``"records.get started (3)"`` (the capability's dotted name, as in the
  ledger, and how many calls have started), sent only for a call the ledger will hold;
- a native call finished: ``"records.get finished (3): ok"`` (how many have finished, and the
  call's ledger word, exactly as the result's ``calls`` will say);
- print text the host kept: ``"print: " + text``, the same text (cut with the same marker) as the
  result's ``prints``; the print notifications of an execute, joined, are its ``prints``.

Nothing host-derived goes with them: no arguments, results, timings, policy or handler text, no
limit values. The numbers are counts of the program's own calls; ``progress`` counts events (each
call start, each call finish, each print notification), so it rises with every notification, as the
protocol asks, and there is no ``total``.

Rate bound: one execute sends at most one notification per :data:`PROGRESS_INTERVAL` seconds. Events
in between are coalesced (the call counts and the latest call event, the print text joined), and
what is still unsent when the execute ends goes out then (at most two notifications: the prints and
the last call event), before the result. A program that makes 10,000 calls in two seconds sends
about ten notifications, not 10,000. Sending runs in a task of its own: a client that does not read
slows only its own notifications, never the execute, and what waits is bounded (one call message,
prints up to ``max_print_bytes``).

The front end opens a :class:`Progress` for one ``tools/call`` with :func:`reporting`; the execute
started inside it takes it with :func:`current_progress` (a :mod:`contextvars` variable, so a task
the front end starts for the execute inherits it). Replay (a resumed execute running its recorded
prefix again) sets :attr:`Progress.replaying` while the prefix runs: nothing is sent meanwhile, the
counts go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

__all__ = [
    "NO_PROGRESS",
    "PRINT_PREFIX",
    "PROGRESS_INTERVAL",
    "Progress",
    "Send",
    "current_progress",
    "reporting",
]

log = logging.getLogger("codemode.progress")

#: Seconds between two progress notifications of one execute, at least (4 a second at most).
PROGRESS_INTERVAL: Final = 0.25
#: What a print notification's message starts with (the rest is the program's output).
PRINT_PREFIX: Final = "print: "

#: Sends one progress notification: ``(progress, message)``.
Send = Callable[[float, str], Awaitable[None]]


class Progress:
    """The progress notifications of one execute, coalesced and rate-bounded.

    The event methods are called on the event loop by the execute and never block or raise.

    Args:
        send: sends one notification (None: nothing is sent; the events are only counted).
        interval: seconds between two notifications, at least.
    """

    def __init__(self, send: Send | None, interval: float = PROGRESS_INTERVAL) -> None:
        self._send = send
        self.interval = interval
        #: While True (a resumed execute replaying its recorded prefix) nothing is sent; the
        #: counts go on, so the first live event says how far the program is.
        self.replaying = False
        self.started = 0
        self.finished = 0
        #: Notifications sent so far.
        self.sent = 0
        self._events = 0  # the progress value: every event counted, so it rises note after note
        self._call: tuple[int, str] | None = None  # the latest call event not sent yet
        self._prints: list[str] = []  # print text not sent yet
        self._prints_at = 0  # the progress value of the pending print text
        self._closed = send is None
        self._broken = False
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def call_started(self, capability: str) -> None:
        """A native call the ledger will hold is about to be decided and run.

        Args:
            capability: its dotted name.
        """
        self.started += 1
        self._call_event(f"{capability} started ({self.started})")

    def call_finished(self, capability: str, outcome: str) -> None:
        """A native call got its ledger entry.

        Args:
            capability: its dotted name.
            outcome: its ledger word (docs/reference/tools.md#the-call-ledger).
        """
        self.finished += 1
        self.started = max(self.started, self.finished)  # a replayed call finishes unstarted
        self._call_event(f"{capability} finished ({self.finished}): {outcome}")

    def printed(self, text: str) -> None:
        """Print text the host kept, as the result's ``prints`` will hold it (with the cut marker
        when the output was cut there).

        Args:
            text: the text.
        """
        if self._closed or self.replaying or not text:
            return
        if not self._prints:
            self._events += 1
            self._prints_at = self._events
        self._prints.append(text)
        self._wake_pump()

    def _call_event(self, message: str) -> None:
        self._events += 1
        if self._closed or self.replaying:
            return
        self._call = (self._events, message)
        self._wake_pump()

    def _wake_pump(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._pump())
        self._wake.set()

    def _take(self) -> tuple[int, str] | None:
        """The oldest pending notification (so ``progress`` rises), taken out of the state."""
        call = self._call
        if self._prints and (call is None or self._prints_at < call[0]):
            text = "".join(self._prints)
            self._prints.clear()
            return self._prints_at, PRINT_PREFIX + text
        self._call = None
        return call

    async def _pump(self) -> None:
        while not self._broken:
            note = self._take()
            if note is None:
                if self._closing.is_set():
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._deliver(*note)
            if not self._closing.is_set():
                with contextlib.suppress(TimeoutError):  # the rate bound; the end cuts it short
                    async with asyncio.timeout(self.interval):
                        await self._closing.wait()

    async def _deliver(self, progress: int, message: str) -> None:
        assert self._send is not None
        try:
            await self._send(float(progress), message)
        except Exception as exc:  # a client gone: its notifications stop, the execute goes on
            self._broken = True
            log.debug("progress notifications stopped: %s", type(exc).__name__)
            return
        self.sent += 1

    async def aclose(self) -> None:
        """Send what is still pending (the final state) and stop; later events are dropped.
        Cancelled meanwhile, the sending stops at once."""
        self._closed = True
        self._closing.set()
        self._wake.set()
        task = self._task
        if task is None:
            return
        try:
            await task
        finally:
            if not task.done():
                task.cancel()


#: The progress of an execute nobody asked progress for: counts, sends nothing.
class _NoProgress(Progress):
    def __init__(self) -> None:
        super().__init__(None)

    def call_started(self, capability: str) -> None:
        return None

    def call_finished(self, capability: str, outcome: str) -> None:
        return None


NO_PROGRESS: Final[Progress] = _NoProgress()

_CURRENT: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("codemode_progress", default=None)


def current_progress() -> Progress:
    """The progress the running ``tools/call`` asked for.

    Returns:
        The :class:`Progress` :func:`reporting` opened, or :data:`NO_PROGRESS`.
    """
    return _CURRENT.get() or NO_PROGRESS


@contextlib.asynccontextmanager
async def reporting(send: Send) -> AsyncIterator[Progress]:
    """Report the progress of the execute run inside the block through ``send``; on leaving, the
    final state is sent before the block's result goes anywhere.

    Args:
        send: sends one notification to the requesting client (its request's own stream).

    Yields:
        The block's :class:`Progress`.
    """
    progress = Progress(send)
    token = _CURRENT.set(progress)
    try:
        yield progress
    finally:
        _CURRENT.reset(token)
        await progress.aclose()
