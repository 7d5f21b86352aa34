"""End-to-end through the official MCP Python client, in memory (``Client(server)``).

Every test runs with both client modes: ``auto`` (the 2026 per-request path through a direct
dispatcher) and ``legacy`` (initialize handshake over in-memory JSON-RPC streams).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

import codemode
from codemode import authz
from codemode.mcp import TOOL_NAMES, ContextSubject, StaticSubject, create_server
from tests.support.mcp_client import (
    CLIENT_MODES,
    CountingResolver,
    EchoIn,
    EchoOut,
    RecordingRuntime,
    assert_coarse,
    build,
    call,
    call_raw,
    echo_capability,
    error_text,
    execute_value,
    mcp_for,
    success_value,
    wait_until,
)

pytestmark = pytest.mark.parametrize("mode", CLIENT_MODES)

TOOL_ARGS = {"search_api": "query", "describe_api": "name", "execute": "source"}


# ---------------------------------------------------------------------------------------------- list


async def test_tools_list_exact(mode: str) -> None:
    server = build()
    async with Client(mcp_for(server), mode=mode) as client:
        listed = await client.list_tools()
    assert [t.name for t in listed.tools] == ["search_api", "describe_api", "execute"]
    assert list(TOOL_NAMES) == ["search_api", "describe_api", "execute"]
    for tool in listed.tools:
        arg = TOOL_ARGS[tool.name]
        schema = tool.input_schema
        assert schema["type"] == "object"
        assert schema["required"] == [arg]
        assert schema["additionalProperties"] is False
        assert list(schema["properties"]) == [arg]
        assert schema["properties"][arg]["type"] == "string"
        assert tool.output_schema is not None
        assert tool.output_schema["type"] == "object"
        assert tool.description and len(tool.description) > 200
    outputs = {t.name: t.output_schema for t in listed.tools}
    assert outputs["search_api"] is not None and set(outputs["search_api"]["required"]) == {
        "results",
        "truncated",
    }
    assert outputs["describe_api"] is not None and set(outputs["describe_api"]["required"]) == {
        "name",
        "signature",
        "summary",
        "description",
        "input",
        "output",
    }
    assert outputs["execute"] is not None and outputs["execute"]["required"] == ["calls"]
    assert list(outputs["execute"]["properties"]) == ["result", "error", "calls", "prints"]
    item = outputs["execute"]["properties"]["calls"]["items"]
    assert item["properties"]["outcome"]["enum"] == [
        "ok", "denied", "policy failure", "invalid arguments", "failed", "limit exceeded",
        "interrupted", "not run", "declined", "replay diverged",
    ]  # fmt: skip


async def test_descriptions_teach_the_contract(mode: str) -> None:
    server = build()
    async with Client(mcp_for(server), mode=mode) as client:
        tools = {t.name: t.description or "" for t in (await client.list_tools()).tools}
    assert "describe_api" in tools["search_api"]
    assert "execute" in tools["describe_api"]
    ex = tools["execute"]
    for needle in (
        "def main():",
        "keyword arguments only",
        "while",
        "f-strings",
        "load",
        "import",
        "filter",
        "map",
        "set",
        "print",
        "invalid program: <codemode>:LINE:COL",
        "invalid capability arguments",
        "permission denied",
        "authorization policy failure",
        "resource limit exceeded",
        "capability failed",
        "internal failure",
        "unauthenticated",
    ):
        assert needle in ex, needle


# ---------------------------------------------------------------------------------------------- flow


async def test_search_describe_execute_flow(mode: str) -> None:
    server = build()
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            found = success_value(await call(client, "search_api", query="create record"))
            assert found["truncated"] is False
            names = [r["name"] for r in found["results"]]
            assert names[0] == "records.create", names
            assert set(found["results"][0]) == {"name", "signature", "summary"}

            desc = success_value(await call(client, "describe_api", name="records.create"))
            assert desc["name"] == "records.create"
            assert desc["signature"].startswith("records.create(*, title: str")
            assert [i["name"] for i in desc["input"]] == ["title", "body", "tags"]
            assert desc["input"][0] == {"name": "title", "type": "str", "required": True}
            assert {"name": "id", "type": "int", "required": True} in desc["output"]
            assert "records.entry.create" not in str(desc)

            source = """
def main():
    a = records.create(title="Buy milk", body="two litres", tags=["shopping", "home"])
    b = records.create(title="Call Bob", tags=["work"])
    found = records.search(text="milk")
    got = records.get(id=b["id"])
    return {"a": a["id"], "b": got["title"], "found": [r["title"] for r in found["records"]],
            "tags": a["tags"], "truncated": found["truncated"]}
