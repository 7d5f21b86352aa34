"""Connections bounded per tenant: no endless idle event streams, open requests capped per subject
and in total, idle streams closed, repeated log lines rate-limited."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import httpx

from codemode.service.logfilter import RepeatFilter
from tests.support.service import INITIALIZE, PACK_SPEC, execute, service, settings, write_token_file

SLOW = "def main():\n    return svc.slow(seconds=2.0)['value']\n"
ECHO = "def main():\n    return svc.echo(value='x')['value']\n"
ACCEPT = "application/json, text/event-stream"


def _headers(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Accept": ACCEPT, **extra}


async def test_a_stateless_event_stream_is_refused_not_held_open(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["mallory", "alice"])
    async with service(settings(token_file=tokens.path, packs=[PACK_SPEC])) as srv:
        async with httpx.AsyncClient(timeout=5) as http:
            t0 = time.monotonic()
            statuses = []
            for _ in range(40):  # before: each of these stayed open forever
                resp = await http.get(srv.mcp_url, headers=_headers(tokens["mallory"]))
                statuses.append(resp.status_code)
            assert set(statuses) == {405} and time.monotonic() - t0 < 5
            assert resp.headers["allow"] == "POST"
        assert await execute(srv.mcp_url, tokens["alice"], ECHO) == {"result": "x"}


async def test_open_requests_are_bounded_per_subject_and_others_still_run(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["mallory", "alice"])
    cfg = settings(token_file=tokens.path, packs=[PACK_SPEC], max_open_requests_per_subject=2)
    async with service(cfg) as srv:
        held = [asyncio.ensure_future(execute(srv.mcp_url, tokens["mallory"], SLOW)) for _ in range(2)]
        async with asyncio.timeout(10):
            while srv.service.guard.open.get("mallory", 0) < 2:
                await asyncio.sleep(0.02)
        async with httpx.AsyncClient(timeout=5) as http:
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
            resp = await http.post(
                srv.mcp_url,
                json=body,
                headers=_headers(tokens["mallory"], **{"MCP-Protocol-Version": "2025-06-18"}),
            )
            assert resp.status_code == 429 and resp.headers["retry-after"] == "1"
        assert await execute(srv.mcp_url, tokens["alice"], ECHO) == {"result": "x"}
        assert [await h for h in held] == [{"result": "slept"}] * 2
        assert srv.service.guard.open == {} and srv.service.guard.open_total == 0


async def test_open_requests_are_bounded_in_total(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["a", "b", "c"])
    cfg = settings(token_file=tokens.path, packs=[PACK_SPEC], max_open_requests=2)
    async with service(cfg) as srv:
        held = [asyncio.ensure_future(execute(srv.mcp_url, tokens[s], SLOW)) for s in ("a", "b")]
        async with asyncio.timeout(10):
            while srv.service.guard.open_total < 2:
                await asyncio.sleep(0.02)
        async with httpx.AsyncClient(timeout=5) as http:
            resp = await http.post(srv.mcp_url, json={}, headers=_headers(tokens["c"]))
            assert resp.status_code == 429
        await asyncio.gather(*held)


async def test_an_idle_stateful_event_stream_is_closed(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    cfg = settings(token_file=tokens.path, packs=[PACK_SPEC], mcp_stateless=False, stream_idle_timeout=1.0)
    async with service(cfg) as srv:
        async with httpx.AsyncClient(timeout=10) as http:
            resp = await http.post(srv.mcp_url, json=INITIALIZE, headers=_headers(tokens["alice"]))
            assert resp.status_code == 200, resp.text
            sid = resp.headers["mcp-session-id"]
            extra = {"mcp-session-id": sid, "MCP-Protocol-Version": "2025-06-18"}
            await http.post(
                srv.mcp_url,
                json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                headers=_headers(tokens["alice"], **extra),
            )
            t0 = time.monotonic()
            async with http.stream(
                "GET",
                srv.mcp_url,
                headers={**_headers(tokens["alice"], **extra), "Accept": "text/event-stream"},
            ) as stream:
                assert stream.status_code == 200
                async for _ in stream.aiter_bytes():
                    pass
            assert 0.9 < time.monotonic() - t0 < 5
        assert srv.service.guard.open_total == 0


def test_repeated_log_lines_are_rate_limited() -> None:
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect()
    handler.addFilter(RepeatFilter(window=0.5, burst=3))
    log = logging.getLogger("test.flood")
    log.addHandler(handler)
    log.propagate = False
    try:
        for i in range(10_000):
            log.error("accept failed: %s", f"Too many open files {i}")
        log.error("a different message")
        logging.getLogger("codemode.audit").addHandler(handler)
        for _ in range(10):
            logging.getLogger("codemode.audit").warning("audit line")
        time.sleep(0.6)
        log.error("accept failed: %s", "again")
    finally:
        log.removeHandler(handler)
        logging.getLogger("codemode.audit").removeHandler(handler)
    texts = [r.getMessage() for r in records]
    assert len([t for t in texts if t.startswith("accept failed")]) == 4
    assert "a different message" in texts
    assert texts.count("audit line") == 10  # the audit log is never dropped
    assert texts[-1] == "accept failed: again [9997 similar message(s) suppressed]"


async def test_one_subject_holds_at_most_its_connections_and_the_others_connect(tmp_path: Path) -> None:
    """R19-E1, without stalls: keep-alive connections that read every answer and send a request
    every second are never idle, so no timeout ends them. Before: one tenant held all of them."""
    tokens = write_token_file(tmp_path, ["mallory", "alice"])
    cfg = settings(
        token_file=tokens.path, packs=[PACK_SPEC], max_connections=8, max_connections_per_subject=3
    )
    async with service(cfg) as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        request = f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {tokens['mallory']}\r\n\r\n"
        statuses: list[bytes] = []

        async def keep_alive() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                while True:
                    writer.write(request.encode())
                    head = await reader.readuntil(b"\r\n\r\n")
                    statuses.append(head.split(b" ")[1])
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    await reader.readexactly(length)
                    await asyncio.sleep(1)
            finally:
                writer.close()

        tasks = [asyncio.create_task(keep_alive()) for _ in range(8)]
        try:
            await asyncio.sleep(3)
            held = srv.service.edge.subjects.get("mallory", 0)
            assert await execute(srv.mcp_url, tokens["alice"], ECHO) == {"result": "x"}
        finally:
            for task in tasks:
                task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert held == 3 and statuses.count(b"429") == 5, (held, statuses)
    assert sum(isinstance(o, asyncio.IncompleteReadError) for o in outcomes) == 5  # closed after the 429
