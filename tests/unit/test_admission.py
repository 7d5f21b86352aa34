"""Fair admission to worker slots (codemode.execution.admission): newcomers first, reserved slots."""

from __future__ import annotations

import asyncio

import pytest

from codemode.execution.admission import FairAdmission, default_reserve


def test_default_reserve() -> None:
    assert [default_reserve(n) for n in (1, 2, 3, 4, 8, 16)] == [0, 1, 1, 1, 2, 4]


def test_bad_reserve_is_refused() -> None:
    with pytest.raises(ValueError, match="fewer than the slots"):
        FairAdmission(4, 4)
    with pytest.raises(ValueError, match="at least 1"):
        FairAdmission(0)


async def test_greedy_subjects_leave_the_reserve_to_newcomers() -> None:
    adm = FairAdmission(8, 2)
    for _ in range(4):
        await adm.acquire("a")
    await adm.acquire("b")
    await adm.acquire("b")
    # b already holds slots and only the 2 reserved are free: b waits ...
    third_b = asyncio.ensure_future(adm.acquire("b"))
    await asyncio.sleep(0)
    assert not third_b.done() and adm.free == 2
    # ... while a newcomer gets a slot at once.
    await asyncio.wait_for(adm.acquire("c"), 1)
    assert adm.held == {"a": 4, "b": 2, "c": 1}
    third_b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await third_b
    assert adm.waiting == 0


async def test_a_freed_slot_goes_to_the_subject_holding_the_fewest() -> None:
    adm = FairAdmission(2, 0)
    await adm.acquire("a")
    await adm.acquire("b")
    order: list[str] = []

    async def take(subject: str) -> None:
        await adm.acquire(subject)
        order.append(subject)

    tasks = [asyncio.ensure_future(take(s)) for s in ("a", "a", "c")]
    await asyncio.sleep(0)
    adm.release("b")  # a holds 1, c holds 0: c goes first although both a came earlier
    await asyncio.sleep(0)
    assert order == ["c"]
    adm.release("a")  # a now holds 0, c holds 1: a's first waiter
    await asyncio.sleep(0)
    assert order == ["c", "a"]
    adm.release("c")
    await asyncio.gather(*tasks)
    assert order == ["c", "a", "a"]


async def test_fifo_mode_is_plain_first_come_first_served() -> None:
    adm = FairAdmission(1, fair=False)
    await adm.acquire("a")
    order: list[str] = []

    async def take(subject: str) -> None:
        await adm.acquire(subject)
        order.append(subject)
        adm.release(subject)

    tasks = [asyncio.ensure_future(take(s)) for s in ("a", "a", "c")]
    await asyncio.sleep(0)
    adm.release("a")
    await asyncio.gather(*tasks)
    assert order == ["a", "a", "c"]


async def test_release_of_an_unheld_slot_is_an_error() -> None:
    adm = FairAdmission(2)
    with pytest.raises(RuntimeError):
        adm.release("nobody")
