"""Hooks the execute pipeline calls so a service can count, time and audit without the pipeline
knowing about metrics or logs. Observers see ids, decisions, outcomes and durations, never values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["CallEvent", "ExecuteEvent", "NullObserver", "Observer"]


@dataclass(frozen=True)
class CallEvent:
    """One native call, recorded when the host is done with it (docs/reference/tools.md#the-call-ledger
    maps ``decision``/``outcome`` to the ledger's outcome words)."""

    subject_id: str
    capability_id: str
    decision: str  # "allow", "deny", "policy_failure", "invalid_arguments", "undecided"
    outcome: str  # "ok", "capability_failed", "resource_limit", "interrupted", "not_run"
    authz_seconds: float
    handler_seconds: float
    worker_id: str
    capability: str = ""  # the dotted name, as the program and the ledger see it


@dataclass(frozen=True)
class ExecuteEvent:
    subject_id: str
    outcome: str  # "ok" or the error class name in snake case
    seconds: float
    native_calls: int
    worker_id: str
    oom_killed: bool = False


class Observer(Protocol):
    def native_call(self, event: CallEvent) -> None: ...

    def execute(self, event: ExecuteEvent) -> None: ...

    def execute_started(self, subject_id: str) -> None: ...

    def execute_finished(self, subject_id: str) -> None: ...


class NullObserver:
    """Observes nothing."""

    def native_call(self, event: CallEvent) -> None:
        return None

    def execute(self, event: ExecuteEvent) -> None:
        return None

    def execute_started(self, subject_id: str) -> None:
        return None

    def execute_finished(self, subject_id: str) -> None:
        return None
