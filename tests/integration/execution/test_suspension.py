"""Executes that wait for a person hold nothing but a record, and resume by replay
(docs/reference/authorization.md#asking-the-user), through the official MCP client on the process
runtime: accept, decline, time-out and walk-away on both protocols, and the hostile retries
(another subject's state, a state used twice or at once, a forged one, a replay that diverges, a
store filled up, a catalog that changed meanwhile).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

import codemode
from codemode.common.errors import PermissionDenied
from codemode.execution.suspension import UnknownSuspension
from codemode.mcp import StaticSubject, create_server
from codemode.store import StoreUnavailable
from codemode.store.memory import MemoryStore
from codemode_capabilities.records import RecordStore
from codemode_capabilities.records import capabilities as record_caps
from tests.support.approval import ACCEPT, AskDeletes, User, create_then_delete
from tests.support.mcp_client import error_text, execute_report, execute_value, ledger, wait_until
from tests.support.recorder import Events

ACCEPTED: dict[str, Any] = {"approve": ACCEPT}
DECLINED: dict[str, Any] = {"approve": types.ElicitResult(action="decline")}
STATE_ERROR = "unknown or expired request state"


def served(
    events: Events | None = None, records: RecordStore | None = None, extra: int = 0, **limits: Any
) -> tuple[codemode.Server, RecordStore]:
    records = records if records is not None else RecordStore()
    builder = codemode.Builder(authorizer=AskDeletes(), limits=codemode.Limits(**limits), observer=events)
    builder.register(*record_caps(records))
    for i in range(extra):  # another catalog: a capability more
        builder.register(codemode.Capability(name=f"extra.op{i}", summary="Extra.", handler=_echo))
    return builder.build(), records


@dataclasses.dataclass
class Nothing:
    pass


class DenyAll:
    def authorize(self, ctx: Any, input: codemode.authz.AuthorizationInput) -> None:
        raise codemode.authz.Denied("no")


def _echo(ctx: Any, subject: Any) -> Nothing:
    return Nothing()


def store_of(server: codemode.Server) -> Any:
    suspensions = server._executor.suspensions
    assert suspensions is not None
    return suspensions.store


def share(first: codemode.Server, second: codemode.Server) -> None:
    """Two servers on one store (replicas): the second uses the first's."""
    theirs, ours = first._executor.suspensions, second._executor.suspensions
    assert theirs is not None and ours is not None
    ours.store = theirs.store


def idle(server: codemode.Server) -> bool:
    """No worker alive and every slot free."""
    slots = server._executor.slots
    return slots.free == slots.slots and not server._executor.reaping


def mcp(server: codemode.Server, subject: str = "alice", user: Any = None, mode: str = "auto") -> Client:
    return Client(
        create_server(server, StaticSubject(subject)), mode=mode, elicitation_callback=user or User()
    )


async def ask(c: Client, source: str) -> types.InputRequiredResult:
    first = await c.session.call_tool("execute", {"source": source}, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult), first
    assert first.request_state
    return first


async def retry(c: Client, source: str, state: str | None, answer: dict[str, Any] | None = None) -> Any:
    assert state is not None
    return await c.session.call_tool(
        "execute",
        {"source": source},
        input_responses=answer if answer is not None else ACCEPTED,
        request_state=state,
        allow_input_required=True,
    )


def state_of(first: types.InputRequiredResult) -> str:
    """The request state of a first call that asked."""
    assert first.request_state is not None
    return first.request_state


def deleted(records: RecordStore, record_id: int) -> bool:
    try:
        records.get("alice", record_id)
    except Exception:
        return True
    return False


def count(records: RecordStore) -> int:
    return len(records.search("alice", None, None, None).records)


# ------------------------------------------------------------------------------------------------
# accept, decline, time-out, walk-away
# ------------------------------------------------------------------------------------------------


