"""Hooks the execute pipeline calls so a service can count, time and audit without the pipeline
knowing about metrics or logs. Observers see ids, decisions, outcomes and durations, never values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from ..common.outcomes import ExecuteOutcome

__all__ = [
    "ApprovalAnswer",
    "CallDecision",
    "CallEvent",
    "CallOutcome",
    "ExecuteEvent",
    "ExecuteOutcome",
    "NullObserver",
    "Observer",
]

#: The authorizer's answer for one call (``undecided``: the deadline came before it answered).
#: When the policy asked the user: ``approved`` (the user accepted), ``declined`` (anything else),
#: ``ask`` (the execute ended while the question was open, or was suspended to wait for the answer).
#: ``diverged``: a resumed execute made another call than its log holds (never dispatched).
CallDecision = Literal[
    "allow",
    "deny",
    "policy_failure",
    "invalid_arguments",
    "undecided",
    "approved",
    "declined",
    "ask",
    "diverged",
]
#: What became of a question put to the user (``""``: none was asked). ``unanswered``: no answer
#: within ``max_approval_time``; ``unavailable``: the client or transport cannot be asked;
#: ``busy``: the subject already had ``max_pending_approvals`` questions open.
ApprovalAnswer = Literal["", "accept", "decline", "cancel", "unanswered", "unavailable", "busy"]
#: What became of one call once decided (``interrupted``: the deadline came while its handler ran).
CallOutcome = Literal[
    "ok", "capability_failed", "invalid_arguments", "resource_limit", "interrupted", "not_run"
]


@dataclass(frozen=True)
class CallEvent:
    """One native call, recorded when the host is done with it (docs/reference/tools.md#the-call-ledger
    maps ``decision``/``outcome`` to the ledger's outcome words).

    ``subject_id`` and ``capability_id`` say who called what (``capability`` is the dotted name, as
    the program and the ledger see it); ``authz_seconds`` and ``handler_seconds`` time the
    authorizer and the handler; ``worker_id`` names the worker; ``approval`` is the user's answer
    when the policy asked and ``approval_seconds`` how long the question was open.
    """

    subject_id: str
    capability_id: str
    decision: CallDecision
    outcome: CallOutcome
    authz_seconds: float
    handler_seconds: float
    worker_id: str
    capability: str = ""  # the dotted name, as the program and the ledger see it
    approval: ApprovalAnswer = ""  # the user's answer when the policy asked (docs/reference/authorization.md)
    approval_seconds: float = 0.0  # how long the question was open


@dataclass(frozen=True)
class ExecuteEvent:
    """One finished execute, whatever ended it: ``subject_id``, ``outcome``, ``seconds`` (wall time),
    ``native_calls`` (calls that reached the host), ``worker_id``, ``oom_killed`` (the worker's
    memory limit ended it) and ``cause``, for the operator only (never shown to a client; the words
    of codemode.execution.causes): the limit kind of a ``resource_limit`` (``time``, ``memory``,
    ...), except ``deadline_waiting_for_slot`` / ``deadline_waiting_for_worker`` when the deadline
    passed before the program began; ``quota_store`` for an ``internal`` failure of the quota
    store; else ``""``."""

    subject_id: str
    outcome: ExecuteOutcome
    seconds: float
    native_calls: int
    worker_id: str
    oom_killed: bool = False
    cause: str = ""


@runtime_checkable
class Observer(Protocol):
    """What ``Builder(observer=...)`` takes: four hooks, called on the event loop, which must not
    block or raise (a metrics registry, an audit log). ``Builder.build()`` refuses an observer
    missing one."""

    def native_call(self, event: CallEvent) -> None:
        """One native call, once the host is done with it.

        Args:
            event: ids, decision, outcome and durations (never values).
        """
        ...

    def execute_outcome(self, event: ExecuteEvent) -> None:
        """How one execute ended, once it has.

        Args:
            event: its subject, outcome, duration and call count.
        """
        ...

    def execute_started(self, subject_id: str) -> None:
        """An execute began (before it waits for a slot).

        Args:
            subject_id: whose execute.
        """
        ...

    def execute_finished(self, subject_id: str) -> None:
        """That execute ended (paired with :meth:`execute_started`).

        Args:
            subject_id: whose execute.
        """
        ...


class NullObserver:
    """Observes nothing (the default)."""

    def native_call(self, event: CallEvent) -> None:
        """Ignores the call."""
        return None

    def execute_outcome(self, event: ExecuteEvent) -> None:
        """Ignores the execute's outcome."""
        return None

    def execute_started(self, subject_id: str) -> None:
        """Ignores the start."""
        return None

    def execute_finished(self, subject_id: str) -> None:
        """Ignores the end."""
        return None
