"""Approval asked of the user over the served transports: a real ``codemode serve
--stdio`` with a Rego policy that answers ``"ask"``, and the HTTP service in stateful mode, through
the official MCP client's elicitation callback; then hostile clients written by hand (raw JSON-RPC)
that never answer, answer twice, answer for another request, or answer another tenant's question.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.support.approval import ASK_REGO, User, create_then_delete
from tests.support.mcp_client import RECORDS_PACK, child_env, cli_command, error_text, execute_value, ledger
from tests.support.service import RECORDS_SPEC, service, settings, write_token_file

pytestmark = pytest.mark.slow

DECISION = "data.codemode.decision"
ACCEPT_ANSWER = {"action": "accept", "content": {"approve": True}}


def policy(tmp_path: Path) -> Path:
    path = tmp_path / "ask.rego"
    path.write_text(ASK_REGO)
    return path


def http_settings(tmp_path: Path, subjects: list[str], *, stateless: bool) -> tuple[Any, Any]:
    """Tokens for ``subjects`` and the service's settings with the asking Rego policy."""
    tokens = write_token_file(tmp_path, subjects)
    cfg = settings(
        packs=[RECORDS_SPEC],
        token_file=tokens.path,
        mcp_stateless=stateless,
        allow_all=False,
        rego_policy=[policy(tmp_path)],
        rego_decision=DECISION,
    )
    return tokens, cfg


def stdio_argv(tmp_path: Path, *flags: str) -> list[str]:
    return cli_command(
        "serve", "--stdio", "--pack", RECORDS_PACK, "--rego-policy", str(policy(tmp_path)),
        "--rego-decision", DECISION, *flags,
    )  # fmt: skip


def stdio(tmp_path: Path, *flags: str) -> StdioServerParameters:
    argv = stdio_argv(tmp_path, *flags)
    return StdioServerParameters(command=argv[0], args=argv[1:], env=child_env())


# ------------------------------------------------------------------------ the official client


async def test_stdio_asks_through_the_elicitation_callback(tmp_path: Path) -> None:
    yes, no = User(), User(answer=types.ElicitResult(action="decline"))
    async with Client(stdio(tmp_path), mode="legacy", elicitation_callback=yes) as client:
        result = await client.call_tool("execute", {"source": create_then_delete()})
        assert execute_value(result) == {"id": 1, "deleted": True}
        assert ledger(result) == [("records.create", "ok"), ("records.delete", "ok")]
    assert len(yes.asked) == 1 and "Capability: records.delete" in yes.messages[0]
    async with Client(stdio(tmp_path), mode="legacy", elicitation_callback=no) as client:
        result = await client.call_tool("execute", {"source": create_then_delete()})
        assert error_text(result) == "permission denied"
        assert ledger(result) == [("records.create", "ok"), ("records.delete", "declined")]


async def test_stdio_on_the_2026_protocol_asks_with_an_input_required_result(tmp_path: Path) -> None:
    """The official client's default mode negotiates 2026-07-28, which has no server requests: the
    question comes back as an InputRequiredResult, the client's retry brings the answer."""
    user = User()
    async with Client(stdio(tmp_path), mode="auto", elicitation_callback=user) as client:
        assert client.protocol_version == "2026-07-28"
        result = await client.call_tool("execute", {"source": create_then_delete()})
        assert execute_value(result) == {"id": 1, "deleted": True}
        user.answer = types.ElicitResult(action="decline")
        result = await client.call_tool("execute", {"source": create_then_delete()})
        assert error_text(result) == "permission denied"
    assert len(user.asked) == 2 and "Capability: records.delete" in user.messages[0]


# ------------------------------------------------------------------------ hostile clients, stdio


