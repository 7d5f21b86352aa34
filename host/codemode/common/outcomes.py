"""What an execute reports besides ``main()``'s value: the call ledger and the program's prints
(docs/reference/tools.md#the-call-ledger, docs/reference/python-api.md).

The ledger lists every native call the host saw, in order, as a capability *name* and one outcome
word; it is built from the same records as the audit log's ``native_call`` lines, so the two always
agree (:data:`AUDIT_OUTCOMES` is the mapping). Nothing else host-derived is in it: no capability
id, no argument, no policy or handler text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = [
    "AUDIT_OUTCOMES",
    "LEDGER_OUTCOMES",
    "PRINTS_CUT_MARKER",
    "RECOVERABLE_OUTCOMES",
    "ExecuteOutcome",
    "ExecuteResult",
    "LedgerEntry",
    "ledger_outcome",
]

#: How one execute ended (``ExecuteEvent.outcome``, the metrics' and the audit log's word): ``ok``,
#: ``cancelled``, ``suspended`` (it waits for the user's answer, as a record: a resume is another
#: execute event), or its error in snake case, which each error class carries as ``outcome``
#: (codemode.common.errors).
ExecuteOutcome = Literal[
    "ok",
    "cancelled",
    "suspended",
    "unauthenticated",
    "not_found",
    "invalid_program",
    "invalid_arguments",
    "permission_denied",
    "policy_failure",
    "resource_limit",
    "capability_failed",
    "internal",
]
#: The audit log's ``(decision, outcome)`` of a ``native_call`` line → the ledger's outcome word.
AUDIT_OUTCOMES: Final[dict[tuple[str, str], str]] = {
    ("allow", "ok"): "ok",
    ("deny", "not_run"): "denied",
    ("policy_failure", "not_run"): "policy failure",
    ("invalid_arguments", "not_run"): "invalid arguments",
    ("allow", "invalid_arguments"): "invalid arguments",  # the handler refused a value
    ("allow", "capability_failed"): "failed",
    ("allow", "resource_limit"): "limit exceeded",
    ("allow", "interrupted"): "interrupted",
    ("undecided", "not_run"): "not run",
    # The policy said "ask" (docs/reference/authorization.md#asking-the-user): the user accepted ...
    ("approved", "ok"): "ok",
    ("approved", "capability_failed"): "failed",
    ("approved", "resource_limit"): "limit exceeded",
    ("approved", "interrupted"): "interrupted",
    # ... or did not (declined, cancelled, no answer in time, a client that cannot be asked) ...
    ("declined", "not_run"): "declined",
    # ... or the execute ended while the question was open.
    ("ask", "not_run"): "not run",
    # A resumed execute made another call than its recorded log: never dispatched, the execute
    # fails closed (docs/reference/authorization.md#asking-the-user).
    ("diverged", "not_run"): "replay diverged",
}
LEDGER_OUTCOMES: Final[tuple[str, ...]] = tuple(dict.fromkeys(AUDIT_OUTCOMES.values()))
#: The outcomes ``attempt()`` hands back to the program as a value; every other one ends it.
RECOVERABLE_OUTCOMES: Final = frozenset({"denied", "declined", "failed", "invalid arguments"})
#: Appended to the prints when the program printed more than ``max_print_bytes``.
PRINTS_CUT_MARKER: Final = "\n[prints truncated]"


def ledger_outcome(decision: str, outcome: str) -> str:
    """The ledger word for an audit ``(decision, outcome)`` pair (``not run`` for any other).

    Args:
        decision: the audit decision (``allow``, ``deny``, ...).
        outcome: the audit outcome of the call.

    Returns:
        The call ledger's outcome word (docs/reference/tools.md#the-call-ledger).
    """
    return AUDIT_OUTCOMES.get((decision, outcome), "not run")


@dataclass(frozen=True)
class LedgerEntry:
    """One native call: ``capability`` (the dotted name) and ``outcome`` (what became of the call:
    docs/reference/tools.md#the-call-ledger)."""

    capability: str
    outcome: str

    def to_dict(self) -> dict[str, str]:
        """The entry as ``structuredContent.calls`` carries it.

        Returns:
            ``{capability, outcome}``.
        """
        return {"capability": self.capability, "outcome": self.outcome}


@dataclass(frozen=True)
class ExecuteResult:
    """``Server.run``'s answer: ``value`` (``main()``'s plain value), ``calls`` (the call ledger) and
    ``prints`` (``None`` when the server does not keep them: ``max_print_bytes`` is 0)."""

    value: Any
    calls: tuple[LedgerEntry, ...] = ()
    prints: str | None = None
