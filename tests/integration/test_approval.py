"""Approval by policy, asked of the user (issue 22 §3), through the official MCP client's elicitation
callback, in memory: ``legacy`` (the initialize handshake over JSON-RPC streams, which carry server
requests) asks; ``auto`` (the 2026-07-28 per-request path, which has no server requests) cannot.

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

import codemode
from codemode import authz
from codemode.capabilities.records import RecordStore
from codemode.capabilities.records import capabilities as record_caps
from codemode.execution.approval import MAX_MESSAGE_BYTES
from codemode.mcp import StaticSubject, create_server

from .support_approval import ACCEPT, AskDeletes, User, create_then_delete
from .support_mcp import call, error_text, execute_report, execute_value, ledger


class Events:
    """Records the observer's call events."""

    def __init__(self) -> None:
        self.calls: list[codemode.CallEvent] = []

    def native_call(self, event: codemode.CallEvent) -> None:
        self.calls.append(event)

    def execute(self, event: codemode.ExecuteEvent) -> None:
        return None

    def execute_started(self, subject_id: str) -> None:
        return None

    def execute_finished(self, subject_id: str) -> None:
        return None


def served(events: Events | None = None, **limits: Any) -> tuple[codemode.Server, RecordStore]:
    store = RecordStore()
    builder = codemode.Builder(
        authorizer=AskDeletes(), limits=codemode.Limits(**limits), observer=events, subject_quota=4
    )
    builder.register(*record_caps(store))
    return builder.build(), store


def client(server: codemode.Server, user: Any, mode: str = "legacy", subject: str = "alice") -> Client:
    return Client(create_server(server, StaticSubject(subject)), mode=mode, elicitation_callback=user)


async def test_an_explicit_accept_runs_the_call_and_the_user_sees_a_host_built_question() -> None:
    events = Events()
    server, _ = served(events)
    user = User()
    try:
        async with client(server, user) as c:
            result = await call(c, "execute", source=create_then_delete())
        assert execute_value(result) == {"id": 1, "deleted": True}
        assert ledger(result) == [("records.create", "ok"), ("records.delete", "ok")]
        (message,) = user.messages
        assert "Capability: records.delete\n" in message
        assert "What it does: Delete one of your records by its id.\n" in message
        assert "Arguments (values written by the program): id=1\n" in message
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


async def test_the_arguments_are_rendered_on_one_line_and_cut() -> None:
    server, _ = served()
    user = User(answer=types.ElicitResult(action="decline"))
    try:
        async with client(server, user) as c:
            src = (
                "def main():\n"
                '    r = records.create(title="a")\n'
                '    return records.update(id=r["id"], title="line\\nbreak\\u001b[2J" + "y" * 300)\n'
            )
            assert error_text(await call(c, "execute", source=src)) == "permission denied"
        (message,) = user.messages
        assert "\x1b" not in message and message.count("\n") == 4, message
        line = message.splitlines()[3]
        # JSON: a line break or an escape sequence is shown as its escape, never acted on
        assert line.startswith(
            'Arguments (values written by the program): id=1, title="line\\nbreak\\u001b[2Jyyy'
        )
        assert line.endswith("…") and len(line.encode()) < 200
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
async def test_anything_but_an_explicit_accept_denies(answer: Any) -> None:
    events = Events()
    server, store = served(events)
    try:
        async with client(server, User(answer=answer)) as c:
            result = await call(c, "execute", source=create_then_delete())
        assert error_text(result) == "permission denied"
        assert ledger(result) == [("records.create", "ok"), ("records.delete", "declined")]
        assert store.get("alice", 1).id == 1, "the delete did not run"
        delete = events.calls[-1]
        assert (delete.decision, delete.outcome) == ("declined", "not_run")
        assert delete.approval in ("decline", "cancel", "unavailable")
    finally:
        await server.aclose()


async def test_a_declined_call_can_be_recovered_with_attempt() -> None:
    server, _ = served()
    try:
        async with client(server, User(answer=types.ElicitResult(action="decline"))) as c:
            src = "def main():\n    r = attempt(records.delete, id=1)\n    return [r['ok'], r['error']]\n"
            result = await call(c, "execute", source=src)
        assert execute_value(result) == [False, "permission denied"]
        assert ledger(result) == [("records.delete", "declined")]
    finally:
        await server.aclose()


@pytest.mark.parametrize("mode", ["auto", "legacy-without-callback"])
async def test_a_client_that_cannot_be_asked_is_declined(mode: str) -> None:
    events = Events()
    server, _ = served(events)
    user = User()
    try:
        if mode == "auto":
            ctx: Any = client(server, user, mode="auto")
        else:
            ctx = Client(create_server(server, StaticSubject("alice")), mode="legacy")
        async with ctx as c:
            result = await call(c, "execute", source=create_then_delete())
        assert error_text(result) == "permission denied"
        assert ledger(result)[-1] == ("records.delete", "declined")
        assert user.asked == []
        assert events.calls[-1].approval == "unavailable"
    finally:
        await server.aclose()


async def test_the_wait_does_not_spend_the_programs_time() -> None:
    server, _ = served(max_execution_time=1.0)
    try:
        async with client(server, User(delay=2.5)) as c:
            started = time.monotonic()
            result = await call(c, "execute", source=create_then_delete())
        assert time.monotonic() - started >= 2.5
        assert execute_value(result) == {"id": 1, "deleted": True}
    finally:
        await server.aclose()


async def test_a_user_who_never_answers_is_declined_in_time_and_frees_the_slot() -> None:
    events = Events()
    server, _ = served(events, max_approval_time=1.0, max_concurrent_executions=1)
    hold = asyncio.Event()  # never set: the question stays open
    try:
        async with client(server, User(hold=hold)) as c:
            started = time.monotonic()
            result = await call(c, "execute", source=create_then_delete())
            waited = time.monotonic() - started
            assert error_text(result) == "permission denied"
            assert 1.0 <= waited < 20
            assert events.calls[-1].approval == "unanswered"
            # the only slot is free again
            assert execute_value(await call(c, "execute", source="def main():\n    return 7\n")) == 7
    finally:
        hold.set()
        await server.aclose()


async def test_one_subject_may_keep_only_so_many_questions_open() -> None:
    events = Events()
    server, _ = served(events, max_pending_approvals=1, max_concurrent_executions=4)
    hold = asyncio.Event()
    alice, bob = User(hold=hold), User()
    try:
        async with client(server, alice) as a, client(server, bob, subject="bob") as b:
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
        assert [(r.capability, r.arguments) for r in yes.requests] == [("records.delete", "id=2")]
    finally:
        await server.aclose()


async def test_the_client_cancelling_while_asked_ends_the_execute() -> None:
    server, _ = served(max_concurrent_executions=1)
    hold = asyncio.Event()
    user = User(hold=hold)
    try:
        async with client(server, user) as c:
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


async def test_accept_is_read_from_the_answer_not_from_the_program() -> None:
    """The program cannot approve itself: its own text saying "approve" changes nothing."""
    server, _ = served()
    try:
        async with client(server, User(answer=types.ElicitResult(action="decline"))) as c:
            src = 'def main():\n    return records.delete(id=1, )  # {"approve": true}\n'
            result = await call(c, "execute", source=src)
        assert execute_report(result)["error"] == "permission denied"
        async with client(server, User(answer=ACCEPT)) as c:
            result = await call(c, "execute", source=create_then_delete())
        assert execute_value(result)["deleted"] is True
    finally:
        await server.aclose()
