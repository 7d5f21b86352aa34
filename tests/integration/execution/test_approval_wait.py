"""One execute may not wait for hours by asking again and again (the
wait holds no worker, only a record), through the official MCP client's elicitation callback.

A program catches each decline with ``attempt`` and asks again; its user never answers. Each
question closes at ``max_approval_time``, and before ``max_approval_wait`` nothing bounded their
sum: the worker and its slot stayed held for questions × ``max_approval_time`` (measured: a 1 s
execute held its worker 24 s, 12 questions × 2 s). Now the whole execute waits at most
``max_approval_wait`` for answers, then ends with ``resource limit exceeded: approval wait``
(docs/reference/authorization.md#asking-the-user). Where the transport says the client is gone
(a closed stream or session, stdio EOF), the execute ends at once.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import codemode
from codemode.execution.limits import Limits
from tests.integration.execution.test_approval import Events, client, served
from tests.support.approval import User
from tests.support.mcp_client import call, error_text, execute_value, ledger, wait_until

MODES = pytest.mark.parametrize("mode", ["legacy", "auto"])
QUESTIONS = 20
APPROVAL_TIME = 0.3
APPROVAL_WAIT = 1.0


class Executes(Events):
    """Records the execute events too (outcome, limit kind through the error text, seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.executes: list[codemode.ExecuteEvent] = []

    def execute_outcome(self, event: codemode.ExecuteEvent) -> None:
        self.executes.append(event)


def asks_again(times: int = QUESTIONS) -> str:
    return (
        "def main():\n"
        '    r = records.create(title="a")\n'
        f"    for i in range({times}):\n"
        '        attempt(records.delete, id=r["id"])\n'
        "    return 1\n"
    )


async def test_asking_again_and_again_ends_at_max_approval_wait_holding_no_worker() -> None:
    """The handshake protocol (the question rides the open call): each question suspends the
    execute (no worker, no slot), closes unanswered at max_approval_time, and the replayed program
    asks again, until the execute's total wait is spent."""
    events = Executes()
    server, store = served(
        events,
        max_execution_time=1.0,
        max_approval_time=APPROVAL_TIME,
        max_approval_wait=APPROVAL_WAIT,
        max_concurrent_executions=1,
    )
    hold = asyncio.Event()  # never set: nobody answers
    user = User(hold=hold)
    try:
        async with client(server, user) as c, client(server, User(), subject="bob") as other:
            started = time.monotonic()
            pending = asyncio.ensure_future(call(c, "execute", source=asks_again()))
            await asyncio.wait_for(user.waiting.wait(), 30)
            # the only slot is free while the user is asked
            assert execute_value(await call(other, "execute", source="def main():\n    return 7\n")) == 7
            result = await pending
            took = time.monotonic() - started
            asked = [e.approval for e in events.calls if e.approval]
            print(f"\n[legacy] {len(user.asked)} questions in {took:.2f} s")
            assert asked == ["unanswered"] * len(asked)
            assert 3 <= len(user.asked) <= 5 < QUESTIONS, user.asked
            assert error_text(result) == "resource limit exceeded: approval wait"
            assert ledger(result)[-1] == ("records.delete", "not run")
            assert [o for _, o in ledger(result)[1:-1]] == ["declined"] * (len(user.asked) - 1)
            assert events.executes[-1].outcome == "resource_limit"
            assert took < QUESTIONS * APPROVAL_TIME / 2, took
            assert store.get("alice", 1).id == 1, "the delete never ran"
    finally:
        hold.set()
        await server.aclose()


async def test_on_the_2026_protocol_a_question_holds_nothing_and_its_record_expires() -> None:
    events = Executes()
    server, store = served(events, max_approval_time=APPROVAL_TIME, max_concurrent_executions=1)
    hold = asyncio.Event()
    user = User(hold=hold)
    try:
        async with client(server, user, "auto") as c, client(server, User(), "auto", subject="bob") as other:
            pending = asyncio.ensure_future(call(c, "execute", source=asks_again()))
            await asyncio.wait_for(user.waiting.wait(), 30)
            assert [e.outcome for e in events.executes] == ["suspended"]
            assert execute_value(await call(other, "execute", source="def main():\n    return 7\n")) == 7
            pending.cancel()  # the client walks away: nothing tells the host; the record expires
            records = server._executor.suspensions.store  # type: ignore[union-attr]
            await asyncio.sleep(APPROVAL_TIME)
            await records.expire(time.time())
            assert await records.pending() == 0
            assert store.get("alice", 1).id == 1, "the delete never ran"
    finally:
        hold.set()
        await server.aclose()


async def test_the_wait_is_counted_per_execute_not_per_question() -> None:
    """Answered questions count too: quick answers leave the program its total, slow ones spend it."""
    events = Executes()
    server, _ = served(events, max_approval_time=5.0, max_approval_wait=1.0)
    user = User(delay=0.4)  # accepts each after 0.4 s
    try:
        async with client(server, user) as c:
            result = await call(c, "execute", source=asks_again(5))
        assert error_text(result) == "resource limit exceeded: approval wait"
        # two deletes approved (0.8 s: the second finds the record gone), the third question ran out
        # of the total at 1.0 s
        assert [o for _, o in ledger(result)] == ["ok", "ok", "failed", "not run"]
        assert len(user.asked) == 3
    finally:
        await server.aclose()


async def test_a_client_that_leaves_while_asked_frees_the_worker_at_once() -> None:
    """The handshake protocol: the question rides the open call, so a closed stream ends the execute
    at once (long before max_approval_time or max_approval_wait)."""
    events = Executes()
    server, _ = served(events, max_approval_time=30.0, max_approval_wait=60.0, max_concurrent_executions=1)
    hold = asyncio.Event()
    user = User(hold=hold)
    try:
        async with client(server, user) as c:
            pending = asyncio.ensure_future(call(c, "execute", source=asks_again()))
            await asyncio.wait_for(user.waiting.wait(), 30)
            left = time.monotonic()
        records = server._executor.suspensions.store  # type: ignore[union-attr]
        assert await wait_until(lambda: not server._executor.reaping, 30)
        assert events.executes[0].outcome == "suspended", "the worker went when it asked"
        assert await wait_until(lambda: events.executes[-1].outcome in ("suspended", "cancelled"), 30)
        pending.cancel()
        assert await records.pending() == 0, "the record went with the client"
        assert time.monotonic() - left < 10
        async with client(server, User(), subject="bob") as other:
            assert execute_value(await call(other, "execute", source="def main():\n    return 7\n")) == 7
    finally:
        hold.set()
        await server.aclose()


def test_the_limit_has_a_default_and_a_minimum() -> None:
    assert Limits().max_approval_wait == 3600.0
    assert Limits(max_approval_wait=0.0).problems() == [
        "limits: max_approval_wait must be more than 0 (leave it out for the default, 3600.0)"
    ]