async def test_2026_accept_holds_no_worker_while_asked_and_replays_the_prefix_without_dispatch() -> None:
    events = Events()
    server, records = served(events, max_concurrent_executions=2, max_print_bytes=1000)
    src = (
        "def main():\n"
        '    print("before")\n'
        '    r = records.create(title="milk")\n'
        '    d = records.delete(id=r["id"])\n'
        '    print("after")\n'
        "    return d\n"
    )
    try:
        async with mcp(server) as c:
            first = await ask(c, src)
            assert await wait_until(lambda: idle(server), 30), "a worker or a slot is held while asked"
            assert await store_of(server).pending("alice") == 1
            assert count(records) == 1
            done = await retry(c, src, first.request_state)
            assert execute_value(done) == {"id": 1, "deleted": True}
            assert ledger(done) == [("records.create", "ok"), ("records.delete", "ok")]
            assert execute_report(done)["prints"] == "before\nafter\n", "the prefix's prints are shown once"
        assert count(records) == 0 and deleted(records, 1)
        assert [e.outcome for e in events.executes] == ["suspended", "ok"]
        assert await store_of(server).pending() == 0
    finally:
        await server.aclose()


async def test_2026_decline_resumes_the_program_without_the_call() -> None:
    server, records = served()
    src = (
        "def main():\n"
        '    r = records.create(title="milk")\n'
        '    d = attempt(records.delete, id=r["id"])\n'
        '    return {"deleted": d["ok"], "error": d["error"]}\n'
    )
    try:
        async with mcp(server) as c:
            first = await ask(c, src)
            done = await retry(c, src, first.request_state, DECLINED)
        assert execute_value(done) == {"deleted": False, "error": "permission denied"}
        assert ledger(done) == [("records.create", "ok"), ("records.delete", "declined")]
        assert not deleted(records, 1) and count(records) == 1
    finally:
        await server.aclose()


async def test_2026_a_question_nobody_answers_expires_and_its_record_is_gone() -> None:
    server, records = served(max_approval_time=0.5)
    src = create_then_delete()
    try:
        async with mcp(server) as c:
            first = await ask(c, src)
            store = store_of(server)
            assert await store.pending("alice") == 1
            # the host's sweep drops it (every max(1 s, max_approval_time)): the row itself is gone
            assert await wait_until(lambda: not store._suspensions, 30), "the expired record is still kept"
            assert await store.pending() == 0
            assert await store.claim(state_of(first).split(".")[0], "alice", time.time()) is None
            with pytest.raises(MCPError, match=STATE_ERROR):
                await retry(c, src, first.request_state)
        assert not deleted(records, 1)
        assert idle(server)
    finally:
        await server.aclose()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_elicitation_accept_and_decline_hold_no_worker_while_the_user_decides(mode: str) -> None:
    server, records = served(max_concurrent_executions=2)
    hold = asyncio.Event()
    user = User(hold=hold)
    try:
        async with mcp(server, user=user, mode=mode) as c:
            running = asyncio.ensure_future(c.call_tool("execute", {"source": create_then_delete()}))
            await asyncio.wait_for(user.waiting.wait(), 30)
            assert await wait_until(lambda: idle(server), 30), "a worker or a slot is held while asked"
            hold.set()
            done = await running
        assert execute_value(done) == {"id": 1, "deleted": True}
        assert ledger(done) == [("records.create", "ok"), ("records.delete", "ok")]
        assert count(records) == 0
    finally:
        hold.set()
        await server.aclose()


async def test_elicitation_walk_away_ends_the_execute_and_drops_the_record() -> None:
    """A handshake client that gives up while asked (cancels its call) ends the execute: the
    question goes, the record goes with it or expires, nothing is dispatched."""
    server, records = served(max_approval_time=1.0)
    hold = asyncio.Event()
    user = User(hold=hold)
    try:
        async with mcp(server, user=user, mode="legacy") as c:
            running = asyncio.ensure_future(c.call_tool("execute", {"source": create_then_delete()}))
            await asyncio.wait_for(user.waiting.wait(), 30)
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
        store = store_of(server)
        assert await wait_until(lambda: idle(server), 30)
        await asyncio.sleep(1.1)
        await store.expire(time.time() + 31)  # past the claim's grace too
        assert await store.pending() == 0
        assert not deleted(records, 1)
    finally:
        hold.set()
        await server.aclose()