class RawStdio:
    """A client written by hand: newline-delimited JSON-RPC on a served process's stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()

    async def receive(self, timeout: float = 60) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
            assert line, "the server closed stdout"
            message = json.loads(line)
            if message.get("method", "").startswith("notifications/"):
                continue
            return dict(message)

    async def handshake(self) -> None:
        await self.send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"elicitation": {"form": {}}},
                    "clientInfo": {"name": "hostile", "version": "1"},
                },
            }
        )
        assert (await self.receive())["id"] == 1
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def execute(self, request_id: int, source: str) -> None:
        await self.send(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "tools/call",
                "params": {"name": "execute", "arguments": {"source": source}},
            }
        )

    async def question(self) -> dict[str, Any]:
        message = await self.receive()
        assert message.get("method") == "elicitation/create", message
        return message


@contextlib.asynccontextmanager
async def raw_stdio(tmp_path: Path, *flags: str) -> AsyncIterator[RawStdio]:
    argv = stdio_argv(tmp_path, *flags)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=child_env(),
        limit=1 << 22,
    )
    try:
        client = RawStdio(proc)
        await client.handshake()
        yield client
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def tool_result(message: dict[str, Any]) -> dict[str, Any]:
    result = message["result"]
    return {"is_error": result.get("isError", False), **result["structuredContent"]}


async def test_stdio_a_second_answer_approves_nothing_more(tmp_path: Path) -> None:
    async with raw_stdio(tmp_path) as raw:
        await raw.execute(10, create_then_delete())
        ask = await raw.question()
        answer = {"jsonrpc": "2.0", "id": ask["id"], "result": ACCEPT_ANSWER}
        await raw.send(answer)
        await raw.send(answer)  # again: the question is closed
        done = tool_result(await raw.receive())
        assert done["result"] == {"id": 1, "deleted": True}
        # The next question is a new one: the stale answer (and a replay of it) does not answer it.
        await raw.execute(11, create_then_delete())
        ask2 = await raw.question()
        assert ask2["id"] != ask["id"]
        await raw.send(answer)
        await raw.send({"jsonrpc": "2.0", "id": ask2["id"], "result": {"action": "decline"}})
        done = tool_result(await raw.receive())
        assert done["is_error"] is True and done["error"] == "permission denied"
        assert done["calls"][-1]["outcome"] == "declined"


async def test_stdio_answers_for_another_request_or_none_are_declined_in_time(tmp_path: Path) -> None:
    async with raw_stdio(tmp_path, "--max-approval-time", "2") as raw:
        await raw.execute(20, create_then_delete())
        ask = await raw.question()
        for wrong in (20, ask["id"] + 1000, "x", None):  # the tools/call's own id, unknown ids
            await raw.send({"jsonrpc": "2.0", "id": wrong, "result": ACCEPT_ANSWER})
        await raw.send({"jsonrpc": "2.0", "id": ask["id"], "error": {"code": -1, "message": "no"}})
        done = tool_result(await raw.receive())
        assert done["is_error"] is True and done["calls"][-1]["outcome"] == "declined"
        # never answered at all: declined once max_approval_time has passed
        loop = asyncio.get_running_loop()
        started = loop.time()
        await raw.execute(21, create_then_delete())
        await raw.question()
        done = tool_result(await raw.receive())
        assert done["calls"][-1]["outcome"] == "declined"
        assert 2.0 <= loop.time() - started < 30
        # and the server still serves
        await raw.execute(22, "def main():\n    return 5\n")
        assert tool_result(await raw.receive())["result"] == 5


# ------------------------------------------------------------------------ hostile clients, HTTP

HTTP_ACCEPT = "application/json, text/event-stream"
VERSION = "2025-11-25"


def _headers(token: str, sid: str | None = None) -> dict[str, str]:
    out = {"Authorization": f"Bearer {token}", "Accept": HTTP_ACCEPT, "MCP-Protocol-Version": VERSION}
    if sid is not None:
        out["mcp-session-id"] = sid
    return out


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    async for line in lines:
        if line.startswith("data:") and line[5:].strip():
            yield json.loads(line[5:])


async def test_http_another_tenant_cannot_answer_and_a_second_answer_does_nothing(tmp_path: Path) -> None:
    tokens, cfg = http_settings(tmp_path, ["alice", "mallory"], stateless=False)
    async with service(cfg) as svc, httpx.AsyncClient(timeout=60) as http:
        url = svc.mcp_url
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": VERSION,
                "capabilities": {"elicitation": {"form": {}}},
                "clientInfo": {"name": "raw", "version": "1"},
            },
        }
        opened = await http.post(url, json=init, headers=_headers(tokens["alice"]))
        assert opened.status_code == 200, opened.text
        sid = opened.headers["mcp-session-id"]
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await http.post(url, json=note, headers=_headers(tokens["alice"], sid))).status_code == 202
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "execute", "arguments": {"source": create_then_delete()}},
        }
        async with http.stream("POST", url, json=call, headers=_headers(tokens["alice"], sid)) as stream:
            events = _events(stream.aiter_lines())
            ask = await anext(events)
            assert ask["method"] == "elicitation/create"
            answer = {"jsonrpc": "2.0", "id": ask["id"], "result": ACCEPT_ANSWER}
            # another tenant presenting alice's session cannot answer her question
            stolen = await http.post(url, json=answer, headers=_headers(tokens["mallory"], sid))
            assert stolen.status_code == 404, stolen.text
            # alice answers twice: the call runs once
            for _ in range(2):
                reply = await http.post(url, json=answer, headers=_headers(tokens["alice"], sid))
                assert reply.status_code == 202, reply.text
            done = await anext(events)
        assert done["id"] == 2
        out = done["result"]["structuredContent"]
        assert out["result"] == {"id": 1, "deleted": True}
        assert [c["outcome"] for c in out["calls"]] == ["ok", "ok"]


@pytest.mark.parametrize(
    ("stateless", "mode", "asks"),
    [(False, "legacy", True), (True, "legacy", False), (True, "auto", True), (False, "auto", True)],
    ids=["stateful-handshake", "stateless-handshake", "stateless-2026", "stateful-2026"],
)
async def test_http_asks_through_the_callback_where_the_protocol_can(
    tmp_path: Path, stateless: bool, mode: str, asks: bool
) -> None:
    """The official client's own elicitation callback over streamable HTTP: a handshake client is
    asked on the POST's event stream in stateful mode and cannot be asked in stateless mode (no
    channel); a 2026-07-28 client is asked through InputRequiredResult and its retry in both."""
    tokens, cfg = http_settings(tmp_path, ["alice"], stateless=stateless)
    user = User(answer=types.ElicitResult(action="cancel"))
    async with service(cfg) as svc:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {tokens['alice']}"}, timeout=60)
        transport = streamable_http_client(svc.mcp_url, http_client=http)
        async with http, Client(transport, mode=mode, elicitation_callback=user) as client:
            result = await client.call_tool("execute", {"source": create_then_delete()})
            assert error_text(result) == "permission denied"
            user.answer = types.ElicitResult(action="accept", content={"approve": True})
            result = await client.call_tool("execute", {"source": create_then_delete()})
            if asks:
                assert execute_value(result) == {"id": 2, "deleted": True}
            else:
                assert error_text(result) == "permission denied"
    assert len(user.asked) == (2 if asks else 0)


# ------------------------------------------------------------------------ clients that leave

ASKS_AGAIN = (
    "def main():\n"
    '    r = records.create(title="a")\n'
    "    for i in range(5):\n"
    '        attempt(records.delete, id=r["id"])\n'
    "    return 1\n"
)
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "leaving", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
}


@pytest.mark.parametrize("protocol", ["handshake", "2026-07-28"])
async def test_stdio_eof_while_asked_ends_the_executes_at_once(tmp_path: Path, protocol: str) -> None:
    """Stdio EOF says the client is gone; the server ends (its waiting execute and its
    worker with it) long before the question's or the execute's approval bound."""
    argv = stdio_argv(tmp_path, "--max-approval-time", "60", "--max-approval-wait", "300")
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=child_env(),
        limit=1 << 22,
    )
    try:
        raw = RawStdio(proc)
        call = {"name": "execute", "arguments": {"source": ASKS_AGAIN}}
        if protocol == "handshake":
            await raw.handshake()
            await raw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
            await raw.question()
        else:
            params = {**call, "_meta": MODERN_META}
            await raw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params})
            asked = await raw.receive()
            assert "inputRequests" in asked["result"], asked
        loop = asyncio.get_running_loop()
        left = loop.time()
        assert proc.stdin is not None
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 30)
        assert loop.time() - left < 30
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_http_a_client_ending_its_session_while_asked_frees_the_worker(tmp_path: Path) -> None:
    """The official client leaving a stateful session (DELETE) while its user is asked
    ends the execute at once: the service has nothing in flight right after."""
    tokens, cfg = http_settings(tmp_path, ["alice"], stateless=False)
    hold = asyncio.Event()
    user = User(hold=hold)
    async with service(cfg) as svc:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {tokens['alice']}"}, timeout=60)
        transport = streamable_http_client(svc.mcp_url, http_client=http)
        async with http, Client(transport, mode="legacy", elicitation_callback=user) as client:
            pending = asyncio.ensure_future(client.call_tool("execute", {"source": ASKS_AGAIN}))
            await asyncio.wait_for(user.waiting.wait(), 30)
            # While the user is asked the execute is a record, not a running execute
            assert svc.service.inflight == 0
            loop = asyncio.get_running_loop()
            left = loop.time()
        hold.set()
        pending.cancel()
        for _ in range(300):
            if svc.service.inflight == 0:
                break
            await asyncio.sleep(0.05)
        assert svc.service.inflight == 0
        assert loop.time() - left < 15
