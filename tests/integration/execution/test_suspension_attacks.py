"""Hostile review of suspended executes ('Done when'): the attacks the first tests did not
cover, through the official MCP client on the process runtime (tests/integration/execution/test_suspension.py
has the rest: another subject's state, a forged or reused state, two answers at once, a diverging
replay, a filled store, another catalog, a policy that now denies).

- A client that walks away leaves a record that must be gone once its time has passed, whether or
  not anything else happens on the host afterwards: the row is gone from the SQLite table (before
  9cf3d51 only the next suspension swept, so on a quiet host the record, with the handler results it
  holds, stayed in the store for ever), also when the host that wrote it stopped (before, the
  next host swept only once it suspended something).
- A replay feeds back what could differ between runs (hash(), dict order, floats, attempt errors,
  prints, a mutated result) and counts steps near the limit once.
- A ``request_state`` that is not this subject's own live one is one and the same error, whatever it
  is: truncated, the record id alone, empty, a valid state of another store (another
  signing key), another subject's valid state, a state after a decline or after expiry.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

import codemode
from codemode.store.postgres import PostgresStore
from codemode.store.sqlite import SqliteStore
from codemode_capabilities.records import RecordStore
from codemode_capabilities.records import capabilities as record_caps
from tests.integration.execution.test_suspension import (
    DECLINED,
    STATE_ERROR,
    ask,
    deleted,
    mcp,
    retry,
    served,
    share,
    store_of,
)
from tests.support import postgres
from tests.support.approval import AskDeletes, create_then_delete
from tests.support.mcp_client import error_text, execute_report, execute_value, ledger, wait_until


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        (n,) = db.execute("SELECT count(*) FROM codemode_suspensions").fetchone()
    return int(n)


async def test_a_walked_away_record_leaves_no_row_in_the_sqlite_table(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    records = RecordStore()
    builder = codemode.Builder(
        authorizer=AskDeletes(), limits=codemode.Limits(max_approval_time=0.5), store=SqliteStore(path)
    )
    builder.register(*record_caps(records))
    server = builder.build()
    try:
        async with mcp(server) as alice:
            await ask(alice, create_then_delete())
            assert _rows(path) == 1
            assert await wait_until(lambda: _rows(path) == 0, 10), "the row outlived its expiry"
    finally:
        await server.aclose()


@pytest.mark.parametrize(
    "forge", ["truncated", "record id alone", "empty", "another store", "another subject"]
)
async def test_every_state_not_ones_own_is_the_same_error(forge: str) -> None:
    server, records = served()
    other, _ = served(records=records)  # another store, so another signing key
    src = create_then_delete()
    try:
        async with mcp(server) as alice, mcp(server, "bob") as bob, mcp(other) as elsewhere:
            first = await ask(alice, src)
            theirs = await ask(bob, src)
            foreign = await ask(elsewhere, src)
            state = first.request_state
            assert state
            sent = {
                "truncated": state[:-5],
                "record id alone": state.split(".")[0],
                "empty": "",
                "another store": foreign.request_state,
                "another subject": theirs.request_state,
            }[forge]
            with pytest.raises(MCPError) as refused:
                await retry(alice, src, sent)
            assert refused.value.error.code == types.INVALID_PARAMS
            assert refused.value.error.message == STATE_ERROR and refused.value.error.data is None
            assert await store_of(server).pending("alice") == 1, "the own record is untouched"
            assert await store_of(server).pending("bob") == 1
    finally:
        await server.aclose()
        await other.aclose()


async def test_a_state_after_its_decline_is_the_same_error() -> None:
    server, records = served()
    src = (
        "def main():\n"
        '    r = records.create(title="milk")\n'
        '    return attempt(records.delete, id=r["id"])["ok"]\n'
    )
    try:
        async with mcp(server) as alice:
            first = await ask(alice, src)
            done: Any = await retry(alice, src, first.request_state, DECLINED)
            assert isinstance(done, types.CallToolResult)
            with pytest.raises(MCPError, match=STATE_ERROR):
                await retry(alice, src, first.request_state)
        assert not deleted(records, 1), "the declined delete never ran, not even on the second retry"
    finally:
        await server.aclose()


async def test_a_record_left_by_a_host_that_stopped_is_gone_after_its_time(tmp_path: Path) -> None:
    """A host stops (a restart, a rolling update) while a question waits and nobody retries: the
    next host on the same store, which only runs executes that ask nothing, still drops the row at
    its time."""
    path = tmp_path / "store.sqlite3"

    def build() -> codemode.Server:
        builder = codemode.Builder(
            authorizer=AskDeletes(), limits=codemode.Limits(max_approval_time=0.5), store=SqliteStore(path)
        )
        builder.register(*record_caps(RecordStore()))
        return builder.build()

    before = build()
    try:
        async with mcp(before) as alice:
            await ask(alice, create_then_delete())
    finally:
        await before.aclose()
    assert _rows(path) == 1
    after = build()
    try:
        async with mcp(after) as alice:
            plain = 'def main():\n    return records.create(title="x")["id"]\n'
            done = await alice.session.call_tool("execute", {"source": plain})
            assert not done.is_error
            assert await wait_until(lambda: _rows(path) == 0, 10), "the row outlived its expiry"
    finally:
        await after.aclose()


def _loops(after: int) -> str:
    return (
        "def main():\n"
        "    x = 0\n"
        "    for i in range(6000):\n"
        "        x += i\n"
        '    r = records.create(title="t")\n'
        '    records.delete(id=r["id"])\n'
        f"    for i in range({after}):\n"
        "        x += i\n"
        "    return x\n"
    )


@pytest.mark.parametrize(("after", "ends"), [(3000, "ok"), (6000, "steps")])
async def test_steps_near_the_limit_count_once_across_the_replay(after: int, ends: str) -> None:
    """max_execution_steps 10,000: 6,000 steps before the question and 3,000 after fit in one
    execute (the replay re-counts the prefix, it does not add it twice); 6,000 after do not."""
    server, records = served(max_execution_steps=10000)
    src = _loops(after)
    try:
        async with mcp(server) as alice:
            first = await ask(alice, src)
            done = await retry(alice, src, first.request_state)
        if ends == "ok":
            assert execute_value(done) == sum(range(6000)) + sum(range(after))
        else:
            assert error_text(done).startswith("resource limit exceeded"), error_text(done)
        assert deleted(records, 1), "the approved delete ran once, whatever the end"
    finally:
        await server.aclose()


async def test_what_could_differ_between_runs_replays_the_same() -> None:
    """hash() of strings, iteration over a result's dict and a dict built from it, float arithmetic,
    an error caught by attempt, prints and a result the program mutates: the resumed run makes the
    same calls with the same arguments (else it would fail closed), and the approved update gets the
    text the first run computed."""
    server, records = served(max_print_bytes=10000)
    src = (
        "def main():\n"
        '    r = records.create(title="milk", body="b")\n'
        '    r["title"] = r["title"] + "!"\n'
        "    seen = {}\n"
        "    for k in r:\n"
        "        seen[k] = hash(str(k))\n"
        "    f = 0.1 * 3 / 7 + 1e-300 * 1e300\n"
        "    missing = attempt(records.get, id=99)\n"
        '    print(seen, f, missing["error"])\n'
        '    text = "%s|%s|%s|%s" % (r["title"], seen, f, missing["error"])\n'
        '    return records.update(id=r["id"], title=text)["title"]\n'
    )
    try:
        async with mcp(server) as alice:
            first = await ask(alice, src)
            done = await retry(alice, src, first.request_state)
        title = execute_value(done)
        seen = (
            '{"body": 3029410, "created_at": 1369680106, "id": 3355, "tags": 3552281, '
            '"title": 110371416, "updated_at": -295464393}'
        )  # Java's String.hashCode of each key, in the result's key order
        assert title == f"milk!|{seen}|1.042857142857143|capability failed: record 99 not found"
        assert records.get("alice", 1).title == title
        assert [name for name, _ in ledger(done)] == ["records.create", "records.get", "records.update"]
        assert execute_report(done)["prints"].count("\n") == 1, "the prefix's print is shown once"
    finally:
        await server.aclose()


async def test_postgresql_gone_between_the_question_and_the_answer_fails_closed(postgres_dsn: str) -> None:
    """PostgreSQL stops after the question: the retry dispatches nothing and is an internal failure
    (not a hang), a new ask declines at once; PostgreSQL back, the same retry resumes and the pending
    delete runs once."""
    postgres.reset(postgres_dsn)
    relay = postgres.Relay(postgres_dsn)
    through = await relay.start()
    records = RecordStore()
    builder = codemode.Builder(authorizer=AskDeletes(), store=PostgresStore(through, timeout=1.0))
    builder.register(*record_caps(records))
    server = builder.build()
    src = create_then_delete()
    try:
        async with mcp(server) as alice:
            first = await ask(alice, src)
            await relay.cut()
            down: Any = await retry(alice, src, first.request_state)
            assert isinstance(down, types.CallToolResult) and error_text(down) == "internal failure"
            asked = await alice.session.call_tool("execute", {"source": src}, allow_input_required=True)
            assert isinstance(asked, types.CallToolResult), "no question is asked without a store"
            assert error_text(asked) == "permission denied"
            assert ledger(asked)[-1] == ("records.delete", "declined")
            assert not deleted(records, 1) and not deleted(records, 2)
            await relay.start(relay.port)
            done: Any = None
            async with asyncio.timeout(30):  # the pool reconnects with a back-off
                while done is None:
                    done = await retry(alice, src, first.request_state)
                    if isinstance(done, types.CallToolResult) and done.is_error:
                        assert error_text(done) == "internal failure"
                        done = None
                        await asyncio.sleep(0.2)
            assert execute_value(done) == {"id": 1, "deleted": True}
            assert deleted(records, 1) and not deleted(records, 2)
        assert postgres.query(postgres_dsn, "SELECT count(*) FROM codemode_suspensions") == [(0,)]
    finally:
        await server.aclose()
        await relay.cut()


async def test_a_decline_wins_over_a_policy_that_now_allows() -> None:
    """Between the question and the answer the policy stops asking (allows everything): the user's
    decline still decides the pending call, and the replayed create is not run again."""
    records = RecordStore()
    one, _ = served(records=records)
    two, _ = served(records=records)
    share(one, two)
    two._executor.authorizer = codemode.authz.allow_all()
    src = (
        "def main():\n"
        '    r = records.create(title="milk")\n'
        '    return attempt(records.delete, id=r["id"])["ok"]\n'
    )
    try:
        async with mcp(one) as a, mcp(two) as b:
            first = await ask(a, src)
            done = await retry(b, src, first.request_state or "", DECLINED)
        assert execute_value(done) is False
        assert ledger(done) == [("records.create", "ok"), ("records.delete", "declined")]
        assert not deleted(records, 1) and len(records.search("alice", None, None, None).records) == 1
    finally:
        await one.aclose()
        await two.aclose()