# ------------------------------------------------------------------------------------------------
# attacks
# ------------------------------------------------------------------------------------------------


async def test_another_subject_cannot_resume_and_the_owner_still_can() -> None:
    server, records = served()
    src = create_then_delete()
    try:
        async with mcp(server) as alice, mcp(server, "mallory") as mallory:
            first = await ask(alice, src)
            with pytest.raises(MCPError, match=STATE_ERROR) as refused:
                await retry(mallory, src, first.request_state)
            assert refused.value.error.code == types.INVALID_PARAMS
            assert not deleted(records, 1)
            done = await retry(alice, src, first.request_state)
            assert execute_value(done) == {"id": 1, "deleted": True}
    finally:
        await server.aclose()


@pytest.mark.parametrize("forge", ["id", "mac", "garbage", "dots"])
async def test_a_forged_state_is_refused_with_no_detail(forge: str) -> None:
    server, records = served()
    src = create_then_delete()
    try:
        async with mcp(server) as alice:
            first = await ask(alice, src)
            record_id, mac = state_of(first).split(".")
            state: Any = {
                "id": f"{record_id[:-2]}AA.{mac}",
                "mac": f"{record_id}.{mac[:-2]}AA",
                "garbage": "x" * 5000,
                "dots": f"{record_id}.{mac}.{mac}",
            }[forge]
            with pytest.raises(MCPError) as refused:
                await retry(alice, src, state)
            assert refused.value.error.code == types.INVALID_PARAMS
            assert refused.value.error.message == STATE_ERROR and refused.value.error.data is None
            assert not deleted(records, 1)
    finally:
        await server.aclose()


async def test_the_same_answer_twice_at_once_runs_the_pending_call_once() -> None:
    """Two retries with one state race (on two servers sharing one store): one claim wins."""
    events = Events()
    records = RecordStore()
    one, _ = served(events, records)
    two, _ = served(events, records)
    share(one, two)
    src = (
        "def main():\n"
        '    r = records.create(title="milk")\n'
        '    return records.update(id=r["id"], title=r["title"] + "!")\n'
    )
    try:
        async with mcp(one) as a, mcp(two) as b:
            first = await ask(a, src)
            results = await asyncio.gather(
                retry(a, src, first.request_state), retry(b, src, first.request_state), return_exceptions=True
            )
        refused = [r for r in results if isinstance(r, MCPError)]
        done = [r for r in results if isinstance(r, types.CallToolResult)]
        assert len(refused) == 1 and refused[0].error.code == types.INVALID_PARAMS, results
        assert len(done) == 1 and execute_value(done[0])["title"] == "milk!"
        updates = [e for e in events.calls if e.capability == "records.update" and e.outcome == "ok"]
        assert len(updates) == 1, "the pending call ran once"
        assert count(records) == 1, "the replayed create was not dispatched again"
    finally:
        await one.aclose()
        await two.aclose()


async def test_a_state_cannot_be_used_again_after_its_resume() -> None:
    server, records = served()
    src = create_then_delete()
    try:
        async with mcp(server) as alice:
            first = await ask(alice, src)
            assert execute_value(await retry(alice, src, first.request_state))["deleted"] is True
            with pytest.raises(MCPError, match=STATE_ERROR):
                await retry(alice, src, first.request_state)
            with pytest.raises(MCPError, match=STATE_ERROR):  # the same state with another program
                await retry(alice, src + "# x\n", first.request_state)
        assert count(records) == 0
    finally:
        await server.aclose()


