"""A program's ``print()`` output, kept up to a byte budget (docs/reference/program.md#prints).

Pure Python (no ``starlark`` import). The budget counts UTF-8 bytes of the text; the first print
that does not fit is cut on a character boundary, and everything after it is dropped. The buffer
only holds what has not been sent yet: :meth:`PrintBuffer.take` hands it over (the interpreter
sends it to the host before each capability call, at its step checks and before the program's
final frame), so at most ``budget`` bytes are ever kept or sent.
"""

from __future__ import annotations

__all__ = ["PrintBuffer"]


class PrintBuffer:
    """``budget`` bytes of output at most; 0 means prints are discarded."""

    def __init__(self, budget: int) -> None:
        self.budget = max(0, budget)
        self.used = 0
        self.cut = False
        self._cut_sent = False
        self._pending: list[str] = []

    @property
    def wanted(self) -> bool:
        """Whether another print can still add anything (so the program need not format it)."""
        return self.budget > 0 and not self.cut

    def add(self, text: str) -> None:
        if not self.wanted or not text:
            return
        data = text.encode("utf-8")
        room = self.budget - self.used
        if len(data) > room:
            text = data[:room].decode("utf-8", errors="ignore")
            data = text.encode("utf-8")
            self.cut = True
        if text:
            self._pending.append(text)
        self.used += len(data)

    def take(self) -> tuple[str, bool] | None:
        """The text not sent yet and whether output was cut after it; ``None`` when there is
        nothing new to send."""
        if not self._pending and (not self.cut or self._cut_sent):
            return None
        text = "".join(self._pending)
        self._pending.clear()
        self._cut_sent = self.cut
        return text, self.cut
