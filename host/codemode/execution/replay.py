"""The call log of one execute, and its replay (docs/reference/authorization.md#asking-the-user).

A Starlark program here is deterministic: no clock, no randomness, no I/O beyond its native calls.
Given the same source, limits and native-call results it makes the same calls in the same order. So
an execute that waits for a person is suspended as a record holding its call log, and resumed by
running the same source again in a fresh worker, fed the recorded answers:

- every native call of the resumed run must equal the next entry of the log (same capability id,
  same canonical arguments JSON text, same ``attempt`` or not, in order); it gets the recorded
  answer (a result, or the error text that went back to ``attempt``) and nothing is dispatched;
- after the log, the next call must be the pending one (the call the user was asked about); it is
  authorized again and then, if the user's answer and the policy allow it, dispatched live;
- anything else is :class:`ReplayDiverged`: the execute fails closed and nothing is dispatched.

A ``math.*`` result on another process-runtime replica may differ in its last bit; that is harmless
only because divergence is checked: a program that then makes another call fails closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .observe import ApprovalAnswer, CallDecision, CallOutcome

__all__ = ["Entry", "Journal", "Pending", "ReplayDiverged"]


class ReplayDiverged(Exception):
    """A resumed program made another call than its log holds (host-log detail only)."""


@dataclass(frozen=True)
class Entry:
    """One call whose answer went back to the program.

    Attributes:
        capability_id: the capability's stable id.
        arguments: the canonical arguments, as the exact JSON text the host produced.
        attempt: whether the program made it under ``attempt``.
        value: the result's JSON text (``native_result``), or None for an error.
        error: the client text of the error that went back to ``attempt``, or None.
        size: bytes the result added to ``max_intermediate_value_bytes``.
        name: the dotted name (the ledger's).
        decision: the audit decision.
        outcome: the audit outcome.
    """

    capability_id: str
    arguments: str
    attempt: bool
    value: str | None
    error: str | None
    size: int
    name: str
    decision: CallDecision
    outcome: CallOutcome

    def to_json(self) -> list[Any]:
        """The entry as the record's body holds it.

        Returns:
            A JSON array (positional, compact).
        """
        return [
            self.capability_id,
            self.arguments,
            self.attempt,
            self.value,
            self.error,
            self.size,
            self.name,
            self.decision,
            self.outcome,
        ]

    @classmethod
    def from_json(cls, item: Any) -> Entry:
        """Read an entry the host wrote.

        Args:
            item: the JSON array.

        Returns:
            The entry.

        Raises:
            ValueError: it is not one.
        """
        if not isinstance(item, list) or len(item) != 9:
            raise ValueError("malformed log entry")
        cap, args, attempt, value, error, size, name, decision, outcome = item
        if not (isinstance(cap, str) and isinstance(args, str) and isinstance(attempt, bool)):
            raise ValueError("malformed log entry")
        if (value is None) == (error is None) or not isinstance(size, int) or not isinstance(name, str):
            raise ValueError("malformed log entry")
        return cls(cap, args, attempt, value, error, size, name, decision, outcome)

    @property
    def bytes(self) -> int:
        """UTF-8 bytes of the entry's texts."""
        return len(self.arguments.encode("utf-8")) + len((self.value or self.error or "").encode("utf-8"))


@dataclass(frozen=True)
class Pending:
    """The call the user is asked about.

    Attributes:
        capability_id: the capability's stable id.
        arguments: the canonical arguments' JSON text.
        attempt: whether it is made under ``attempt``.
    """

    capability_id: str
    arguments: str
    attempt: bool


class Journal:
    """The log of one run: the recorded prefix a resumed run replays, then the calls it makes live.

    Args:
        entries: the recorded log (empty for a first run).
        pending: the call the user was asked about (None for a first run).
        answer: the user's answer to it (resumed runs).
    """

    def __init__(
        self, entries: list[Entry] | None = None, pending: Pending | None = None, answer: ApprovalAnswer = ""
    ) -> None:
        self.entries: list[Entry] = list(entries or ())
        self.replay_end = len(self.entries)
        self.cursor = 0
        self.pending = pending
        self.answer: ApprovalAnswer = answer
        #: The current call is the pending one (set by :meth:`replay`, cleared by :meth:`take_answer`).
        self.at_pending = False

    @property
    def replaying(self) -> bool:
        """The run is still in its recorded prefix (or has not reached the pending call yet)."""
        return self.cursor < self.replay_end or self.pending is not None

    @property
    def resumed(self) -> bool:
        """The run replays a suspension."""
        return self.replay_end > 0 or self.pending is not None

    def replay(self, capability_id: str, arguments: str, attempt: bool) -> Entry | None:
        """Match one call of the program against the log.

        Args:
            capability_id: the capability it calls.
            arguments: its canonical arguments' JSON text.
            attempt: whether it is made under ``attempt``.

        Returns:
            The recorded entry to answer with (no dispatch), or None: the call runs live (the
            pending call, or any call after it).

        Raises:
            ReplayDiverged: the call is not the next one of the log, nor the pending call.
        """
        if self.cursor < self.replay_end:
            entry = self.entries[self.cursor]
            if (entry.capability_id, entry.arguments, entry.attempt) != (capability_id, arguments, attempt):
                raise ReplayDiverged(
                    f"call {self.cursor + 1} is {capability_id}, the log has {entry.capability_id}"
                )
            self.cursor += 1
            return entry
        pending = self.pending
        if pending is not None:
            if (pending.capability_id, pending.arguments, pending.attempt) != (
                capability_id,
                arguments,
                attempt,
            ):
                raise ReplayDiverged(
                    f"the pending call is {pending.capability_id}, the program made {capability_id}"
                )
            self.pending = None
            self.at_pending = True
        return None

    def take_answer(self) -> ApprovalAnswer | None:
        """The user's answer, for the pending call only (once); None for any other call.

        Returns:
            The answer word, or None.
        """
        if not self.at_pending:
            return None
        self.at_pending = False
        return self.answer

    def record(self, entry: Entry) -> None:
        """Append a call made live (its answer went back to the program).

        Args:
            entry: the call.
        """
        self.at_pending = False
        self.entries.append(entry)