async def test_a_resumed_program_that_diverges_fails_closed_and_dispatches_nothing() -> None:
    """A replay whose program makes another call than its log (here the log says the create got
    record 2, so the program now asks to delete 2, not 1) never dispatches: the execute fails with
    ``internal failure`` and the ledger and the audit name the diverging call."""
    events = Events()
    server, records = served(events)
    src = create_then_delete()
    try:
        async with mcp(server) as alice:
            first = await ask(alice, src)
            store = store_of(server)
            record_id = state_of(first).split(".")[0]
            held = store._suspensions[record_id]
            body = json.loads(held.record.body)
            body["log"][0][3] = body["log"][0][3].replace('"id":1', '"id":2')  # another recorded result
            held.record = dataclasses.replace(held.record, body=json.dumps(body))
            done = await retry(alice, src, first.request_state)
        assert error_text(done) == "internal failure"
        assert ledger(done) == [("records.create", "ok"), ("records.delete", "replay diverged")]
        assert events.calls[-1].decision == "diverged" and events.calls[-1].outcome == "not_run"
        assert not deleted(records, 1) and count(records) == 1, "nothing was dispatched"
    finally:
        await server.aclose()


async def test_a_branch_on_a_result_that_changed_meanwhile_follows_the_recorded_result() -> None:
    """The program branches on a call's result that changes between the question and the answer:
    the replay feeds the recorded result, so it takes the same branch and runs the call the user
    approved, not another."""
    server, records = served()
    src = (
        "def main():\n"
        "    found = attempt(records.get, id=1)\n"
        '    if found["ok"]:\n'
        '        return records.update(id=1, title="changed")\n'
        "    return records.delete(id=2)\n"
    )
    try:
        async with mcp(server) as alice:
            records.create("alice", "one", None, None)
            records.delete("alice", 1)
            records.create("alice", "two", None, None)
            first = await ask(alice, src)
            (question,) = (first.input_requests or {}).values()
            assert "Capability: records.delete" in question.params.message  # type: ignore[union-attr]
            records.create("alice", "three", None, None)  # record 1 is still gone; 3 is new
            records_before = count(records)
            done = await retry(alice, src, first.request_state)
        assert execute_value(done) == {"id": 2, "deleted": True}
        assert count(records) == records_before - 1
    finally:
        await server.aclose()


async def test_a_subject_cannot_fill_the_store_and_others_are_not_held_up() -> None:
    server, _ = served(max_pending_approvals=2)
    src = create_then_delete()
    try:
        async with mcp(server) as alice, mcp(server, "bob") as bob:
            states = [await ask(alice, src), await ask(alice, src)]
            third = await alice.session.call_tool("execute", {"source": src}, allow_input_required=True)
            assert isinstance(third, types.CallToolResult) and error_text(third) == "permission denied"
            assert ledger(third)[-1] == ("records.delete", "declined")
            assert await store_of(server).pending("alice") == 2
            assert isinstance(await ask(bob, src), types.InputRequiredResult)
            assert await wait_until(lambda: idle(server), 30)
            for first in states:
                assert execute_value(await retry(alice, src, first.request_state))["deleted"] is True
    finally:
        await server.aclose()


async def test_the_recorded_bytes_of_a_subject_are_bounded() -> None:
    server, _ = served(max_suspension_bytes=12000, max_pending_approvals=5)
    src = (
        "def main():\n"
        '    r = records.create(title="t", body="x" * 4000)\n'
        '    return records.delete(id=r["id"])\n'
    )
    try:
        async with mcp(server) as alice:
            await ask(alice, src)
            over = await alice.session.call_tool("execute", {"source": src}, allow_input_required=True)
            assert isinstance(over, types.CallToolResult)
            assert error_text(over) == "resource limit exceeded: suspension bytes"
            assert await store_of(server).pending("alice") == 1
    finally:
        await server.aclose()