"""
            value = execute_value(await call(client, "execute", source=source))
            assert value == {
                "a": 1,
                "b": "Call Bob",
                "found": ["Buy milk"],
                "tags": ["shopping", "home"],
                "truncated": False,
            }
            # The store persists across executes (each in a fresh worker).
            again = execute_value(
                await call(client, "execute", source='def main():\n    return records.get(id=1)["body"]\n')
            )
            assert again == "two litres"
    finally:
        await server.aclose()


async def test_search_blank_and_describe_unknown(mode: str) -> None:
    server = build()
    async with Client(mcp_for(server), mode=mode) as client:
        assert success_value(await call(client, "search_api", query="  the of  ")) == {
            "results": [],
            "truncated": False,
        }
        assert error_text(await call(client, "describe_api", name="records.nope")) == "capability not found"
        # exact lookup: no trimming, no case folding (the closest name is suggested)
        near = "capability not found: did you mean records.get?"
        assert error_text(await call(client, "describe_api", name=" records.get")) == near
        assert error_text(await call(client, "describe_api", name="Records.get")) == near


async def test_execute_returns_none_and_nested(mode: str) -> None:
    server = build(records=False)
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            assert (
                execute_value(await call(client, "execute", source="def main():\n    return None\n")) is None
            )
            src = 'def main():\n    return {"t": (1, 2.5, "x", True), "n": [None]}\n'
            assert execute_value(await call(client, "execute", source=src)) == {
                "t": [1, 2.5, "x", True],
                "n": [None],
            }
    finally:
        await server.aclose()


async def test_disabled_capability_is_absent(mode: str) -> None:
    server = build(disabled=["records.entry.delete"])
    async with Client(mcp_for(server), mode=mode) as client:
        found = success_value(await call(client, "search_api", query="delete record"))
        assert "records.delete" not in [r["name"] for r in found["results"]]
        missing = error_text(await call(client, "describe_api", name="records.delete"))
        assert missing.startswith("capability not found") and "records.delete" not in missing


# ---------------------------------------------------------------------------------------------- errors


async def test_unauthenticated_resolver_failures(mode: str) -> None:
    server = build()

    class EmptyResolver:
        def resolve(self, request: Any) -> authz.Subject:
            return authz.Subject("")

    class AsyncFailing:
        async def resolve(self, request: Any) -> authz.Subject:
            raise PermissionError("token expired for alice@example.com")

    class WrongType:
        def resolve(self, request: Any) -> Any:
            return "alice"

    for resolver in (
        CountingResolver(fail=RuntimeError("bad token abc123")),
        EmptyResolver(),
        AsyncFailing(),
        WrongType(),
        ContextSubject(),  # nothing stored a subject
    ):
        async with Client(create_server(server, resolver), mode=mode) as client:
            for tool, arg in TOOL_ARGS.items():
                text = error_text(await call(client, tool, **{arg: "records.get"}))
                assert text == "unauthenticated", (resolver, tool)


async def test_async_resolver_and_request_context(mode: str) -> None:
    server = build()
    seen: list[Any] = []

    class AsyncResolver:
        async def resolve(self, request: Any) -> authz.Subject:
            seen.append(request)
            await asyncio.sleep(0)
            return authz.Subject("bob")

    async with Client(create_server(server, AsyncResolver()), mode=mode) as client:
        success_value(await call(client, "search_api", query="record"))
    assert len(seen) == 1
    assert seen[0] is not None and getattr(seen[0], "method", None) == "tools/call"


async def test_context_subject_reads_with_subject(mode: str) -> None:
    server = build()
    try:
        with authz.with_subject(authz.Subject("carol")):
            async with Client(create_server(server, ContextSubject()), mode=mode) as client:
                src = 'def main():\n    return records.create(title="mine")["id"]\n'
                assert execute_value(await call(client, "execute", source=src)) == 1
    finally:
        await server.aclose()


async def test_records_are_per_subject(mode: str) -> None:
    server = build()
    try:
        async with Client(create_server(server, StaticSubject("alice")), mode=mode) as alice:
            src = 'def main():\n    return records.create(title="alice secret")["id"]\n'
            rid = execute_value(await call(alice, "execute", source=src))
        async with Client(create_server(server, StaticSubject("mallory")), mode=mode) as mallory:
            src = f"def main():\n    return records.get(id={rid})\n"
            assert error_text(await call(mallory, "execute", source=src)) == (
                f"capability failed: record {rid} not found"
            )
            src = 'def main():\n    return records.search()["records"]\n'
            assert execute_value(await call(mallory, "execute", source=src)) == []
    finally:
        await server.aclose()


async def test_invalid_program_with_position(mode: str) -> None:
    server = build()
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            text = error_text(await call(client, "execute", source="def main(:\n    return 1\n"))
            assert re.fullmatch(r"invalid program: <codemode>:\d+:\d+: .+", text), text
            text = error_text(await call(client, "execute", source="x = 1\n"))
            assert text.startswith("invalid program"), text
            text = error_text(await call(client, "execute", source="def main():\n    return main\n"))
            assert text.startswith("invalid program"), text
            src = "def main():\n    for i in range(3):\n        pass\n    return undefined_name\n"
            text = error_text(await call(client, "execute", source=src))
            assert re.fullmatch(r"invalid program: <codemode>:4:\d+: .+", text), text
    finally:
        await server.aclose()


async def test_invalid_capability_arguments(mode: str) -> None:
    server = build()
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            src = 'def main():\n    return records.get(id="seven")\n'
            assert error_text(await call(client, "execute", source=src)) == (
                'invalid capability arguments: argument "id" must be int, got str'
            )
            src = "def main():\n    return records.create()\n"
            assert error_text(await call(client, "execute", source=src)) == (
                'invalid capability arguments: missing required argument "title"'
            )
            src = 'def main():\n    return records.create(title="x", tags=["a", 1])\n'
            assert error_text(await call(client, "execute", source=src)) == (
                'invalid capability arguments: argument "tags[1]" must be str, got int'
            )
            src = "def main():\n    return records.get(7)\n"
            text = error_text(await call(client, "execute", source=src))
            assert text.startswith("invalid capability arguments: positional arguments are not accepted")
    finally:
        await server.aclose()


class DenyDeletes:
    def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
        if input.capability_id == "records.entry.delete":
            raise authz.Denied("rule deny_delete: subject alice is not in group admins")


class BrokenPolicy:
    async def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
        raise ValueError("policy.rego:12: undefined ref data.groups.admins")


async def test_permission_denied_and_policy_failure(mode: str) -> None:
    denied = build(authorizer=DenyDeletes())
    broken = build(authorizer=BrokenPolicy())
    try:
        async with Client(mcp_for(denied), mode=mode) as client:
            src = 'def main():\n    r = records.create(title="x")\n    return records.delete(id=r["id"])\n'
            assert error_text(await call(client, "execute", source=src)) == "permission denied"
        async with Client(mcp_for(broken), mode=mode) as client:
            src = 'def main():\n    return records.create(title="x")\n'
            assert error_text(await call(client, "execute", source=src)) == "authorization policy failure"
    finally:
        await denied.aclose()
        await broken.aclose()


async def test_resource_limits(mode: str) -> None:
    server = build(limits=codemode.Limits(max_native_calls=2))
    slow = build(limits=codemode.Limits(max_execution_time=0.5, max_execution_steps=10**12))
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            src = (
                'def main():\n    for i in range(3):\n        records.create(title="n%d" % i)\n    return 1\n'
            )
            assert (
                error_text(await call(client, "execute", source=src))
                == "resource limit exceeded: native calls"
            )
            assert (
                error_text(await call(client, "search_api", query="x" * 257))
                == "resource limit exceeded: query"
            )
            many = " ".join(f"word{i}" for i in range(17))
            assert (
                error_text(await call(client, "search_api", query=many)) == "resource limit exceeded: query"
            )
        async with Client(mcp_for(slow), mode=mode) as client:
            src = "def main():\n    x = 0\n    for i in range(1000000000):\n        x += i\n    return x\n"
            assert error_text(await call(client, "execute", source=src)) == "resource limit exceeded: time"
    finally:
        await server.aclose()
        await slow.aclose()


def _secret_failure(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
    raise RuntimeError("db password hunter2 rejected")


def _agent_failure(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
    raise codemode.AgentError(f"no such item: {args.text}")


async def test_capability_failed_with_and_without_suffix(mode: str) -> None:
    server = build(
        [
            echo_capability("demo.crash", _secret_failure),
            echo_capability("demo.refuse", _agent_failure),
        ],
        records=False,
    )
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            src = 'def main():\n    return demo.crash(text="a")\n'
            assert error_text(await call(client, "execute", source=src)) == "capability failed"
            src = 'def main():\n    return demo.refuse(text="widget-9")\n'
            assert error_text(await call(client, "execute", source=src)) == (
                "capability failed: no such item: widget-9"
            )
    finally:
        await server.aclose()


class ExplodingRuntime:
    name = "exploding"

    async def start(self) -> None:
        return None

    async def spawn(self) -> Any:
        raise RuntimeError("cannot reach /var/run/docker.sock with token s3cr3t")

    async def check(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


async def test_internal_failure(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    server = build(runtime=ExplodingRuntime())
    async with Client(mcp_for(server), mode=mode) as client:
        text = error_text(await call(client, "execute", source="def main():\n    return 1\n"))
        assert text == "internal failure"

        def broken_search(query: str) -> Any:
            raise KeyError("index corrupted near 'secret-term'")

        monkeypatch.setattr(server, "search", broken_search)
        assert error_text(await call(client, "search_api", query="records")) == "internal failure"


async def test_every_error_text_is_coarse(mode: str) -> None:
    server = build()
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            for source in (
                "def main(:",
                "def main(x):\n    return x\n",
                'def main():\n    return records.get(id="x")\n',
                "def main():\n    return records.get(id=12345)\n",
                'def main():\n    fail("boom")\n',
            ):
                assert_coarse(error_text(await call(client, "execute", source=source)))
    finally:
        await server.aclose()


# ---------------------------------------------------------------------------------------------- schema


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("search_api", {}),
        ("search_api", None),
        ("search_api", {"query": 5}),
        ("search_api", {"query": None}),
        ("search_api", {"query": ["records"]}),
        ("search_api", {"query": "records", "limit": 5}),
        ("search_api", {"q": "records"}),
        ("describe_api", {"name": True}),
        ("describe_api", {"name": "records.get", "extra": "x"}),
        ("describe_api", {"query": "records.get"}),
        ("execute", {}),
        ("execute", {"source": {"code": "def main(): return 1"}}),
        ("execute", {"source": "def main():\n    return 1\n", "subject": "admin"}),
        ("execute", {"code": "def main():\n    return 1\n"}),
    ],
)
async def test_schema_violations_rejected_before_resolver(mode: str, tool: str, arguments: Any) -> None:
    server = build()
    resolver = CountingResolver()
    async with Client(create_server(server, resolver), mode=mode) as client:
        result = await call_raw(client, tool, arguments)
    text = error_text(result)
    assert text == (
        f'invalid tool arguments: {tool} takes exactly one argument, "{TOOL_ARGS[tool]}", a string'
    )
    assert resolver.calls == 0


async def test_unknown_tool_is_a_protocol_error(mode: str) -> None:
    server = build()
    resolver = CountingResolver()
    async with Client(create_server(server, resolver), mode=mode) as client:
        with pytest.raises(Exception) as info:
            result = await call(client, "records.get", id="1")
            raise AssertionError(f"expected an MCP error, got {result!r}")
    assert "unknown tool" in str(info.value)
    assert resolver.calls == 0


async def test_resolver_runs_once_per_call(mode: str) -> None:
    server = build()
    resolver = CountingResolver()
    async with Client(create_server(server, resolver), mode=mode) as client:
        await call(client, "search_api", query="records")
        await call(client, "describe_api", name="records.get")
        await call(client, "describe_api", name="nope.nope")
    assert resolver.calls == 3


# ---------------------------------------------------------------------------------------------- cancel


async def test_cancellation_kills_the_worker(mode: str) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def sleepy(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return EchoOut(args.text)

    runtime = RecordingRuntime(codemode.ProcessRuntime())
    server = build(
        [echo_capability("demo.sleep", sleepy)],
        records=False,
        runtime=runtime,
        limits=codemode.Limits(max_execution_time=60),
    )
    outcome: list[Any] = []
    try:
        async with Client(mcp_for(server), mode=mode) as client:

            async def run() -> None:
                src = 'def main():\n    return demo.sleep(text="zz")\n'
                outcome.append(await call(client, "execute", source=src))

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                with anyio.fail_after(20):
                    await started.wait()
                tg.cancel_scope.cancel()
            assert outcome == []
            assert await wait_until(cancelled.is_set, 10), "the handler was not cancelled"
            assert len(runtime.sandboxes) == 1
            assert await wait_until(lambda: not runtime.sandboxes[0].alive(), 10), "worker still alive"
            # The connection is still usable afterwards.
            src = "def main():\n    return 7\n"
            assert execute_value(await call(client, "execute", source=src)) == 7
    finally:
        await server.aclose()


def test_structured_content_is_exactly_the_value(mode: str) -> None:
    # The helpers used above enforce it; this guards the helper against silently weakening.
    blocks = [
        types.TextContent(type="text", text='{"result":1}'),
        types.TextContent(type="text", text='{"calls":[]}'),
    ]
    r = types.CallToolResult(content=blocks, structured_content={"result": 1, "calls": []})
    assert execute_value(r) == 1
    for broken in (
        types.CallToolResult(content=blocks[:1], structured_content={"result": 1, "calls": []}),
        types.CallToolResult(content=blocks, structured_content={"result": 1}),
        types.CallToolResult(content=blocks, structured_content={"result": 2, "calls": []}),
        types.CallToolResult(content=blocks, structured_content={"result": 1, "calls": [], "x": 0}),
    ):
        with pytest.raises(AssertionError):
            execute_value(broken)
