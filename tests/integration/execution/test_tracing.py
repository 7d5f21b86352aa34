"""Traces for operators: the spans of real executes, collected with the OpenTelemetry
SDK's in-memory exporter, through the library API and the official MCP client.

What they must carry (docs/tracing.md): one ``codemode.execute`` span per execute, children for the
admission wait, the sandbox acquire (warm or cold), each native call and the teardown; a link (never
a parent) to the W3C trace context a client sends in ``_meta``; and never an argument, a result, the
program, a print, a policy or handler text or the subject id itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from mcp import Client
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import codemode
from codemode import authz
from codemode.execution.tracing import ATTRIBUTES, SPAN_NAMES, subject_hash
from codemode.startup.config import ConfigError, load_settings
from tests.support.mcp_client import CLIENT_MODES, call, execute_report, mcp_for, trace_meta

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@dataclass
class Traced:
    provider: TracerProvider
    exporter: InMemorySpanExporter

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def execute(self) -> ReadableSpan:
        (root,) = self.named("codemode.execute")
        return root


@pytest.fixture
def traced() -> Iterator[Traced]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield Traced(provider, exporter)
    provider.shutdown()


def traced_server(traced: Traced, *caps: codemode.Capability, subject: str = "hash", **kw: Any) -> Any:
    from codemode_capabilities.records import RecordStore
    from codemode_capabilities.records import capabilities as record_caps

    builder = codemode.Builder(
        authorizer=kw.pop("authorizer", authz.allow_all()),
        tracing=codemode.Tracing(traced.provider, subject=subject),  # type: ignore[arg-type]
        **kw,
    )
    builder.register(*record_caps(RecordStore()), *caps)
    return builder.build()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


# ------------------------------------------------------------------------------------------- shape


@pytest.mark.parametrize("mode", CLIENT_MODES)
async def test_one_execute_is_one_trace_linked_to_the_clients_span(traced: Traced, mode: str) -> None:
    server = traced_server(traced)
    src = 'def main():\n    r = records.create(title="a")\n    return records.get(id=r["id"])["title"]\n'
    async with Client(mcp_for(server), mode=mode) as client:
        result = await client.call_tool("execute", {"source": src}, meta=trace_meta(traceparent=TRACEPARENT))
    assert execute_report(result)["result"] == "a"
    await server.aclose()  # the teardown span ends once the worker is reaped

    root = traced.execute()
    assert root.parent is None and format(root.context.trace_id, "032x") != TRACE_ID
    (link,) = root.links
    assert (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x")) == (
        TRACE_ID,
        PARENT_ID,
    )
    assert link.context.is_remote
    a = attrs(root)
    assert a["codemode.outcome"] == "ok" and a["codemode.native_calls"] == 2
    assert a["codemode.runtime"] == "process" and a["codemode.subject"] == subject_hash("alice")
    assert "codemode.limit" not in a and root.status.status_code is StatusCode.UNSET
    children = [s for s in traced.spans() if s is not root]
    assert sorted(s.name for s in children) == [
        "codemode.admission",
        "codemode.native_call",
        "codemode.native_call",
        "codemode.sandbox.acquire",
        "codemode.teardown",
    ]
    for span in children:
        assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert span.context.trace_id == root.context.trace_id
    calls = sorted(traced.named("codemode.native_call"), key=lambda s: s.start_time or 0)
    assert [(attrs(s)["codemode.capability.id"], attrs(s)["codemode.capability.name"]) for s in calls] == [
        ("records.entry.create", "records.create"),
        ("records.entry.get", "records.get"),
    ]
    for span in calls:
        a = attrs(span)
        assert a["codemode.call.decision"] == "allow" and a["codemode.call.outcome"] == "ok"
        assert a["codemode.call.handler_seconds"] >= 0 and a["codemode.call.authz_seconds"] >= 0
    (acquire,) = traced.named("codemode.sandbox.acquire")
    assert attrs(acquire) == {"codemode.sandbox.acquired": True, "codemode.sandbox.warm": False}
    (admission,) = traced.named("codemode.admission")
    assert attrs(admission) == {"codemode.admission.granted": True}
    # in order: admission, acquire, the calls, then the teardown
    order = [admission, acquire, *calls]
    assert all((x.start_time or 0) <= (y.start_time or 0) for x, y in itertools.pairwise(order))


@pytest.mark.parametrize("mode", CLIENT_MODES)
async def test_a_tenants_trace_context_is_only_linked(traced: Traced, mode: str) -> None:
    """A tenant's ``traceparent`` decides nothing. Before, flags ``00`` turned tracing
    off for that tenant's executes (no span exported), the tenant chose the trace id of the host's
    spans, and its ``tracestate`` was exported on every span. Now each execute is a new root trace
    with a host-chosen id, sampled by the host's own sampler, that at most links the tenant's span,
    and carries none of its ``tracestate``."""
    server = traced_server(traced)
    unsampled = f"00-{TRACE_ID}-{PARENT_ID}-00"
    async with Client(mcp_for(server), mode=mode) as client:
        for traceparent in (unsampled, TRACEPARENT):
            meta = trace_meta(traceparent=traceparent, tracestate="tenant=chosen,other=TENANT_STATE")
            result = await client.call_tool("execute", {"source": "def main():\n    return 1\n"}, meta=meta)
            assert execute_report(result)["result"] == 1
    await server.aclose()

    roots = traced.named("codemode.execute")
    assert len(roots) == 2  # the unsampled flags did not turn tracing off
    for root in roots:
        assert root.parent is None and format(root.context.trace_id, "032x") != TRACE_ID
        (link,) = root.links
        assert format(link.context.trace_id, "032x") == TRACE_ID
        assert format(link.context.span_id, "016x") == PARENT_ID
        assert not link.context.trace_state and not link.attributes
    assert roots[0].context.trace_id != roots[1].context.trace_id
    for span in traced.spans():
        assert span.context.trace_id != int(TRACE_ID, 16)
        assert not span.context.trace_state, span.name
        assert "TENANT_STATE" not in span.to_json(), span.name


async def test_without_a_valid_traceparent_nothing_is_linked(traced: Traced) -> None:
    server = traced_server(traced)
    async with server:
        for meta in (None, {"traceparent": "00-zz-yy-01"}, {"traceparent": TRACEPARENT + "0" * 600}):
            traced.exporter.clear()
            await server.run(
                "def main():\n    return 1\n", subject=authz.Subject("alice"), trace_context=meta
            )
            root = traced.execute()
            assert root.parent is None and not root.links, meta
            assert format(root.context.trace_id, "032x") != TRACE_ID


async def test_a_warm_worker_is_marked_warm(traced: Traced) -> None:
    pool = codemode.WarmPool(codemode.ProcessRuntime(), 1)
    server = traced_server(traced, runtime=pool)
    async with server:
        await pool.wait_warm(60)
        await server.run("def main():\n    return 1\n", subject=authz.Subject("alice"))
    (acquire,) = traced.named("codemode.sandbox.acquire")
    assert attrs(acquire)["codemode.sandbox.warm"] is True
    assert attrs(traced.execute())["codemode.runtime"] == "process+pool"


async def test_limits_and_denials_are_outcomes_and_kinds(traced: Traced) -> None:
    class DenyDelete:
        def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
            if input.capability_name == "records.delete":
                raise authz.Denied("no")

    server = traced_server(traced, authorizer=DenyDelete(), limits=codemode.Limits(max_native_calls=2))
    subject = authz.Subject("alice")
    async with server:
        src = "def main():\n    attempt(records.delete, id=1)\n    records.get(id=1)\n    return 0\n"
        with pytest.raises(codemode.CapabilityFailure):
            await server.run(src, subject=subject)
        spans = sorted(traced.named("codemode.native_call"), key=lambda s: s.start_time or 0)
        assert [(attrs(s)["codemode.call.decision"], attrs(s)["codemode.call.outcome"]) for s in spans] == [
            ("deny", "not_run"),
            ("allow", "capability_failed"),
        ]
        root = traced.execute()
        assert attrs(root)["codemode.outcome"] == "capability_failed"
        assert root.status.status_code is StatusCode.ERROR and not root.status.description

        traced.exporter.clear()
        src = "def main():\n    for i in range(3):\n        records.search(text='x')\n    return 0\n"
        with pytest.raises(codemode.ResourceLimit):
            await server.run(src, subject=subject)
        a = attrs(traced.execute())
        assert (a["codemode.outcome"], a["codemode.limit"], a["codemode.native_calls"]) == (
            "resource_limit",
            "native calls",
            2,  # the worker stops the third call itself
        )


@dataclass
class SlowIn:
    seconds: float


@dataclass
class SlowOut:
    done: bool


async def _slow(ctx: codemode.CallContext, subject: authz.Subject, args: SlowIn) -> SlowOut:
    await asyncio.sleep(args.seconds)
    return SlowOut(True)


SLOW = codemode.Capability(name="demo.slow", summary="Sleep a while.", handler=_slow)


async def test_the_deadline_and_the_quota_are_traced(traced: Traced) -> None:
    server = traced_server(
        traced,
        SLOW,
        limits=codemode.Limits(max_execution_time=1.0, max_concurrent_executions=2),
        subject_quota=1,
    )
    subject = authz.Subject("alice")
    async with server:
        slow = asyncio.ensure_future(
            server.run("def main():\n    return demo.slow(seconds=30.0)\n", subject=subject)
        )
        await asyncio.sleep(0.3)
        with pytest.raises(codemode.ResourceLimit):
            await server.run("def main():\n    return 1\n", subject=subject)
        with pytest.raises(codemode.ResourceLimit):
            await slow
    roots = {attrs(s)["codemode.limit"]: s for s in traced.named("codemode.execute")}
    assert set(roots) == {"quota", "time"}
    assert attrs(roots["quota"])["codemode.native_calls"] == 0
    (call_span,) = traced.named("codemode.native_call")
    assert attrs(call_span)["codemode.call.outcome"] == "interrupted"


# ------------------------------------------------------------------------------------- disclosure

MARKERS = ("SRC_SECRET", "ARG_SECRET", "RESULT_SECRET", "PRINT_SECRET", "HANDLER_SECRET", "POLICY_SECRET")


@dataclass
class NoteIn:
    text: str


@dataclass
class NoteOut:
    text: str


def _note(ctx: codemode.CallContext, subject: authz.Subject, args: NoteIn) -> NoteOut:
    if args.text == "fail":
        raise codemode.AgentError("HANDLER_SECRET: cannot")
    return NoteOut("RESULT_SECRET " + args.text)


NOTE = codemode.Capability(name="demo.note", summary="Keep a note.", handler=_note)


class SecretPolicy:
    """Denies with a message, fails with another: host-log texts that no span may carry."""

    def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
        if input.arguments.get("text") == "deny":
            raise authz.Denied("POLICY_SECRET denial")
        if input.arguments.get("text") == "break":
            raise RuntimeError("POLICY_SECRET evaluation")


@pytest.mark.parametrize("mode", ["hash", "omit"])
async def test_no_span_carries_arguments_results_texts_or_the_subject(traced: Traced, mode: str) -> None:
    server = traced_server(
        traced, NOTE, subject=mode, authorizer=SecretPolicy(), limits=codemode.Limits(max_print_bytes=4096)
    )
    subject = authz.Subject("tenant-SUBJECT_SECRET")
    programs = [
        '# SRC_SECRET\ndef main():\n    print("PRINT_SECRET")\n    return demo.note(text="ARG_SECRET")\n',
        'def main():\n    attempt(demo.note, text="deny")\n    return demo.note(text="fail")\n',
        'def main():\n    return demo.note(text="break")\n',
        'def main():\n    fail("SRC_SECRET")\n',
    ]
    async with server:
        for src in programs:
            with contextlib.suppress(codemode.CodeModeError):
                await server.run(src, subject=subject, trace_context={"traceparent": TRACEPARENT})
    spans = traced.spans()
    assert len(traced.named("codemode.execute")) == len(programs)
    assert len(traced.named("codemode.native_call")) == 4
    dumped = "\n".join(s.to_json() for s in spans)
    for marker in (*MARKERS, "SUBJECT_SECRET"):
        assert marker not in dumped, marker
    subjects = {attrs(s).get("codemode.subject") for s in traced.named("codemode.execute")}
    assert subjects == ({subject_hash(subject.id)} if mode == "hash" else {None})
    # nothing but the documented keys (docs/tracing.md)
    keys = {k for s in spans for k in attrs(s)}
    assert keys <= set(ATTRIBUTES), keys
    assert {s.name for s in spans} <= set(SPAN_NAMES)
    assert all(not s.events for s in spans), "no exception events (they would carry messages)"


# ------------------------------------------------------------------------------------ off, config


async def test_the_trace_pseudonym_does_not_correlate_with_the_subjects_other_names(traced: Traced) -> None:
    """Found by review: ``codemode.subject`` was the first 16 hex digits of the subject's data-dir
    name (``subject_key``) and of its quota Lease label, so whoever saw one could match the other.
    The trace pseudonym is derived on its own."""
    from codemode.execution.quota_kubernetes import subject_digest
    from codemode_capabilities.mcp.tenancy import subject_key

    server = traced_server(traced)
    async with server:
        for who in ("alice", "bob"):
            await server.run("def main():\n    return 1\n", subject=authz.Subject(who))
    seen = [attrs(s)["codemode.subject"] for s in traced.named("codemode.execute")]
    assert seen == [subject_hash("alice"), subject_hash("bob")]
    for who, pseudonym in zip(("alice", "bob"), seen, strict=True):
        assert len(pseudonym) == 16
        for other in (subject_key(who), subject_digest(who)):
            assert pseudonym[:8] not in other, (who, pseudonym, other)
    # Over many ids: no common prefix beyond chance (16^-4 per id for 4 digits).
    ids = [f"tenant-{n}" for n in range(2000)]
    shared = sum(subject_hash(i)[:4] == subject_key(i)[:4] for i in ids)
    assert shared < 10, shared


def test_tracing_off_imports_no_opentelemetry() -> None:
    script = textwrap.dedent(
        """
        import asyncio, json, sys
        import codemode
        from codemode import authz

        async def main():
            server = codemode.Builder(authorizer=authz.allow_all()).build()
            async with server:
                await server.run("def main():\\n    return 1\\n", subject=authz.Subject("a"))

        asyncio.run(main())
        bare = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        from codemode.startup.bootstrap import build_server
        from codemode.startup.config import load_settings
        build_server(load_settings(allow_all=True, transport="stdio"))
        sdk = sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter")))
        print(json.dumps([bare, sdk]))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[], []]


