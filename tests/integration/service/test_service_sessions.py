"""Stateful mode: sessions are bounded per subject and in total, and closed when
idle, so one tenant opening sessions in a loop cannot deny the others. Real uvicorn, raw HTTP."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from codemode.service import create_app
from codemode.startup.config import ConfigError
from tests.support.service import INITIALIZE, PACK_SPEC, metric, scrape, service, settings, write_token_file

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
        for _ in range(20):  # each closes her own session idle the longest: she never holds more than 3
            opened.append(await _open(http, srv.mcp_url, tokens["mallory"]))
            assert opened[-1].status_code == 200
        assert srv.service.sessions.by_subject == {"mallory": 3}
        # Another tenant opens and uses a session.
        alice = await _open(http, srv.mcp_url, tokens["alice"])
        assert alice.status_code == 200
        assert await _works(http, srv.mcp_url, tokens["alice"], alice.headers["mcp-session-id"])
        # The total bound: 3 + 1 + 1 = 5, the next subject gets 503.
        assert (await _open(http, srv.mcp_url, tokens["bob"])).status_code == 200
        full = await _open(http, srv.mcp_url, tokens["carol"])
        assert full.status_code == 503 and full.json() == {"error": "too many open sessions"}
        # Ending a session frees its place.
        sid = opened[-1].headers["mcp-session-id"]
        end = await http.delete(srv.mcp_url, headers=_headers(tokens["mallory"], **{"mcp-session-id": sid}))
        assert end.status_code == 200
        assert (await _open(http, srv.mcp_url, tokens["carol"])).status_code == 200
        manager = srv.service.sessions
        assert manager.by_subject == {"mallory": 2, "alice": 1, "bob": 1, "carol": 1}
        samples = await scrape(srv.metrics_url)
        assert metric(samples, "codemode_mcp_requests_refused_total", bound="session_subject") == 0
        assert metric(samples, "codemode_mcp_requests_refused_total", bound="session_total") == 1


async def test_idle_sessions_are_closed(tmp_path: Path) -> None:
    tokens, cfg = _cfg(tmp_path, session_idle_timeout=1.0)
    async with service(cfg) as srv, httpx.AsyncClient(timeout=10) as http:
        opened = [await _open(http, srv.mcp_url, tokens["mallory"]) for _ in range(3)]
        assert srv.service.sessions.by_subject == {"mallory": 3}
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


async def _gone(http: httpx.AsyncClient, url: str, token: str, sid: str) -> bool:
    extra = {"mcp-session-id": sid, "MCP-Protocol-Version": VERSION}
    resp = await http.post(
        url, json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, headers=_headers(token, **extra)
    )
    return resp.status_code == 404


async def test_a_subject_that_forgets_delete_loses_its_oldest_idle_session_not_its_access(
    tmp_path: Path,
) -> None:
    """Found by review: a client that never sent DELETE locked its own subject out (429) until its
    sessions' idle timeout, 5 minutes by default. At its bound, the subject's session idle the
    longest is closed instead; another subject's never is."""
    tokens, cfg = _cfg(tmp_path)
    async with service(cfg) as srv, httpx.AsyncClient(timeout=10) as http:
        url, mallory = srv.mcp_url, tokens["mallory"]
        sids = [(await _open(http, url, mallory)).headers["mcp-session-id"] for _ in range(3)]
        bob = (await _open(http, url, tokens["bob"])).headers["mcp-session-id"]
        assert await _works(http, url, mallory, sids[0])  # sids[1] is now the one idle the longest
        fourth = await _open(http, url, mallory)
        assert fourth.status_code == 200
        assert await _gone(http, url, mallory, sids[1])
        for sid in (sids[0], sids[2], fourth.headers["mcp-session-id"]):
            assert await _works(http, url, mallory, sid)
        assert await _works(http, url, tokens["bob"], bob)
        assert srv.service.sessions.by_subject == {"mallory": 3, "bob": 1}
        # The total bound is not the subject's: carol at the total gets 503, nobody is closed.
        assert (await _open(http, url, tokens["alice"])).status_code == 200
        full = await _open(http, url, tokens["carol"])
        assert full.status_code == 503
        assert srv.service.sessions.by_subject == {"mallory": 3, "bob": 1, "alice": 1}


async def test_a_session_with_a_request_in_flight_is_not_idle(tmp_path: Path) -> None:
    tokens, cfg = _cfg(tmp_path)
    async with service(cfg) as srv, httpx.AsyncClient(timeout=10) as http:
        url, mallory = srv.mcp_url, tokens["mallory"]
        sids = [(await _open(http, url, mallory)).headers["mcp-session-id"] for _ in range(3)]
        async with contextlib.AsyncExitStack() as streams:
            held = {}
            for sid in sids:  # an open event stream (GET) on each: every session has a request in flight
                extra = {"mcp-session-id": sid, "MCP-Protocol-Version": VERSION}
                stream = http.stream("GET", url, headers=_headers(mallory, **extra))
                held[sid] = await streams.enter_async_context(stream)
                assert held[sid].status_code == 200
            refused = await _open(http, url, mallory)
            assert refused.status_code == 429 and refused.json() == {"error": "too many open sessions"}
            # The stream of the last opened session ends: that one is idle now, and the only one.
            await held[sids[2]].aclose()
            async with asyncio.timeout(10):
                while (opened := await _open(http, url, mallory)).status_code != 200:
                    assert opened.status_code == 429  # until the server has seen the stream end
                    await asyncio.sleep(0.05)
            assert await _gone(http, url, mallory, sids[2])
            assert not any([await _gone(http, url, mallory, sid) for sid in sids[:2]])


def test_the_per_subject_bound_must_be_the_smaller(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    cfg = settings(token_file=tokens.path, mcp_stateless=False, max_sessions=10, max_sessions_per_subject=10)
    with pytest.raises(ConfigError, match="--max-sessions-per-subject / CODEMODE_MAX_SESSIONS_PER_SUBJECT"):
        create_app(cfg)
