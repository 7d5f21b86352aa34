"""Shared helpers for the MCP tests (no tests here). Imported by the integration and adversarial tests."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mcp_types as types
from mcp import Client
from pydantic import BaseModel

import codemode
from codemode import authz
from codemode.common.errors import LIMIT_KINDS
from codemode.common.outcomes import LEDGER_OUTCOMES
from codemode.mcp import StaticSubject, create_server

REPO = Path(__file__).resolve().parents[2]
RECORDS_PACK = "codemode_capabilities.records:pack"
CLIENT_MODES = ("auto", "legacy")
ERROR_TEXTS = {
    "unauthenticated",
    "capability not found",
    "invalid program",
    "invalid capability arguments",
    "permission denied",
    "authorization policy failure",
    "resource limit exceeded",
    "capability failed",
    "internal failure",
}


class CountingResolver:
    """A resolver that counts its calls and returns a fixed subject (or raises)."""

    def __init__(self, subject_id: str = "alice", *, fail: BaseException | None = None) -> None:
        self.subject_id = subject_id
        self.fail = fail
        self.calls = 0

    def resolve(self, request: Any) -> authz.Subject:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return authz.Subject(self.subject_id)


class RecordingRuntime:
    """Wraps a runtime and remembers every sandbox it spawned."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = f"recording({inner.name})"
        self.sandboxes: list[Any] = []

    async def start(self) -> None:
        await self.inner.start()

    async def spawn(self) -> Any:
        sandbox = await self.inner.spawn()
        self.sandboxes.append(sandbox)
        return sandbox

    async def check(self) -> None:
        await self.inner.check()

    async def aclose(self) -> None:
        await self.inner.aclose()


def build(
    capabilities: Sequence[codemode.Capability] = (),
    *,
    authorizer: Any = None,
    limits: codemode.Limits | None = None,
    runtime: Any = None,
    records: bool = True,
    disabled: Sequence[str] = (),
) -> codemode.Server:
    """A server with the records pack (in-memory store) plus ``capabilities``."""
    from codemode_capabilities.records import RecordStore
    from codemode_capabilities.records import capabilities as record_caps

    builder = codemode.Builder(
        authorizer=authorizer if authorizer is not None else authz.allow_all(),
        limits=limits,
        runtime=runtime,
        disabled=list(disabled),
    )
    if records:
        builder.register(*record_caps(RecordStore()))
    builder.register(*capabilities)
    return builder.build()


def mcp_for(server: codemode.Server, resolver: Any = None) -> Any:
    return create_server(server, resolver if resolver is not None else StaticSubject("alice"))


def trace_meta(**fields: str) -> types.RequestParamsMeta:
    """A request's ``_meta`` carrying W3C trace context (``traceparent``, ``tracestate``): keys the
    MCP types allow as extra items, which the type checker does not model."""
    return cast(types.RequestParamsMeta, fields)


async def call(client: Client, tool: str, **arguments: Any) -> types.CallToolResult:
    return await client.call_tool(tool, arguments)


async def call_raw(client: Client, tool: str, arguments: Any) -> types.CallToolResult:
    return await client.call_tool(tool, arguments)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def execute_report(result: types.CallToolResult) -> dict[str, Any]:
    """The ``structuredContent`` of an ``execute`` result, success or error, after checking its shape
    (docs/reference/tools.md): the first text block is the compact ``{"result"}`` or the error text,
    the second the compact ``{"calls"}``, a third (non-empty prints only) the compact ``{"prints"}``."""
    out = result.structured_content
    assert isinstance(out, dict), dump(result)
    assert all(isinstance(block, types.TextContent) for block in result.content), dump(result)
    texts = [block.text for block in result.content]  # type: ignore[union-attr]
    if result.is_error:
        assert set(out) in ({"error", "calls"}, {"error", "calls", "prints"}), dump(result)
        assert texts[0] == out["error"], dump(result)
    else:
        assert set(out) in ({"result", "calls"}, {"result", "calls", "prints"}), dump(result)
        assert texts[0] == _compact({"result": out["result"]}), dump(result)
    calls = out["calls"]
    assert isinstance(calls, list), dump(result)
    for entry in calls:
        assert set(entry) == {"capability", "outcome"} and entry["outcome"] in LEDGER_OUTCOMES, entry
    expected = [texts[0], _compact({"calls": calls})]
    if out.get("prints"):
        expected.append(_compact({"prints": out["prints"]}))
    assert texts == expected, dump(result)
    return out


def error_text(result: types.CallToolResult) -> str:
    """The approved text of an isError result (asserts the error shape: one text block for
    search_api and describe_api, the execute report's shape for execute)."""
    assert result.is_error is True, dump(result)
    if result.structured_content is not None:
        return str(execute_report(result)["error"])
    assert len(result.content) == 1, dump(result)
    block = result.content[0]
    assert isinstance(block, types.TextContent), dump(result)
    return block.text


def success_value(result: types.CallToolResult) -> Any:
    """The structured value of a success result (asserts the one-text-mirror shape)."""
    assert result.is_error is False, dump(result)
    assert len(result.content) == 1, dump(result)
    block = result.content[0]
    assert isinstance(block, types.TextContent), dump(result)
    assert json.loads(block.text) == result.structured_content
    assert block.text == json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False), (
        "the mirror must be compact JSON"
    )
    return result.structured_content


def execute_value(result: types.CallToolResult) -> Any:
    """``main()``'s value of a successful execute (asserts the execute report's shape)."""
    assert result.is_error is False, dump(result)
    return execute_report(result)["result"]


def ledger(result: types.CallToolResult) -> list[tuple[str, str]]:
    """The call ledger of an execute result, as (capability, outcome) pairs."""
    return [(c["capability"], c["outcome"]) for c in execute_report(result)["calls"]]


def dump(result: BaseModel) -> str:
    """The whole response as it would be serialized (every field, aliases, nulls included)."""
    return result.model_dump_json(by_alias=True)


def assert_coarse(text: str) -> None:
    """``text`` is an error text of docs/reference/errors.md, or one of the approved suffix forms."""
    if text in ERROR_TEXTS:
        return
    for prefix in ("invalid program: ", "invalid capability arguments: ", "capability failed: "):
        if text.startswith(prefix):
            return
    if text.startswith("capability not found: did you mean ") and text.endswith("?"):
        return
    if text.removeprefix("resource limit exceeded: ") in LIMIT_KINDS:
        return
    raise AssertionError(f"not an approved error text: {text!r}")


def cli_command(*args: str) -> list[str]:
    """``codemode ...`` as a subprocess argv (the console script when installed, else -m)."""
    script = Path(sys.executable).with_name("codemode")
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-m", "codemode.cli", *args]


def child_env(**extra: str) -> dict[str, str]:
    """A minimal environment for a server subprocess (no inherited CODEMODE_* settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEMODE_")}
    env.update(extra)
    return env


async def wait_until(predicate: Any, timeout: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(predicate())


@dataclass
class EchoIn:
    text: str


@dataclass
class EchoOut:
    text: str


def echo_capability(name: str = "demo.echo", handler: Any = None, **kw: Any) -> codemode.Capability:
    """A capability over ``EchoIn -> EchoOut``; ``handler`` defaults to echoing."""

    def echo(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
        return EchoOut(args.text)

    return codemode.Capability(
        name=name, summary=kw.pop("summary", f"Echo text back ({name})."), handler=handler or echo, **kw
    )
