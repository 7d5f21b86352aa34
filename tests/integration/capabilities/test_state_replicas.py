"""The state pack on two replicas sharing one real PostgreSQL store: two HTTP services
(real uvicorn servers, stateless MCP, ``--store postgresql://...``, ``--pack
codemode_capabilities.state:pack``), each reached with the official client. A key put through one
is read through the other; another tenant reads nothing on either; a compare-and-set raced from both
replicas at once has one winner. Required with CI=true (tests/support/postgres.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

import codemode
from codemode import authz
from codemode.common.errors import client_text
from codemode.store.postgres import PostgresStore
from codemode_capabilities.state import capabilities
from tests.support import postgres
from tests.support.mcp_client import error_text, execute_value
from tests.support.service import service, settings, write_token_file

STATE_PACK = "codemode_capabilities.state:pack"


@contextlib.asynccontextmanager
async def mcp_client(url: str, token: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=60)
    )
    transport = streamable_http_client(url, http_client=http)
    async with http, Client(transport, mode="auto") as client:
        yield client


async def execute(client: Client, body: str) -> types.CallToolResult:
    return await client.call_tool("execute", {"source": "def main():\n    " + body + "\n"})


async def test_two_replicas_on_one_postgresql_share_a_subjects_keys_and_nobody_elses(
    tmp_path: Path, postgres_dsn: str
) -> None:
    postgres.reset(postgres_dsn)
    tokens = write_token_file(tmp_path, ["alice", "bob"])
    cfg = settings(
        packs=[STATE_PACK], token_file=tokens.path, mcp_stateless=True, store=postgres_dsn, pack_options=[]
    )
    async with (
        service(cfg) as one,
        service(cfg) as two,
        mcp_client(one.mcp_url, tokens["alice"]) as a1,
        mcp_client(two.mcp_url, tokens["alice"]) as a2,
        mcp_client(two.mcp_url, tokens["bob"]) as b2,
        mcp_client(one.mcp_url, tokens["bob"]) as b1,
    ):
        put = await execute(a1, "return state.put(key='plan', value={'step': 1, 'done': [True]})")
        assert execute_value(put) == {"version": 1}
        got = execute_value(await execute(a2, "return state.get(key='plan')"))
        assert got == {"found": True, "value": {"step": 1, "done": [True]}, "version": 1}
        for bob in (b1, b2):
            nothing = execute_value(await execute(bob, "return [state.get(key='plan'), state.list()]"))
            assert nothing == [{"found": False, "value": None, "version": 0}, {"keys": []}]

        # Both replicas try to move version 1 on at the same moment: one wins, one conflicts.
        race = "return state.put(key='plan', value={'step': %d}, expect=1)"
        first, second = await asyncio.gather(execute(a1, race % 2), execute(a2, race % 3))
        outcomes = sorted([error_text(r) if r.is_error else "ok" for r in (first, second)])
        assert outcomes == ["capability failed: version conflict", "ok"], outcomes
        final = execute_value(await execute(a1, "return state.get(key='plan')"))
        assert final["value"]["step"] in (2, 3) and final["version"] > 1
    rows = postgres.query(postgres_dsn, "SELECT subject_id, key FROM codemode_state ORDER BY key")
    assert [r[1] for r in rows] == ["plan"]


async def test_a_postgresql_that_stops_answering_is_an_internal_failure_not_a_hang(
    postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A frozen server (connections open, nothing answers) and a gone one: the state call ends as
    ``internal failure`` within the store's timeout (1 s), not at the execute's deadline (which would
    be ``resource limit exceeded: time``); the host log says why, the client nothing more."""
    postgres.reset(postgres_dsn)
    relay = postgres.Relay(postgres_dsn)
    through = await relay.start()
    builder = codemode.Builder(
        authorizer=authz.allow_all(),
        store=PostgresStore(through, timeout=1.0),
        limits=codemode.Limits(max_execution_time=20.0),
    )
    server = builder.register(*capabilities()).build()
    get = "def main():\n    return attempt(state.get, key='k')\n"
    try:
        async with server:
            put = "def main():\n    return state.put(key='k', value=1)\n"
            assert await server.execute(put, subject=authz.Subject("alice")) == {"version": 1}
            relay.freeze()
            with pytest.raises(codemode.Internal) as frozen:
                await server.execute(get, subject=authz.Subject("alice"))
            assert client_text(frozen.value) == "internal failure"
            await relay.cut()
            with pytest.raises(codemode.Internal):
                await server.execute(get, subject=authz.Subject("alice"))
    finally:
        await relay.cut()
    assert "the store could not answer" in caplog.text