async def test_a_resume_on_a_server_with_another_catalog_is_declined() -> None:
    """A rolling update that changed the catalog (or an upstream's tool list): the record's pin
    differs, so the resume declines and nothing runs."""
    records = RecordStore()
    old, _ = served(records=records)
    new, _ = served(records=records, extra=1)
    share(old, new)
    src = create_then_delete()
    try:
        async with mcp(old) as a, mcp(new) as b:
            first = await ask(a, src)
            done = await retry(b, src, first.request_state)
        assert error_text(done) == "permission denied"
        assert not deleted(records, 1)
        assert await store_of(old).pending() == 0, "the record is gone"
    finally:
        await old.aclose()
        await new.aclose()


async def test_a_second_server_sharing_the_store_resumes_and_the_policy_is_asked_again() -> None:
    """Resume on another replica; a policy that now denies the pending call wins over the accept."""
    records = RecordStore()
    one, _ = served(records=records)
    two, _ = served(records=records)
    share(one, two)
    src = create_then_delete()
    try:
        async with mcp(one) as a, mcp(two) as b:
            first = await ask(a, src)
            done = await retry(b, src, first.request_state)
            assert execute_value(done) == {"id": 1, "deleted": True}
            second = await ask(a, src)
            two._executor.authorizer = DenyAll()
            denied = await retry(b, src, second.request_state)
        assert error_text(denied) == "permission denied"
        assert ledger(denied)[-1] == ("records.delete", "denied")
        assert not deleted(records, 2)
    finally:
        await one.aclose()
        await two.aclose()


async def test_the_library_resume_refuses_a_state_of_another_subject() -> None:
    server, _ = served()
    try:
        with pytest.raises(UnknownSuspension):
            await server.resume(
                "nothing.here",
                subject=codemode.Subject("alice"),
                source="def main():\n    pass\n",
                answer="accept",
            )
        assert issubclass(PermissionDenied, codemode.CodeModeError)
    finally:
        await server.aclose()


# ------------------------------------------------------------------------------------------------
# parallel(...): a batch is authorized whole before any of its calls runs; its calls are log entries
# ------------------------------------------------------------------------------------------------


async def test_a_batch_before_the_question_is_replayed_not_run_again() -> None:
    events = Events()
    server, records = served(events)
    src = (
        "def main():\n"
        '    rs = parallel([(records.create, {"title": "a"}), (records.create, {"title": "b"})])\n'
        '    return records.delete(id=rs[1]["value"]["id"])\n'
    )
    try:
        async with mcp(server) as alice:
            first = await ask(alice, src)
            assert count(records) == 2
            done = await retry(alice, src, first.request_state)
        assert execute_value(done) == {"id": 2, "deleted": True}
        assert ledger(done) == [("records.create", "ok"), ("records.create", "ok"), ("records.delete", "ok")]
        assert count(records) == 1, "the batch's creates ran once"
    finally:
        await server.aclose()


async def test_a_question_inside_a_batch_suspends_before_any_call_of_it_runs() -> None:
    """Both deletes of one batch ask: the first answer resumes and asks the second, the second runs
    the batch; a create made before the batch is replayed, never run twice, and no call of the
    batch ran before both answers."""
    server, records = served(max_pending_approvals=2)
    src = (
        "def main():\n"
        '    r = records.create(title="c")\n'
        '    rs = parallel([(records.delete, {"id": 1}), (records.get, {"id": r["id"]}), '
        '(records.delete, {"id": 2})])\n'
        '    return [x["ok"] for x in rs]\n'
    )
    try:
        async with mcp(server) as alice:
            records.create("alice", "one", None, None)
            records.create("alice", "two", None, None)
            first = await ask(alice, src)
            assert count(records) == 3, "nothing of the batch ran"
            second = await retry(alice, src, first.request_state)
            assert isinstance(second, types.InputRequiredResult), second
            (question,) = (second.input_requests or {}).values()
            assert "id: 2" in question.params.message  # type: ignore[union-attr]
            assert count(records) == 3, "nothing of the batch ran after the first answer"
            done = await retry(alice, src, second.request_state or "", DECLINED)
        assert execute_value(done) == [True, True, False]
        assert deleted(records, 1) and not deleted(records, 2) and count(records) == 2
        assert ledger(done) == [
            ("records.create", "ok"),
            ("records.delete", "ok"),
            ("records.get", "ok"),
            ("records.delete", "declined"),
        ]
    finally:
        await server.aclose()


