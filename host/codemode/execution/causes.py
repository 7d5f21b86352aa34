"""What ended an execute, for the operator (``ExecuteEvent.cause``; never shown to a client), and
what the operator is told when an execute's deadline passes before its program began: it was still
waiting for a worker slot, or for its worker to start.

The client sees ``resource limit exceeded: concurrency`` either way (docs/reference/errors.md). The
operator needs to know which wait it was: a deadline that passes while a worker starts (no warm
worker, a pool that is not warm yet) is a deadline shorter than a worker start, which more slots
(``--max-concurrent-executions``) cannot help. The host log names the wait and the setting to
change, and the execute's event carries it as its ``cause`` (the metric
``codemode_execute_limits_total{kind=...}``, docs/service.md).
"""

from __future__ import annotations

import logging
from typing import Literal

from .admission import FairAdmission

__all__ = ["QUOTA_STORE", "WAITING_FOR_SLOT", "WAITING_FOR_WORKER", "Waiting", "deadline_passed_waiting"]

log = logging.getLogger("codemode.execution")

#: What an execute waits for before its program runs.
Waiting = Literal["slot", "worker"]
#: The execute's cause when the deadline passed while it waited for a slot / for its worker.
WAITING_FOR_SLOT = "deadline_waiting_for_slot"
WAITING_FOR_WORKER = "deadline_waiting_for_worker"
#: The execute's cause when it failed closed (``internal``) because the quota store did not answer.
QUOTA_STORE = "quota_store"


def deadline_passed_waiting(waiting: Waiting, deadline: float, slots: FairAdmission) -> str:
    """Log (warning) which wait the deadline passed in and what to change; return the cause.

    Args:
        waiting: ``slot`` (no slot was free) or ``worker`` (it had a slot; its worker was starting).
        deadline: ``max_execution_time`` in seconds.
        slots: the server's slots (how many are held and waited for now is logged).

    Returns:
        :data:`WAITING_FOR_SLOT` or :data:`WAITING_FOR_WORKER`.
    """
    if waiting == "worker":
        log.warning(
            "an execute's deadline (%gs, --max-execution-time / CODEMODE_MAX_EXECUTION_TIME) passed "
            "while its worker was starting: it had a slot, no warm worker was ready, and a worker "
            "start took longer than the deadline. The deadline is what is short, not the slots: "
            "raise --max-execution-time (codemode quotas tune measures it, a start included) or keep "
            "workers warm (--pool / CODEMODE_POOL); the client was told "
            "'resource limit exceeded: concurrency'",
            deadline,
        )
        return WAITING_FOR_WORKER
    # Free slots it could not take are the reserve for subjects with none in flight; free slots
    # beyond the reserve (or with no reserve) came free as the deadline passed: the slots it waited
    # for were held until then, so the line names them.
    if 0 < slots.free <= slots.reserved:
        log.warning(
            "an execute's deadline (%gs, --max-execution-time / CODEMODE_MAX_EXECUTION_TIME) passed "
            "while it waited for a worker slot: %d of %d slots were held and the %d free were kept for "
            "subjects with nothing in flight (--reserved-slots / CODEMODE_RESERVED_SLOTS), while its "
            "subject already held one (docs/service.md, 'Fair slots'); %d other(s) waiting. The reserve "
            "keeps one tenant from taking every slot: raise --max-execution-time if a tenant's executes "
            "may queue longer; the client was told 'resource limit exceeded: concurrency'",
            deadline,
            slots.slots - slots.free,
            slots.slots,
            slots.free,
            slots.waiting,
        )
        return WAITING_FOR_SLOT
    log.warning(
        "an execute's deadline (%gs, --max-execution-time / CODEMODE_MAX_EXECUTION_TIME) passed while "
        "it waited for a worker slot: %d of %d slots (--max-concurrent-executions / "
        "CODEMODE_MAX_CONCURRENT_EXECUTIONS) were held, %d other(s) waiting. Executes queue for slots "
        "within their deadline: raise --max-execution-time if executes may queue longer, or the slots "
        "if the host has room for more workers at once; the client was told "
        "'resource limit exceeded: concurrency'",
        deadline,
        slots.slots - slots.free,
        slots.slots,
        slots.waiting,
    )
    return WAITING_FOR_SLOT
