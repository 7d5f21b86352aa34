"""Stateful mode (issue 19 §2): sessions are bounded per subject and in total, and closed when
idle, so one tenant opening sessions in a loop cannot deny the others. Real uvicorn, raw HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from codemode.service import create_app
from codemode.startup.config import ConfigError

from .support_service import INITIALIZE, PACK_SPEC, metric, scrape, service, settings, write_token_file

ACCEPT = "application/json, text/event-stream"
VERSION = "2025-06-18"


def _headers(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Accept": ACCEPT, **extra}


async def _open(http: httpx.AsyncClient, url: str, token: str) -> httpx.Response:
    return await http.post(url, json=INITIALIZE, headers=_headers(token))


async def _works(http: httpx.AsyncClient, url: str, token: str, sid: str) -> bool:
    extra = {"mcp-session-id": sid, "MCP-Protocol-Version": VERSION}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    await http.post(url, json=note, headers=_headers(token, **extra))
    resp = await http.post(
        url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=_headers(token, **extra)
    )
    return resp.status_code == 200 and "execute" in resp.text


def _cfg(tmp_path: Path, **extra: Any) -> tuple[Any, Any]:
    tokens = write_token_file(tmp_path, ["mallory", "alice", "bob", "carol"])
    cfg = settings(
        token_file=tokens.path,
        packs=[PACK_SPEC],
        mcp_stateless=False,
        max_sessions=5,
        max_sessions_per_subject=3,
        **extra,
    )
    return tokens, cfg


async def test_one_tenant_opening_many_sessions_does_not_deny_another(tmp_path: Path) -> None:
    """Before: the SDK's one table of 10,000 sessions for everybody; one tenant filled it and every
    other tenant got 503 for 30 minutes."""
    tokens, cfg = _cfg(tmp_path)
    async with service(cfg) as srv, httpx.AsyncClient(timeout=10) as http:
        opened = [await _open(http, srv.mcp_url, tokens["mallory"]) for _ in range(3)]
        assert [r.status_code for r in opened] == [200] * 3
        for _ in range(20):
            refused = await _open(http, srv.mcp_url, tokens["mallory"])
            assert refused.status_code == 429 and refused.json() == {"error": "too many open sessions"}
        # Another tenant opens and uses a session.
        alice = await _open(http, srv.mcp_url, tokens["alice"])
        assert alice.status_code == 200
        assert await _works(http, srv.mcp_url, tokens["alice"], alice.headers["mcp-session-id"])
        # The total bound: 3 + 1 + 1 = 5, the next subject gets 503.
        assert (await _open(http, srv.mcp_url, tokens["bob"])).status_code == 200
        full = await _open(http, srv.mcp_url, tokens["carol"])
        assert full.status_code == 503 and full.json() == {"error": "too many open sessions"}
        # Ending a session frees its place.
        sid = opened[0].headers["mcp-session-id"]
        end = await http.delete(srv.mcp_url, headers=_headers(tokens["mallory"], **{"mcp-session-id": sid}))
        assert end.status_code == 200
        assert (await _open(http, srv.mcp_url, tokens["carol"])).status_code == 200
        manager = srv.service.sessions
        assert manager.by_subject == {"mallory": 2, "alice": 1, "bob": 1, "carol": 1}
        samples = await scrape(srv.metrics_url)
        assert metric(samples, "codemode_mcp_requests_refused_total", bound="session_subject") == 20
        assert metric(samples, "codemode_mcp_requests_refused_total", bound="session_total") == 1


async def test_idle_sessions_are_closed(tmp_path: Path) -> None:
    tokens, cfg = _cfg(tmp_path, session_idle_timeout=1.0)
    async with service(cfg) as srv, httpx.AsyncClient(timeout=10) as http:
        opened = [await _open(http, srv.mcp_url, tokens["mallory"]) for _ in range(3)]
        assert (await _open(http, srv.mcp_url, tokens["mallory"])).status_code == 429
        async with asyncio.timeout(15):
            while srv.service.sessions.by_subject:
                await asyncio.sleep(0.2)
        sid = opened[0].headers["mcp-session-id"]
        extra = {"mcp-session-id": sid, "MCP-Protocol-Version": VERSION}
        gone = await http.post(
            srv.mcp_url,
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            headers=_headers(tokens["mallory"], **extra),
        )
        assert gone.status_code == 404
        assert (await _open(http, srv.mcp_url, tokens["mallory"])).status_code == 200


def test_the_per_subject_bound_must_be_the_smaller(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    cfg = settings(token_file=tokens.path, mcp_stateless=False, max_sessions=10, max_sessions_per_subject=10)
    with pytest.raises(ConfigError, match="--max-sessions-per-subject / CODEMODE_MAX_SESSIONS_PER_SUBJECT"):
        create_app(cfg)
