"""Hostile review of ``parallel(...)``: a tenant trying to take the handler threads
another tenant needs, by ways the batch's own share did not see: handlers its deadline gave up on
(still running in their threads), single calls of its other executes beside a batch, and two tenants'
shares together; and a question inside a batch over MCP (2026-07-28), whose calls run once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import mcp_types as types
from mcp import Client, StdioServerParameters

from codemode import authz
from codemode.common.errors import client_text
from codemode.execution.parallel import handler_share
from tests.integration.execution.test_parallel import BOB, program, run, served
from tests.integration.mcp.test_approval_served import child_env, stdio_argv
from tests.support.approval import ACCEPT, User
from tests.support.mcp_client import execute_value, ledger, wait_until
from tests.support.recorder import ALICE

CAROL = authz.Subject("carol")


async def test_handlers_a_deadline_gave_up_on_still_count_against_the_subjects_share() -> None:
    """Alice's batch of blocking sync handlers ends at her deadline; its handlers keep their threads
    (a thread cannot be stopped). Her next execute must not take another share on top of them."""
    server, _, gates = served(max_parallel_calls=32, max_execution_time=5.0)
    threads = server._executor.handler_threads
    share = handler_share(threads, 32)
    hog = program(f'parallel([(gate.hold, {{"value": str(i)}}) for i in range({threads + 2})])')
    try:
        for _ in range(2):
            ended = await run(server, hog)
            assert client_text(ended) == "resource limit exceeded: time"
        assert gates.holding == share < threads  # the first execute's handlers, still running
        other = await run(server, program('gate.quick(value="bob")'), BOB)
        assert not isinstance(other, Exception), repr(other)
        assert other.value == {"value": "bob"}
    finally:
        gates.release.set()
        await server.aclose()


async def test_single_calls_of_other_executes_count_against_the_subjects_share() -> None:
    """One execute's batch holds Alice's share; her other executes' single blocking calls must not
    take the rest of the pool beside it."""
    server, _, gates = served(max_parallel_calls=32, max_execution_time=30.0)
    threads = server._executor.handler_threads
    share = handler_share(threads, 32)
    batch = program(f'parallel([(gate.hold, {{"value": str(i)}}) for i in range({threads + 2})])')
    hogs = [asyncio.ensure_future(run(server, batch))]
    try:
        assert await wait_until(lambda: gates.holding >= share)
        hogs += [asyncio.ensure_future(run(server, program('gate.hold(value="s")'))) for _ in range(threads)]
        await asyncio.sleep(0)
        other = await asyncio.wait_for(run(server, program('gate.quick(value="bob")'), BOB), 20)
        assert other.value == {"value": "bob"}
        assert gates.holding == share  # all of Alice's blocking calls together
    finally:
        gates.release.set()
        results = await asyncio.gather(*hogs)
        await server.aclose()
    assert len(results[0].value) == threads + 2
    assert all(r.value == {"value": "s"} for r in results[1:])


async def test_two_tenants_together_leave_a_third_a_handler_thread() -> None:
    """Each of two subjects holds its share (half the pool) with a batch of blocking handlers: a
    third subject's sync call must still get a thread."""
    server, _, gates = served(max_parallel_calls=32, max_execution_time=30.0)
    threads = server._executor.handler_threads
    batch = program(f'parallel([(gate.hold, {{"value": str(i)}}) for i in range({threads + 2})])')
    hogs = [asyncio.ensure_future(run(server, batch, who)) for who in (ALICE, CAROL)]
    try:
        assert await wait_until(lambda: gates.holding >= threads - 1)
        other = await asyncio.wait_for(run(server, program('gate.quick(value="bob")'), BOB), 20)
        assert other.value == {"value": "bob"}
        assert gates.holding == threads - 1  # the last thread is kept for a subject holding none
    finally:
        gates.release.set()
        results = await asyncio.gather(*hogs)
        await server.aclose()
    assert all(len(r.value) == threads + 2 for r in results)


async def test_a_question_inside_a_batch_over_mcp_runs_no_call_twice(tmp_path: Path) -> None:
    """The official client on 2026-07-28 against ``serve --stdio`` (asking Rego policy, SQLite
    store): a batch with a delete the user must answer, between a create before it and creates in
    it. The first answer is a question and no call of the batch has run; the retry with the accept
    runs the batch once, and the create before it is replayed, not run again."""
    data = tmp_path / "data"
    data.mkdir()
    src = (
        "def main():\n"
        '    first = records.create(title="before")\n'
        '    rs = parallel([(records.create, {"title": "in"}), (records.delete, {"id": first["id"]}),'
        ' (records.create, {"title": "in too"})])\n'
        "    return [first, rs]\n"
    )
    argv = stdio_argv(tmp_path, "--data-dir", str(data), "--store", "sqlite")
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=child_env())
    async with Client(params, mode="auto", elicitation_callback=User()) as client:
        first = await client.session.call_tool("execute", {"source": src}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult) and first.request_state
        probe = await client.call_tool("execute", {"source": "def main():\n    return records.search()\n"})
        assert [r["title"] for r in execute_value(probe)["records"]] == ["before"], "nothing of the batch ran"
        done = await client.session.call_tool(
            "execute",
            {"source": src},
            input_responses={"approve": ACCEPT},
            request_state=first.request_state,
            allow_input_required=True,
        )
        assert isinstance(done, types.CallToolResult)
        value = execute_value(done)
        assert value[0]["id"] == 1 and [r["ok"] for r in value[1]] == [True, True, True]
        assert ledger(done) == [
            ("records.create", "ok"),
            ("records.create", "ok"),
            ("records.delete", "ok"),
            ("records.create", "ok"),
        ]
        after = await client.call_tool("execute", {"source": "def main():\n    return records.search()\n"})
        assert sorted(r["title"] for r in execute_value(after)["records"]) == ["in", "in too"]
        make = 'def main():\n    return records.create(title="x")\n'
        again = await client.call_tool("execute", {"source": make})
        assert execute_value(again)["id"] == 4, "three records were ever created: none twice"
