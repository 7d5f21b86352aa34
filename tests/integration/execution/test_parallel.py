"""``parallel(...)`` through the real pipeline and a real process worker: each call on
its own through rebind, authorization (asking the user) and its handler; outcomes in order as
``attempt``'s records; the ledger and the audit log in list order; the limits over the whole batch;
``max_parallel_calls``; and one program's blocking handlers never take every handler thread."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.common.errors import client_text
from codemode.execution.approval import ApprovalRequest
from codemode.execution.parallel import handler_share
from codemode.execution.progress import reporting
from tests.support.mcp_client import wait_until
from tests.support.recorder import ALICE, EchoIn, EchoOut, Events, Recorder, make_capabilities

BOB = authz.Subject("bob")


@dataclass
class Gates:
    """What the concurrency capabilities share with a test."""

    barrier: asyncio.Barrier | None = None
    active: int = 0
    peak: int = 0
    first_may_finish: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    holding: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    order: list[str] = field(default_factory=list)


def gated_capabilities(gates: Gates) -> list[codemode.Capability]:
    async def meet(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
        gates.active += 1
        gates.peak = max(gates.peak, gates.active)
        try:
            assert gates.barrier is not None
            await gates.barrier.wait()  # returns only once enough calls run at the same time
        finally:
            gates.active -= 1
        return EchoOut(args.value)

    async def first(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
        await gates.first_may_finish.wait()
        gates.order.append("first")
        return EchoOut(args.value)

    async def second(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
        gates.order.append("second")
        gates.first_may_finish.set()
        return EchoOut(args.value)

    async def forever(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            gates.cancelled.append(args.value)
            raise
        return EchoOut(args.value)

    def hold(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
        with gates.lock:
            gates.holding += 1
        gates.release.wait(30)
        with gates.lock:
            gates.holding -= 1
        return EchoOut(args.value)

    def quick(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
        return EchoOut(args.value)

    return [
        codemode.Capability(name="gate.meet", summary="Meets the others.", handler=meet),
        codemode.Capability(name="gate.first", summary="Waits for second.", handler=first),
        codemode.Capability(name="gate.second", summary="Lets first go.", handler=second),
        codemode.Capability(name="gate.forever", summary="Never returns.", handler=forever),
        codemode.Capability(name="gate.hold", summary="Blocks a thread.", handler=hold),
        codemode.Capability(name="gate.quick", summary="Returns at once.", handler=quick),
    ]


def served(
    rec: Recorder | None = None, gates: Gates | None = None, events: Events | None = None, **limits: Any
) -> tuple[codemode.Server, Recorder, Gates]:
    rec = rec or Recorder()
    gates = gates or Gates()
    builder = codemode.Builder(
        authorizer=rec,
        limits=codemode.Limits(**limits),
        observer=events,
        runtime=codemode.ProcessRuntime(),
    )
    builder.register(*make_capabilities(rec), *gated_capabilities(gates))
    return builder.build(), rec, gates


def program(body: str) -> str:
    return "def main():\n    return " + body + "\n"


async def run(server: codemode.Server, source: str, subject: authz.Subject = ALICE) -> Any:
    try:
        return await server.run(source, subject=subject)
    except codemode.CodeModeError as exc:
        return exc


def ledger(outcome: Any) -> list[tuple[str, str]]:
    return [(c.capability, c.outcome) for c in outcome.calls]


async def test_outcomes_come_back_in_order_as_attempts_records_and_are_recorded_in_order() -> None:
    events = Events()
    server, rec, _ = served(events=events)
    rec.deny.add("util.whoami")
    source = program(
        '[parallel([(records.lookup, {"key": "ab"}), (util.whoami, {}), (util.boom, {"value": "agent"}),'
        ' (util.echo, {"value": 3}), (util.echo, {"value": "x"})]), attempt(util.echo, value=3)]'
    )
    try:
        result = await run(server, source)
    finally:
        await server.aclose()
    records, attempted = result.value
    assert records == [
        {"ok": True, "value": {"key": "ab", "count": 2}},
        {"ok": False, "error": "permission denied"},
        {"ok": False, "error": "capability failed: record 7 is locked  by another user"},
        {"ok": False, "error": 'invalid capability arguments: argument "value" must be str, got int'},
        {"ok": True, "value": {"value": "x"}},
    ]
    assert records[3] == attempted  # the same record attempt() gives
    expected = [
        ("records.lookup", "ok"),
        ("util.whoami", "denied"),
        ("util.boom", "failed"),
        ("util.echo", "invalid arguments"),
        ("util.echo", "ok"),
        ("util.echo", "invalid arguments"),
    ]
    assert ledger(result) == expected
    assert [(e.capability, e.decision, e.outcome) for e in events.calls] == [
        ("records.lookup", "allow", "ok"),
        ("util.whoami", "deny", "not_run"),
        ("util.boom", "allow", "capability_failed"),
        ("util.echo", "invalid_arguments", "not_run"),
        ("util.echo", "allow", "ok"),
        ("util.echo", "invalid_arguments", "not_run"),
    ]
    # Each call that bound was authorized on its own, with its own arguments, in list order.
    assert [(i.capability_name, i.arguments) for i in rec.authz_inputs] == [
        ("records.lookup", {"key": "ab"}),
        ("util.whoami", {}),
        ("util.boom", {"value": "agent"}),
        ("util.echo", {"value": "x"}),
    ]


async def test_the_calls_run_at_once() -> None:
    gates = Gates(barrier=asyncio.Barrier(5))
    server, _, _ = served(gates=gates)
    source = program('parallel([(gate.meet, {"value": str(i)}) for i in range(5)])')
    try:
        result = await run(server, source)  # one at a time, the first call would wait forever
    finally:
        await server.aclose()
    assert result.value == [{"ok": True, "value": {"value": str(i)}} for i in range(5)]


async def test_the_ledger_keeps_list_order_when_calls_finish_in_another() -> None:
    events = Events()
    server, _, gates = served(events=events)
    source = program('parallel([(gate.first, {"value": "1"}), (gate.second, {"value": "2"})])')
    try:
        result = await run(server, source)
    finally:
        await server.aclose()
    assert gates.order == ["second", "first"]
    assert [r["value"]["value"] for r in result.value] == ["1", "2"]
    assert ledger(result) == [("gate.first", "ok"), ("gate.second", "ok")]
    assert [e.capability for e in events.calls] == ["gate.first", "gate.second"]


async def test_max_parallel_calls_bounds_the_calls_running_at_once() -> None:
    gates = Gates(barrier=asyncio.Barrier(3))
    server, _, _ = served(gates=gates, max_parallel_calls=3)
    source = program('parallel([(gate.meet, {"value": str(i)}) for i in range(9)])')
    try:
        result = await run(server, source)
    finally:
        await server.aclose()
    assert [r["ok"] for r in result.value] == [True] * 9
    assert gates.peak == 3  # three at a time met (the barrier), never more


async def test_a_limit_in_one_call_ends_the_execute_and_cancels_the_others() -> None:
    server, _, gates = served(max_value_bytes=4096)
    source = program('parallel([(gate.forever, {"value": "a"}), (util.blob, {"size": 10000})])')
    try:
        result = await run(server, source)
    finally:
        await server.aclose()
    assert isinstance(result, codemode.ResourceLimit)
    assert client_text(result) == "resource limit exceeded: value size"
    assert ledger(result) == [("gate.forever", "interrupted"), ("util.blob", "limit exceeded")]
    assert gates.cancelled == ["a"]


async def test_a_policy_failure_ends_the_execute_before_any_call_runs() -> None:
    server, rec, _ = served()
    rec.fail_policy.add("util.whoami")
    source = program(
        'parallel([(util.echo, {"value": "x"}), (util.whoami, {}), (util.echo, {"value": "y"})])'
    )
    try:
        result = await run(server, source)
    finally:
        await server.aclose()
    assert client_text(result) == "authorization policy failure"
    assert rec.handler_calls == []  # authorized, but no call of the batch ran
    assert ledger(result) == [
        ("util.echo", "not run"),
        ("util.whoami", "policy failure"),
        ("util.echo", "not run"),
    ]
    assert [i.capability_name for i in rec.authz_inputs] == ["util.echo", "util.whoami"]


async def test_a_batch_over_the_calls_left_runs_none_of_them() -> None:
    server, rec, _ = served(max_native_calls=3)
    source = 'def main():\n    util.echo(value="a")\n    return parallel([(util.echo, {"value": "b"})] * 3)\n'
    try:
        result = await run(server, source)
    finally:
        await server.aclose()
    assert client_text(result) == "resource limit exceeded: native calls"
    assert [args.value for _, args in rec.handler_calls] == ["a"]
    assert ledger(result) == [("util.echo", "ok")]


async def test_the_batch_results_together_are_bounded_like_one_result() -> None:
    server, _, _ = served(max_value_bytes=1000)
    one = program('util.blob(size=400)["data"][:3]')
    batch = program("parallel([(util.blob, {'size': 400})] * 3)")
    try:
        assert (await run(server, one)).value == "xxx"
        result = await run(server, batch)
    finally:
        await server.aclose()
    assert client_text(result) == "resource limit exceeded: value size"
    assert ledger(result) == [("util.blob", "limit exceeded")] * 3


async def test_the_batch_arguments_together_are_bounded_like_one_call() -> None:
    server, rec, _ = served(max_value_bytes=1000)
    batch = program("parallel([(util.echo, {'value': 'x' * 400})] * 3)")
    try:
        result = await run(server, batch)
    finally:
        await server.aclose()
    assert client_text(result) == "resource limit exceeded: value size"
    assert rec.authz_inputs == [] and rec.handler_calls == []


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        ("parallel(1)", "parallel() takes one list of (capability, arguments) pairs, got int"),
        ("parallel([])", "parallel() got an empty list: give it at least one (capability, arguments) pair"),
        ("parallel([util.whoami])", "parallel() calls[0] must be a (capability, arguments) pair"),
        ("parallel([(util.whoami, {}, 1)])", "parallel() calls[0] must be a (capability, arguments) pair"),
        ("parallel([(util.whoami, {}), (len, {})])", "parallel() calls[1] must start with a capability"),
        ("parallel([(util.whoami(), {})])", "parallel() calls[0] must start with a capability itself"),
        ("parallel([(parallel, {'calls': []})])", "parallel() calls[0] must start with a capability itself"),
        ("parallel([(attempt, {})])", "parallel() calls[0] must start with a capability itself"),
        ("parallel([(util.echo, ['x'])])", "parallel() calls[0] arguments must be a dict with string keys"),
        ("parallel([(util.echo, {1: 'x'})])", "parallel() calls[0] arguments must be a dict with string"),
        ("parallel([(util.echo, {})], 2)", "parallel() takes one list of (capability, arguments) pairs, e"),
        ("parallel(calls=[])", "parallel() takes one list of (capability, arguments) pairs, e.g."),
        ("attempt(parallel, [])", "attempt() takes a capability first"),
    ],
)
async def test_bad_input_is_a_one_line_program_error_and_runs_nothing(expr: str, text: str) -> None:
    server, rec, _ = served()
    try:
        result = await run(server, program(expr))
    finally:
        await server.aclose()
    message = client_text(result)
    assert message.startswith("invalid program: <codemode>:2:") and text in message, message
    assert "\n" not in message
    # util.whoami() in an element is a call of its own, made before parallel() sees its list.
    assert [name for name, _ in rec.handler_calls] == []


async def test_parallel_outside_main_is_refused() -> None:
    server, rec, _ = served()
    source = "X = parallel([(util.echo, {'value': 'x'})])\ndef main():\n    return 1\n"
    try:
        result = await run(server, source)
    finally:
        await server.aclose()
    assert client_text(result).startswith("invalid program: <codemode>:1:5: parallel() called outside main()")
    assert rec.authz_inputs == []


@dataclass
class Asker:
    """A policy that leaves ``util.echo`` to the user, and a user who accepts only value "yes",
    noting what had run when each question came."""

    rec: Recorder
    questions: list[tuple[str, int]] = field(default_factory=list)

    def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
        self.rec.authorize(ctx, input)
        if input.capability_name == "util.echo":
            raise authz.AskUser("the user decides")

    async def approve(self, request: ApprovalRequest) -> Any:
        self.questions.append((request.arguments, len(self.rec.handler_calls)))
        return "accept" if "yes" in request.arguments else "decline"


async def test_each_call_that_needs_approval_is_asked_on_its_own_in_order_before_any_call_runs() -> None:
    rec = Recorder()
    asker = Asker(rec)
    builder = codemode.Builder(authorizer=asker, runtime=codemode.ProcessRuntime())
    builder.register(*make_capabilities(rec))
    server = builder.build()
    source = program(
        'parallel([(records.lookup, {"key": "k"}), (util.echo, {"value": "yes"}),'
        ' (util.echo, {"value": "no"})])'
    )
    try:
        result = await server.run(source, subject=ALICE, approver=asker)
    finally:
        await server.aclose()
    assert asker.questions == [('value: "yes"', 0), ('value: "no"', 0)]
    assert result.value == [
        {"ok": True, "value": {"key": "k", "count": 1}},
        {"ok": True, "value": {"value": "yes"}},
        {"ok": False, "error": "permission denied"},
    ]
    assert ledger(result) == [("records.lookup", "ok"), ("util.echo", "ok"), ("util.echo", "declined")]


async def test_one_programs_blocking_calls_leave_another_tenant_a_handler_thread() -> None:
    server, _, gates = served(max_parallel_calls=32, max_execution_time=30.0)
    threads = server._executor.handler_threads
    hog = asyncio.ensure_future(
        run(server, program(f'parallel([(gate.hold, {{"value": str(i)}}) for i in range({threads + 2})])'))
    )
    try:
        assert await wait_until(lambda: gates.holding >= 1)
        # Bob's sync handler still gets a thread while Alice's program holds its share of them.
        other = await asyncio.wait_for(run(server, program('gate.quick(value="bob")'), BOB), 20)
        assert other.value == {"value": "bob"}
        assert gates.holding == handler_share(threads, 32) < threads  # the rest wait for her share
    finally:
        gates.release.set()
        result = await hog
        await server.aclose()
    assert [r["ok"] for r in result.value] == [True] * (threads + 2)


async def test_the_intermediate_bytes_count_every_result_of_a_batch() -> None:
    server, _, _ = served(max_intermediate_value_bytes=1000)
    try:
        fits = await run(server, program("len(parallel([(util.blob, {'size': 300})] * 3))"))
        over = await run(server, program("parallel([(util.blob, {'size': 300})] * 4)"))
    finally:
        await server.aclose()
    assert fits.value == 3
    assert client_text(over) == "resource limit exceeded: intermediate bytes"
    assert [outcome for _, outcome in ledger(over)].count("limit exceeded") == 1
    assert [outcome for _, outcome in ledger(over)].count("ok") == 3


async def test_the_deadline_during_a_batch_interrupts_every_call_still_running() -> None:
    server, _, gates = served(max_execution_time=3.0)
    source = program(
        'parallel([(util.echo, {"value": "a"}), (gate.forever, {"value": "b"}),'
        ' (gate.forever, {"value": "c"})])'
    )
    try:
        result = await run(server, source)
    finally:
        await server.aclose()
    assert client_text(result) == "resource limit exceeded: time"
    assert ledger(result) == [
        ("util.echo", "ok"),
        ("gate.forever", "interrupted"),
        ("gate.forever", "interrupted"),
    ]
    assert sorted(gates.cancelled) == ["b", "c"]


async def test_progress_reports_every_call_of_a_batch_started_and_finished() -> None:
    server, _, _ = served()
    notes: list[str] = []

    async def send(progress: float, message: str) -> None:
        notes.append(message)

    try:
        async with reporting(send) as progress:
            result = await run(
                server, program("parallel([(util.echo, {'value': str(i)}) for i in range(3)])")
            )
    finally:
        await server.aclose()
    assert len(result.value) == 3
    assert (progress.started, progress.finished) == (3, 3)
    assert progress._events == 6  # three starts, three finishes (coalesced into fewer notes)
    assert notes[-1] == "util.echo finished (3): ok"


async def test_two_executes_of_one_subject_share_one_handler_share() -> None:
    server, _, gates = served(max_parallel_calls=32, max_execution_time=30.0)
    threads = server._executor.handler_threads
    source = program(f'parallel([(gate.hold, {{"value": str(i)}}) for i in range({threads + 2})])')
    hogs = [asyncio.ensure_future(run(server, source)) for _ in range(2)]
    try:
        assert await wait_until(lambda: gates.holding >= 1)
        # Alice's two programs together hold one share; Bob's sync handler still gets a thread.
        other = await asyncio.wait_for(run(server, program('gate.quick(value="bob")'), BOB), 20)
        assert other.value == {"value": "bob"}
        assert gates.holding == handler_share(threads, 32) < threads
    finally:
        gates.release.set()
        results = await asyncio.gather(*hogs)
        await server.aclose()
    assert all(len(r.value) == threads + 2 for r in results)
