"""Two replicas sharing a real PostgreSQL store: two HTTP services (real
uvicorn servers, stateless MCP, the Rego policy that asks about deletes) with ``--store
postgresql://...``. A question asked on one is resumed by the retry on the other; the same answer
sent to both at once runs the pending call once (the loser gets -32602); another tenant's retry
on either gets -32602. Required with CI=true (tests/support/postgres.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.integration.mcp.test_approval_served import http_settings
from tests.support import postgres
from tests.support.approval import ACCEPT, User, create_then_delete
from tests.support.mcp_client import execute_value
from tests.support.service import service

ACCEPTED = {"approve": ACCEPT}


@contextlib.asynccontextmanager
async def mcp_client(url: str, token: str) -> AsyncIterator[Client]:
    """The official client over streamable HTTP, declaring form elicitation (2026-07-28)."""
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=60)
    )
    transport = streamable_http_client(url, http_client=http)
    async with http, Client(transport, mode="auto", elicitation_callback=User()) as client:
        yield client


def replica(tmp_path: Path, dsn: str) -> tuple[dict[str, str], Any]:
    tokens, cfg = http_settings(tmp_path, ["alice", "mallory"], stateless=True)
    records = tmp_path / "records.sqlite3"
    cfg = cfg.model_copy(update={"store": dsn, "pack_options": [f"CODEMODE_RECORDS_DB={records}"]})
    return tokens, cfg


async def ask(client: Any, source: str) -> types.InputRequiredResult:
    first = await client.session.call_tool("execute", {"source": source}, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult), first
    return first


async def retry(client: Any, source: str, state: str) -> Any:
    return await client.session.call_tool(
        "execute",
        {"source": source},
        input_responses=ACCEPTED,
        request_state=state,
        allow_input_required=True,
    )


async def test_a_question_asked_on_one_replica_is_resumed_on_the_other_once(
    tmp_path: Path, postgres_dsn: str
) -> None:
    postgres.reset(postgres_dsn)
    tokens, cfg = replica(tmp_path, postgres_dsn)
    src = create_then_delete()
    update = create_then_delete("eggs")
    async with (
        service(cfg) as one,
        service(cfg) as two,
        mcp_client(one.mcp_url, tokens["alice"]) as a1,
        mcp_client(two.mcp_url, tokens["alice"]) as a2,
        mcp_client(two.mcp_url, tokens["mallory"]) as m2,
    ):
        first = await ask(a1, src)
        with pytest.raises(MCPError) as refused:
            await retry(m2, src, first.request_state or "")
        assert refused.value.error.code == types.INVALID_PARAMS
        done = await retry(a2, src, first.request_state or "")
        assert execute_value(done) == {"id": 1, "deleted": True}

        second = await ask(a1, update)
        results = await asyncio.gather(
            retry(a1, update, second.request_state or ""),
            retry(a2, update, second.request_state or ""),
            return_exceptions=True,
        )
        won = [r for r in results if isinstance(r, types.CallToolResult)]
        lost = [r for r in results if isinstance(r, MCPError)]
        assert len(won) == 1 and len(lost) == 1, results
        assert lost[0].error.code == types.INVALID_PARAMS
        assert execute_value(won[0]) == {"id": 2, "deleted": True}
        again = await a2.call_tool(
            "execute", {"source": 'def main():\n    return records.create(title="z")\n'}
        )
        assert execute_value(again)["id"] == 3, "each create ran once"
    rows = postgres.query(postgres_dsn, "SELECT count(*) FROM codemode_suspensions")
    assert rows[0][0] == 0
