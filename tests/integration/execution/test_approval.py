"""Approval by policy, asked of the user, through the official MCP client's elicitation
callback, in memory, in both client modes: ``legacy`` (the initialize handshake over JSON-RPC
streams: the question is an ``elicitation/create`` server request) and ``auto`` (the 2026-07-28
per-request path: the question is an ``InputRequiredResult`` and the client's retry carries the
answer back to the same, still running, execute).

docs/reference/authorization.md#asking-the-user is the contract: only an explicit accept runs the
call; a decline, a cancel, no answer within ``max_approval_time``, a client that cannot be asked and
a subject with ``max_pending_approvals`` questions already open all deny it (ledger ``declined``,
client text ``permission denied``); the wait does not spend ``max_execution_time``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

import codemode
from codemode import authz
from codemode.execution.admission import default_reserve
from codemode.execution.approval import MAX_MESSAGE_BYTES
from codemode.mcp import StaticSubject, create_server
from codemode_capabilities.records import RecordStore
from codemode_capabilities.records import capabilities as record_caps
from tests.support.approval import ACCEPT, AskDeletes, User, create_then_delete
from tests.support.mcp_client import call, error_text, execute_report, execute_value, ledger, wait_until
from tests.support.recorder import Events


def served(events: Events | None = None, **limits: Any) -> tuple[codemode.Server, RecordStore]:
    store = RecordStore()
    slots = limits.get("max_concurrent_executions", 8)
    quota = min(4, slots - default_reserve(slots))  # at most what one subject can ever hold
    builder = codemode.Builder(
        authorizer=AskDeletes(), limits=codemode.Limits(**limits), observer=events, subject_quota=quota
    )
    builder.register(*record_caps(store))
    return builder.build(), store


MODES = pytest.mark.parametrize("mode", ["legacy", "auto"])


def client(server: codemode.Server, user: Any, mode: str = "legacy", subject: str = "alice") -> Client:
    return Client(create_server(server, StaticSubject(subject)), mode=mode, elicitation_callback=user)


@MODES
async def test_an_explicit_accept_runs_the_call_and_the_user_sees_a_host_built_question(mode: str) -> None:
    events = Events()
    server, _ = served(events)
    user = User()
    try:
        async with client(server, user, mode) as c:
            result = await call(c, "execute", source=create_then_delete())
        assert execute_value(result) == {"id": 1, "deleted": True}
        assert ledger(result) == [("records.create", "ok"), ("records.delete", "ok")]
        (message,) = user.messages
        assert "Capability: records.delete\n" in message
        assert "What it does: Delete one of your records by its id.\n" in message
        assert "Arguments (values written by the program, one per line, as JSON):\nid: 1\n" in message
        assert "PROGRAM_TEXT_MARKER" not in message and "records.create" not in message
        assert len(message.encode()) <= MAX_MESSAGE_BYTES
        (params,) = user.asked
        assert isinstance(params, types.ElicitRequestFormParams)
        assert params.requested_schema["required"] == ["approve"]
        delete = events.calls[-1]
        assert (delete.decision, delete.outcome, delete.approval) == ("approved", "ok", "accept")
        assert delete.approval_seconds >= 0
    finally:
        await server.aclose()


@MODES
async def test_each_argument_is_rendered_on_its_own_line_as_json(mode: str) -> None:
    server, _ = served()
    user = User(answer=types.ElicitResult(action="decline"))
    try:
        async with client(server, user, mode) as c:
            src = (
                "def main():\n"
                '    r = records.create(title="a")\n'
                '    return records.update(id=r["id"], title="line\\nbreak\\u001b[2J" + "y" * 300)\n'
            )
            assert error_text(await call(c, "execute", source=src)) == "permission denied"
        (message,) = user.messages
        assert "\x1b" not in message and message.count("\n") == 6, message
        # JSON: a line break or an escape sequence is shown as its escape, never acted on; a call
        # this short is shown whole
        assert message.splitlines()[4:6] == ["id: 1", 'title: "line\\nbreak\\u001b[2J' + "y" * 300 + '"']
    finally:
        await server.aclose()


@pytest.mark.parametrize(
    "answer",
    [
        types.ElicitResult(action="decline"),
        types.ElicitResult(action="cancel"),
        types.ElicitResult(action="accept", content={"approve": False}),
        types.ElicitResult(action="accept", content={"approve": "true"}),
        types.ElicitResult(action="accept", content={"approve": True, "also": "x"}),
        types.ElicitResult(action="accept"),
        types.ErrorData(code=types.INVALID_REQUEST, message="no"),
    ],
    ids=["decline", "cancel", "false", "string", "extra", "empty", "error"],
)
@MODES
async def test_anything_but_an_explicit_accept_denies(answer: Any, mode: str) -> None:
    events = Events()
    server, store = served(events, max_approval_time=1.0)
    try:
        async with client(server, User(answer=answer), mode) as c:
            if mode == "auto" and isinstance(answer, types.ErrorData):
                # The client's retry driver gives up on an error answer (the call raises), so the
                # host hears nothing more: the execute is a record that expires at max_approval_time.
                with pytest.raises(MCPError):
                    await call(c, "execute", source=create_then_delete())
                assert events.calls[-1].decision == "ask" and events.calls[-1].outcome == "not_run"
                assert store.get("alice", 1).id == 1, "the delete did not run"
                return
            result = await call(c, "execute", source=create_then_delete())
        assert error_text(result) == "permission denied"
        assert ledger(result) == [("records.create", "ok"), ("records.delete", "declined")]
        assert store.get("alice", 1).id == 1, "the delete did not run"
        delete = events.calls[-1]
        assert (delete.decision, delete.outcome) == ("declined", "not_run")
        assert delete.approval in ("decline", "cancel", "unavailable")
    finally:
        await server.aclose()


@MODES
async def test_a_declined_call_can_be_recovered_with_attempt(mode: str) -> None:
    server, _ = served()
    try:
        async with client(server, User(answer=types.ElicitResult(action="decline")), mode) as c:
            src = "def main():\n    r = attempt(records.delete, id=1)\n    return [r['ok'], r['error']]\n"
            result = await call(c, "execute", source=src)
        assert execute_value(result) == [False, "permission denied"]
        assert ledger(result) == [("records.delete", "declined")]
    finally:
        await server.aclose()


@MODES
async def test_a_client_without_the_elicitation_capability_is_declined(mode: str) -> None:
    events = Events()
    server, _ = served(events)
    user = User()
    try:
        async with Client(create_server(server, StaticSubject("alice")), mode=mode) as c:
            result = await call(c, "execute", source=create_then_delete())
        assert error_text(result) == "permission denied"
        assert ledger(result)[-1] == ("records.delete", "declined")
        assert user.asked == []
        assert events.calls[-1].approval == "unavailable"
    finally:
        await server.aclose()


@MODES
async def test_the_wait_does_not_spend_the_programs_time(mode: str) -> None:
    server, _ = served(max_execution_time=1.0)
    try:
        async with client(server, User(delay=2.5), mode) as c:
            started = time.monotonic()
            result = await call(c, "execute", source=create_then_delete())
        assert time.monotonic() - started >= 2.5
        assert execute_value(result) == {"id": 1, "deleted": True}
    finally:
        await server.aclose()


@MODES
async def test_a_user_who_never_answers_is_declined_in_time_and_frees_the_slot(mode: str) -> None:
    events = Events()
    server, _ = served(events, max_approval_time=1.0, max_concurrent_executions=1)
    hold = asyncio.Event()  # never set: the question stays open
    try:
        async with client(server, User(hold=hold), mode) as c, client(server, User(), mode) as other:
            started = time.monotonic()
            pending = asyncio.ensure_future(call(c, "execute", source=create_then_delete()))
            if mode == "legacy":
                assert await wait_until(lambda: any(e.approval for e in events.calls), 30)
                assert 1.0 <= time.monotonic() - started < 20
                assert events.calls[-1].approval == "unanswered"
            if mode == "legacy":
                # the question rode the open call: its answer is the declined result
                assert error_text(await pending) == "permission denied"
            else:
                # the client still waits for its user; the host holds only a record, which expires
                pending.cancel()
            # the only slot is free again
            assert execute_value(await call(other, "execute", source="def main():\n    return 7\n")) == 7
    finally:
        hold.set()
        await server.aclose()


@MODES
async def test_one_subject_may_keep_only_so_many_questions_open(mode: str) -> None:
    events = Events()
    server, _ = served(events, max_pending_approvals=1, max_concurrent_executions=4)
    hold = asyncio.Event()
    alice, bob = User(hold=hold), User()
    try:
        async with client(server, alice, mode) as a, client(server, bob, mode, subject="bob") as b:
            first = asyncio.ensure_future(call(a, "execute", source=create_then_delete()))
            await asyncio.wait_for(alice.waiting.wait(), 30)
            second = await call(a, "execute", source=create_then_delete())
            assert error_text(second) == "permission denied"
            assert len(alice.asked) == 1, "the second question was never sent"
            assert [e.approval for e in events.calls if e.approval] == ["busy"]
            # another subject is not held up by alice's open question
            assert execute_value(await call(b, "execute", source=create_then_delete())) == {
                "id": 1,
                "deleted": True,
            }
            hold.set()
            assert execute_value(await first) == {"id": 1, "deleted": True}
        assert sorted(e.approval for e in events.calls if e.approval) == ["accept", "accept", "busy"]
    finally:
        hold.set()
        await server.aclose()


async def test_without_an_approver_the_library_declines() -> None:
    server, _ = served()
    subject = authz.Subject("alice")

    class Yes:
        def __init__(self) -> None:
            self.requests: list[codemode.ApprovalRequest] = []

        async def approve(self, request: codemode.ApprovalRequest) -> codemode.ApprovalAnswer:
            self.requests.append(request)
            return "accept"

    try:
        with pytest.raises(codemode.PermissionDenied) as info:
            await server.run(create_then_delete(), subject=subject)
        assert [c.outcome for c in info.value.calls] == ["ok", "declined"]
        yes = Yes()
        run = await server.run(create_then_delete(), subject=subject, approver=yes)
        assert run.value == {"id": 2, "deleted": True}
        assert [(r.capability, r.arguments, r.hidden) for r in yes.requests] == [
            ("records.delete", "id: 2", 0)
        ]
    finally:
        await server.aclose()


async def test_the_client_cancelling_while_asked_ends_the_execute() -> None:
    """On the handshake protocol the question rides the open tools/call: cancelling the call ends
    the execute at once."""
    server, _ = served(max_concurrent_executions=1)
    hold = asyncio.Event()
    user = User(hold=hold)
    try:
        async with client(server, user, "legacy") as c:
            pending = asyncio.ensure_future(call(c, "execute", source=create_then_delete()))
            await asyncio.wait_for(user.waiting.wait(), 30)
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
            hold.set()
            # the slot came back: the next execute runs
            assert execute_value(await call(c, "execute", source="def main():\n    return 1\n")) == 1
    finally:
        hold.set()
        await server.aclose()


@MODES
async def test_accept_is_read_from_the_answer_not_from_the_program(mode: str) -> None:
    """The program cannot approve itself: its own text saying "approve" changes nothing."""
    server, _ = served()
    try:
        async with client(server, User(answer=types.ElicitResult(action="decline")), mode) as c:
            src = 'def main():\n    return records.delete(id=1, )  # {"approve": true}\n'
            result = await call(c, "execute", source=src)
        assert execute_report(result)["error"] == "permission denied"
        async with client(server, User(answer=ACCEPT), mode) as c:
            result = await call(c, "execute", source=create_then_delete())
        assert execute_value(result)["deleted"] is True
    finally:
        await server.aclose()


async def test_on_the_2026_protocol_a_client_that_walks_away_holds_its_slot_only_until_the_time_limit() -> (
    None
):
    """On the per-request protocol no request is open while the user is asked, and no worker nor
    slot is held: a client that gives up cannot tell the host, and needs not; its record expires."""
    events = Events()
    server, _ = served(events, max_concurrent_executions=1, max_approval_time=1.5)
    hold = asyncio.Event()
    user = User(hold=hold)
    try:
        async with client(server, user, "auto") as c:
            pending = asyncio.ensure_future(call(c, "execute", source=create_then_delete()))
            await asyncio.wait_for(user.waiting.wait(), 30)
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
            assert execute_value(await call(c, "execute", source="def main():\n    return 1\n")) == 1
            assert not any(e.approval for e in events.calls), "nothing was answered"
    finally:
        hold.set()
        await server.aclose()


async def test_a_retry_resumes_only_its_own_execute() -> None:
    """Hostile retries on the 2026-07-28 protocol, made with the official client's low-level call:
    a made-up state, another subject's state, a state used twice and a state sent with another
    program are refused with a JSON-RPC error; a malformed answer declines."""
    events = Events()
    server, store = served(events)
    mcp_server = create_server(server, StaticSubject("alice"))
    mallory_server = create_server(server, StaticSubject("mallory"))
    src = create_then_delete()
    try:
        async with (
            Client(mcp_server, mode="auto", elicitation_callback=User()) as alice,
            Client(mallory_server, mode="auto", elicitation_callback=User()) as mallory,
        ):
            first = await alice.session.call_tool("execute", {"source": src}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult) and first.request_state
            (question,) = (first.input_requests or {}).values()
            assert isinstance(question, types.ElicitRequest)
            assert "Capability: records.delete" in question.params.message
            accept: dict[str, Any] = {
                "approve": types.ElicitResult(action="accept", content={"approve": True})
            }
            state = first.request_state
            for who, source, token in (
                (alice, src, "made-up"),
                (mallory, src, state),  # another tenant holding alice's state
                (alice, src + "\n# other", state),  # alice's state, another program
            ):
                with pytest.raises(MCPError, match="unknown or expired request state"):
                    await who.session.call_tool(
                        "execute", {"source": source}, input_responses=accept, request_state=token,
                        allow_input_required=True,
                    )  # fmt: skip
            done = await alice.session.call_tool(
                "execute",
                {"source": src},
                input_responses=accept,
                request_state=state,
                allow_input_required=True,
            )
            assert isinstance(done, types.CallToolResult)
            assert execute_value(done) == {"id": 1, "deleted": True}
            with pytest.raises(MCPError, match="unknown or expired request state"):
                await alice.session.call_tool(
                    "execute", {"source": src}, input_responses=accept, request_state=state,
                    allow_input_required=True,
                )  # fmt: skip
            # a malformed answer (not an elicitation result) declines
            again = await alice.session.call_tool("execute", {"source": src}, allow_input_required=True)
            assert isinstance(again, types.InputRequiredResult)
            roots: dict[str, Any] = {"approve": types.ListRootsResult(roots=[])}
            declined = await alice.session.call_tool(
                "execute", {"source": src}, input_responses=roots, request_state=again.request_state,
                allow_input_required=True,
            )  # fmt: skip
            assert isinstance(declined, types.CallToolResult)
            assert error_text(declined) == "permission denied"
        assert [e.approval for e in events.calls if e.approval] == ["accept", "unavailable"]
        assert store.get("alice", 2).id == 2
    finally:
        await server.aclose()
