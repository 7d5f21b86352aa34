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


async def test_a_waiter_whose_deadline_passes_as_a_slot_frees_takes_nothing() -> None:
    # An execute's deadline (asyncio.timeout) cancels its task, which cancels the
    # future it waits on at once; its ``except`` branch runs only on the task's next step. A slot
    # freed in between was granted to that cancelled waiter: ``set_result`` raised
    # InvalidStateError into whoever released (the client got ``internal failure``), and the slot
    # stayed counted as held by the waiter's subject for good.
    adm = FairAdmission(1, 0)
    await adm.acquire("a")
    waiter = asyncio.ensure_future(adm.acquire("b"))
    await asyncio.sleep(0)
    assert adm.waiting == 1
    waiter.cancel()  # what b's deadline does ...
    adm.release("a")  # ... and a's slot comes back in the same loop iteration
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (adm.free, adm.held, adm.waiting) == (1, {}, 0)


async def test_no_slot_is_lost_when_waiters_are_cancelled_as_slots_free() -> None:
    # A burst of 8 executes on 4 slots, 8 subjects: 4 hold slots, 4 wait. In each round every
    # waiter's deadline passes in the very iteration in which every holder gives its slot back.
    adm = FairAdmission(4, 1)
    for _ in range(5):
        holders = [f"h{i}" for i in range(4)]
        for subject in holders:
            await adm.acquire(subject)
        waiters = [asyncio.ensure_future(adm.acquire(f"w{i}")) for i in range(4)]
        await asyncio.sleep(0)
        assert adm.waiting == 4 and adm.free == 0
        for task in waiters:
            task.cancel()
        for subject in holders:
            adm.release(subject)
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results), results
        assert (adm.free, adm.held, adm.waiting) == (4, {}, 0)
    # Every later acquire is admitted at once (no waiting for a slot nobody will give back).
    later = [asyncio.ensure_future(adm.acquire(f"s{i}")) for i in range(4)]
    await asyncio.sleep(0)
    assert all(task.done() and task.exception() is None for task in later)
    assert adm.free == 0 and adm.held == {f"s{i}": 1 for i in range(4)}