class DownStore(MemoryStore):
    """A store that cannot answer a suspension (unreachable)."""

    async def suspend(self, record: Any, *, max_records: int, max_bytes: int) -> None:
        raise StoreUnavailable("refused")


async def test_when_the_store_cannot_answer_an_ask_declines() -> None:
    builder = codemode.Builder(authorizer=AskDeletes(), store=DownStore())
    records = RecordStore()
    builder.register(*record_caps(records))
    server = builder.build()
    try:
        async with mcp(server) as alice:
            done = await alice.session.call_tool(
                "execute", {"source": create_then_delete()}, allow_input_required=True
            )
        assert isinstance(done, types.CallToolResult)
        assert error_text(done) == "permission denied"
        assert ledger(done) == [("records.create", "ok"), ("records.delete", "declined")]
        assert not deleted(records, 1)
    finally:
        await server.aclose()


class Later:
    """An approver whose answer comes in another request (as the 2026-07-28 retry's)."""

    defers = True

    async def approve(self, request: Any) -> Any:
        return "unavailable"


async def test_the_replayed_prefix_sends_no_progress_and_its_prints_go_out_once() -> None:
    from codemode.execution.progress import reporting
    from codemode.execution.suspension import Suspended

    server, _ = served(max_print_bytes=1000)
    alice = codemode.Subject("alice")
    src = (
        "def main():\n"
        '    print("before")\n'
        '    r = records.create(title="milk")\n'
        '    d = records.delete(id=r["id"])\n'
        '    print("after")\n'
        "    return d\n"
    )
    sent: list[str] = []

    async def send(progress: float, message: str) -> None:
        sent.append(message)

    try:
        with pytest.raises(Suspended) as asked:
            async with reporting(send):
                await server.run(src, subject=alice, approver=Later())
        first = list(sent)
        assert any("before" in m for m in first), first
        sent.clear()
        state = await server.request_state(asked.value)
        async with reporting(send):
            run = await server.resume(state, subject=alice, source=src, answer="accept", approver=Later())
        assert run.prints == "before\nafter\n"
        assert not any("before" in m or "records.create" in m for m in sent), sent
        assert any("after" in m for m in sent), sent
    finally:
        await server.aclose()


async def test_the_pending_suspensions_gauge_counts_the_whole_store_and_falls_on_resume() -> None:
    """``codemode_suspensions_pending`` (the alert CodemodeSuspensionsPiling reads it): every
    subject's pending records in the store, up at each suspend, down at each resume."""
    from prometheus_client.parser import text_string_to_metric_families

    from codemode.service.metrics import Metrics

    server, _ = served(max_pending_approvals=2)
    metrics = Metrics(suspensions=server.pending_suspensions)

    def gauge() -> float:
        families = text_string_to_metric_families(metrics.render().decode())
        family = next(f for f in families if f.name == "codemode_suspensions_pending")
        return family.samples[0].value

    src = create_then_delete()
    try:
        assert server.pending_suspensions() is None and gauge() == 0
        async with mcp(server) as alice, mcp(server, "bob") as bob:
            first = await ask(alice, src)
            await ask(alice, src)
            await ask(bob, src)
            assert server.pending_suspensions() == 3 and gauge() == 3
            assert execute_value(await retry(alice, src, first.request_state))["deleted"] is True
            assert server.pending_suspensions() == 2 and gauge() == 2
    finally:
        await server.aclose()
