"""What the operator is told when an execute's deadline passed before its program began
(codemode.execution.causes): the wait is named, and the setting to change is the one that is
short. The slots are the real fair admission, in the state the deadline found them."""

from __future__ import annotations

import asyncio
import logging

import pytest

from codemode.execution.admission import FairAdmission
from codemode.execution.causes import WAITING_FOR_SLOT, WAITING_FOR_WORKER, deadline_passed_waiting


def _said(caplog: pytest.LogCaptureFixture) -> str:
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    return record.getMessage()


def test_a_worker_start_names_the_deadline_not_the_slots(caplog: pytest.LogCaptureFixture) -> None:
    slots = FairAdmission(8)
    with caplog.at_level(logging.WARNING, logger="codemode.execution"):
        assert deadline_passed_waiting("worker", 0.1, slots) == WAITING_FOR_WORKER
    line = _said(caplog)
    assert "(0.1s, --max-execution-time / CODEMODE_MAX_EXECUTION_TIME)" in line
    assert "while its worker was starting" in line and "--pool / CODEMODE_POOL" in line
    assert "The deadline is what is short, not the slots" in line
    assert "--max-concurrent-executions" not in line


async def test_full_slots_name_the_slots_and_the_deadline(caplog: pytest.LogCaptureFixture) -> None:
    slots = FairAdmission(2, reserved=0)
    await slots.acquire("a")
    await slots.acquire("b")
    waiter = asyncio.ensure_future(slots.acquire("c"))
    await asyncio.sleep(0)  # c is queued
    with caplog.at_level(logging.WARNING, logger="codemode.execution"):
        assert deadline_passed_waiting("slot", 2.0, slots) == WAITING_FOR_SLOT
    waiter.cancel()
    line = _said(caplog)
    assert "2 of 2 slots (--max-concurrent-executions / CODEMODE_MAX_CONCURRENT_EXECUTIONS)" in line
    assert "1 other(s) waiting" in line and "--max-execution-time" in line


async def test_a_wait_for_the_reserve_names_the_reserve_not_the_slots(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Free slots kept for newcomers: more slots are not what this execute lacked."""
    slots = FairAdmission(8, reserved=2)
    for _ in range(6):
        await slots.acquire("greedy")
    with caplog.at_level(logging.WARNING, logger="codemode.execution"):
        assert deadline_passed_waiting("slot", 1.0, slots) == WAITING_FOR_SLOT
    line = _said(caplog)
    assert "6 of 8 slots were held and the 2 free were kept" in line
    assert "--reserved-slots / CODEMODE_RESERVED_SLOTS" in line
    assert "--max-concurrent-executions" not in line


async def test_a_slot_freed_as_the_deadline_passed_does_not_blame_an_absent_reserve(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The holder gave its slot back just as the waiter's deadline passed (seen by a
    new-user run with --reserved-slots 0): the line names the slots, never a reserve of 0."""
    slots = FairAdmission(1, reserved=0)
    await slots.acquire("a")
    slots.release("a")  # free again by the time the waiter's deadline is logged
    with caplog.at_level(logging.WARNING, logger="codemode.execution"):
        assert deadline_passed_waiting("slot", 0.05, slots) == WAITING_FOR_SLOT
    line = _said(caplog)
    assert "--reserved-slots" not in line
    assert "--max-concurrent-executions / CODEMODE_MAX_CONCURRENT_EXECUTIONS" in line
