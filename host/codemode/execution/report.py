"""What one execute reports besides its value, collected by the host: the call ledger and the
program's prints (codemode.common.outcomes).

The ledger gets one entry per native call the host records for the audit log, at the same moment
and from the same record, so the two cannot disagree. The prints arrive from a hostile worker: the
host keeps them only when it asked for them, never more than ``max_print_bytes``, and a worker
that sends more than an honest one would (more bytes, or more frames than
``codemode_worker.protocol.max_print_frames``: each one is work for the shared event loop) is
refused (:class:`PrintsRefused`).
"""

from __future__ import annotations

from typing import Any

from ..common.errors import CodeModeError
from ..common.outcomes import PRINTS_CUT_MARKER, ExecuteResult, LedgerEntry, ledger_outcome
from .progress import Progress, current_progress

__all__ = ["PrintsRefused", "Report"]


class PrintsRefused(Exception):
    """A ``print`` frame an honest worker would not send (host-log detail only)."""


class Report:
    """The ledger and prints of one execute.

    Args:
        max_print_bytes: UTF-8 bytes of prints kept (0: prints are not kept).
        max_print_frames: print frames an honest worker sends at most.
        progress: where the calls and prints go while the execute runs, as they are recorded
            (codemode.execution.progress; default: what the running ``tools/call`` asked for, if
            anything).
    """

    def __init__(
        self, max_print_bytes: int, max_print_frames: int = 0, progress: Progress | None = None
    ) -> None:
        self.budget = max_print_bytes
        self.progress = progress if progress is not None else current_progress()
        self.frames_left = max_print_frames
        self.calls: list[LedgerEntry] = []
        self._texts: list[str] = []
        self._bytes = 0
        self._cut = False

    def record(self, capability: str, decision: str, outcome: str) -> str:
        """Add the call's entry to the ledger.

        Args:
            capability: the dotted capability name.
            decision: the audit decision.
            outcome: the audit outcome.

        Returns:
            The call's ledger outcome word.
        """
        word = ledger_outcome(decision, outcome)
        self.calls.append(LedgerEntry(capability, word))
        self.progress.call_finished(capability, word)
        return word

    def add_print(self, text: str, cut: bool) -> None:
        """Keep one print frame's text.

        Args:
            text: the frame's text.
            cut: whether the worker cut the output here (no frame may follow).

        Raises:
            PrintsRefused: the host keeps no prints, the output was already cut, the frame is
                empty, or it is over the frame count or ``max_print_bytes``.
        """
        if self.budget <= 0:
            raise PrintsRefused("print frame, but this host keeps no prints")
        if self._cut:
            raise PrintsRefused("print frame after the output was cut")
        if not text and not cut:
            raise PrintsRefused("empty print frame")
        self.frames_left -= 1
        if self.frames_left < 0:
            raise PrintsRefused("more print frames than an honest worker sends")
        size = len(text.encode("utf-8"))
        if self._bytes + size > self.budget:
            raise PrintsRefused("print frames over max_print_bytes")
        self._texts.append(text)
        self._bytes += size
        self._cut = cut
        self.progress.printed(text + (PRINTS_CUT_MARKER if cut else ""))

    @property
    def prints(self) -> str | None:
        """The prints so far (with the cut marker when cut), or None when none are kept."""
        if self.budget <= 0:
            return None
        return "".join(self._texts) + (PRINTS_CUT_MARKER if self._cut else "")

    def result(self, value: Any) -> ExecuteResult:
        """The execute's result.

        Args:
            value: what the program's ``main()`` returned.

        Returns:
            The value with this ledger and the prints.
        """
        return ExecuteResult(value, tuple(self.calls), self.prints)

    def attach(self, error: CodeModeError) -> None:
        """Give ``error`` this execute's ledger and prints (``Server.execute`` raises it).

        Args:
            error: the error the execute ends with.
        """
        error.calls = tuple(self.calls)
        error.prints = self.prints