def test_tracing_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="--trace-endpoint / CODEMODE_TRACE_ENDPOINT: must be an http"):
        load_settings(allow_all=True, trace_endpoint="ftp://collector:4318")
    with pytest.raises(ConfigError, match="--trace-subject / CODEMODE_TRACE_SUBJECT"):
        load_settings(allow_all=True, trace_subject="plain")
    assert load_settings(allow_all=True, trace_endpoint=" ").trace_endpoint is None
    for bad in (object(), codemode.Tracing(object())):
        with pytest.raises(codemode.InvalidRegistration, match="tracing"):
            codemode.Builder(authorizer=authz.allow_all(), tracing=bad).build()  # type: ignore[arg-type]


async def test_search_and_describe_make_no_spans(traced: Traced) -> None:
    server = traced_server(traced)
    async with Client(mcp_for(server)) as client:
        await call(client, "search_api", query="records")
        await call(client, "describe_api", name="records.get")
    await server.aclose()
    assert traced.spans() == []


async def test_an_approval_is_a_span_of_its_own(traced: Traced) -> None:
    class AskDeletes:
        def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
            if input.capability_name == "records.delete":
                raise authz.AskUser("ask")

    class Yes:
        async def approve(self, request: codemode.ApprovalRequest) -> codemode.ApprovalAnswer:
            return "accept"

    server = traced_server(traced, authorizer=AskDeletes())
    src = 'def main():\n    return records.delete(id=records.create(title="a")["id"])\n'
    async with server:
        await server.run(src, subject=authz.Subject("alice"), approver=Yes())
        with pytest.raises(codemode.PermissionDenied):
            await server.run("def main():\n    return records.delete(id=9)\n", subject=authz.Subject("alice"))
    answers = [attrs(s)["codemode.approval.answer"] for s in traced.named("codemode.approval")]
    assert sorted(answers) == ["accept", "unavailable"]
    decisions = [attrs(s)["codemode.call.decision"] for s in traced.named("codemode.native_call")]
    # The ask suspends the execute: its first worker's calls are the create (allow) and
    # the delete (ask); the resumed worker replays the create (allow, from the log, not run again)
    # and then runs the approved delete. The second execute's delete is declined (nobody to ask).
    assert sorted(decisions) == ["allow", "allow", "approved", "ask", "declined"]
    for span in traced.named("codemode.approval"):
        assert span.parent is not None and attrs(span).keys() == {"codemode.approval.answer"}
