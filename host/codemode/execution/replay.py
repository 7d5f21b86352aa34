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

from dataclasses import dataclass, field
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
        attempt: whether it is made under ``attempt`` (a call of a batch is).
        batch: for a call of a ``parallel(...)`` batch, the batch's calls (capability id, arguments
            text) in list order; None for a single call.
        index: its place among them.
        answers: the answers already given for earlier calls of the same batch (by place).
    """

    capability_id: str
    arguments: str
    attempt: bool
    batch: tuple[tuple[str, str], ...] | None = None
    index: int = 0
    answers: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> list[Any]:
        """The pending call as the record's body holds it.

        Returns:
            A JSON array.
        """
        batch = [list(item) for item in self.batch] if self.batch is not None else None
        answers = {str(k): v for k, v in self.answers.items()}
        return [self.capability_id, self.arguments, self.attempt, batch, self.index, answers]

    @classmethod
    def from_json(cls, item: Any) -> Pending:
        """Read a pending call the host wrote.

        Args:
            item: the JSON array.

        Returns:
            The pending call.

        Raises:
            ValueError: it is not one.
        """
        if not isinstance(item, list) or len(item) != 6:
            raise ValueError("malformed pending call")
        cap, args, attempt, batch, index, answers = item
        if not (isinstance(cap, str) and isinstance(args, str) and isinstance(attempt, bool)):
            raise ValueError("malformed pending call")
        calls = tuple((str(c), str(a)) for c, a in batch) if batch is not None else None
        return cls(cap, args, attempt, calls, int(index), {int(k): str(v) for k, v in answers.items()})


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
        #: Answers for calls of the batch being authorized, by place (a resumed batch).
        self.batch_answers: dict[int, ApprovalAnswer] = {}

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
            # a call of a pending batch comes only in that batch (replay_batch), never on its own
            if pending.batch is not None or (pending.capability_id, pending.arguments, pending.attempt) != (
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

    def replay_batch(self, calls: list[tuple[str, str]]) -> list[Entry] | None:
        """Match a ``parallel(...)`` batch (its calls whose arguments bound, in list order).

        Args:
            calls: (capability id, canonical arguments text) per call.

        Returns:
            The recorded entries to answer with (no dispatch), or None: the batch runs live (the
            batch that holds the pending call, or any batch after it).

        Raises:
            ReplayDiverged: the batch is not the log's next calls, nor the pending batch.
        """
        if self.cursor < self.replay_end:
            end = self.cursor + len(calls)
            recorded = self.entries[self.cursor : end]
            if end > self.replay_end or [(e.capability_id, e.arguments, e.attempt) for e in recorded] != [
                (c, a, True) for c, a in calls
            ]:
                raise ReplayDiverged(f"a batch at call {self.cursor + 1} differs from the log")
            self.cursor = end
            return recorded
        pending = self.pending
        if pending is not None:
            if pending.batch is None or list(pending.batch) != calls:
                raise ReplayDiverged("the pending batch differs")
            self.pending = None
            self.batch_answers = {**pending.answers, pending.index: self.answer}  # type: ignore[dict-item]
            self.at_pending = True
        return None

    def answer_for(self, asking: Pending | None) -> ApprovalAnswer | None:
        """The user's answer for the call being decided, if a resume brought one (once).

        Args:
            asking: the call (None: not journaled).

        Returns:
            The answer word, or None.
        """
        if asking is not None and asking.batch is not None:
            return self.batch_answers.get(asking.index)  # kept: a later question records them
        return self.take_answer()

    def has_answer(self, asking: Pending | None) -> bool:
        """Whether a resume brought an answer for the call being decided.

        Args:
            asking: the call.

        Returns:
            True for the pending call (or a call of the pending batch that was answered).
        """
        if asking is not None and asking.batch is not None:
            return asking.index in self.batch_answers
        return self.at_pending

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
        self.batch_answers = {}
        self.entries.append(entry)
