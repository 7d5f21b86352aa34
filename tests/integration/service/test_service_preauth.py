"""Before authentication: connections without a token are bounded by a header timeout,
per client address and in total; the probes have a port of their own; forwarded addresses are
believed only from trusted proxies. Real uvicorn on loopback, raw sockets from 127.0.0.x."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.service import (
    PACK_SPEC,
    Running,
    closed_within,
    execute,
    service,
    settings,
    write_token_file,
)

ECHO = "def main():\n    return svc.echo(value='x')['value']\n"
ACCEPT = "application/json, text/event-stream"
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


def _port(srv: Running) -> int:
    return int(srv.url.rsplit(":", 1)[1])


_OPEN: list[asyncio.StreamWriter] = []


async def _open(srv: Running, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection from ``source`` (closed by the autouse fixture at the end of the test)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(srv), local_addr=(source, 0))
    _OPEN.append(writer)
    return reader, writer


@pytest.fixture(autouse=True)
async def _close_sockets() -> AsyncIterator[None]:
    yield
    while _OPEN:
        writer = _OPEN.pop()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _request(path: str, *, method: str = "GET", token: str | None = None, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if token is not None:
        head += f"Authorization: Bearer {token}\r\nAccept: {ACCEPT}\r\nMCP-Protocol-Version: 2025-06-18\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode("ascii") + body


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """One whole response (status line, headers and a body of content-length bytes)."""
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return head + await reader.readexactly(length)


async def test_a_connection_without_a_complete_request_head_is_closed(tmp_path: Path) -> None:
    """Before: uvicorn kept each of these open forever (no timeout before the first request)."""
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, packs=[PACK_SPEC], header_timeout=1.0)) as srv:
        idle = await _open(srv, "127.0.0.2")
        half = await _open(srv, "127.0.0.2")
        half[1].write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        trickle = await _open(srv, "127.0.0.3")
        t0 = time.monotonic()

        async def drip() -> None:
            # One byte every 0.2 s: the timer is not reset by partial data.
            for byte in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 200:
                trickle[1].write(bytes([byte]))
                await asyncio.sleep(0.2)

        dripping = asyncio.create_task(drip())
        try:
            for reader, _ in (idle, half, trickle):
                assert await closed_within(reader, 8) == b""
        finally:
            dripping.cancel()
        assert time.monotonic() - t0 < 8
        # A request sent in time is served, and later requests on the same connection too.
        reader, writer = await _open(srv, "127.0.0.2")
        writer.write(_request("/healthz"))
        assert (await _answer(reader)).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(0.5)
        writer.write(_request("/healthz"))
        assert (await _answer(reader)).startswith(b"HTTP/1.1 200")


async def test_unauthenticated_connections_are_bounded_per_client_address(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    cfg = settings(
        token_file=tokens.path,
        packs=[PACK_SPEC],
        max_unauthenticated_connections_per_address=3,
        header_timeout=30.0,
    )
    async with service(cfg) as srv:
        held = [await _open(srv, "127.0.0.2") for _ in range(3)]
        await asyncio.sleep(0.2)
        # One more from the same address: refused at once, with a status a client can read.
        reader, _ = await _open(srv, "127.0.0.2")
        refused = await closed_within(reader, 5)
        assert refused.startswith(b"HTTP/1.1 429") and b'"too many connections"' in refused
        # Another address is not affected.
        other = await _open(srv, "127.0.0.3")
        other[1].write(_request("/healthz"))
        assert (await _answer(other[0])).startswith(b"HTTP/1.1 200")
        # A bad token does not make a connection count as authenticated...
        body = json.dumps(LIST).encode()
        held[0][1].write(_request("/mcp", method="POST", token="wrong", body=body))
        assert (await _answer(held[0][0])).startswith(b"HTTP/1.1 401")
        reader, _ = await _open(srv, "127.0.0.2")
        assert (await closed_within(reader, 5)).startswith(b"HTTP/1.1 429")
        # ...a good one does: the address may open one more.
        held[1][1].write(_request("/mcp", method="POST", token=tokens["alice"], body=body))
        assert (await _answer(held[1][0])).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(0.2)
        extra = await _open(srv, "127.0.0.2")
        extra[1].write(_request("/healthz"))
        assert (await _answer(extra[0])).startswith(b"HTTP/1.1 200")
        assert srv.service.edge.unauthenticated == {"127.0.0.2": 3, "127.0.0.3": 1}
        for _, w in (*held, other, extra):
            w.close()
            await w.wait_closed()
        async with asyncio.timeout(5):
            while srv.service.edge.open:
                await asyncio.sleep(0.05)
        assert srv.service.edge.unauthenticated == {}


async def test_a_full_connection_table_refuses_new_connections_and_the_probes_still_answer(
    tmp_path: Path,
) -> None:
    """Before: idle connections held every limit_concurrency slot and every request got 503,
    /healthz included (the liveness probe restarted the pod)."""
    tokens = write_token_file(tmp_path, ["alice"])
    cfg = settings(
        token_file=tokens.path,
        packs=[PACK_SPEC],
        max_connections=6,
        max_unauthenticated_connections_per_address=2,
        header_timeout=30.0,
    )
    async with service(cfg) as srv:
        # A tenant's keep-alive connection, authenticated before the flood.
        headers = {
            "Authorization": f"Bearer {tokens['alice']}",
            "Accept": ACCEPT,
            "MCP-Protocol-Version": "2025-06-18",
        }
        async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=1)) as tenant:
            assert (await tenant.post(srv.mcp_url, json=LIST, headers=headers)).status_code == 200
            held = [await _open(srv, f"127.0.0.{2 + i // 2}") for i in range(5)]
            await asyncio.sleep(0.2)
            assert srv.service.edge.open == 6
            reader, _ = await _open(srv, "127.0.0.9")
            refused = await closed_within(reader, 5)
            assert refused.startswith(b"HTTP/1.1 503") and b'"too many connections"' in refused
            # The connection that is already open keeps working (uvicorn's 503 for all is gone).
            assert (await tenant.post(srv.mcp_url, json=LIST, headers=headers)).status_code == 200
            # The probes have their own listener.
            async with httpx.AsyncClient(timeout=10) as probe:
                assert (await probe.get(srv.health_url + "/healthz")).json() == {"status": "ok"}
                assert (await probe.get(srv.health_url + "/readyz")).json() == {"status": "ready"}
                assert (await probe.get(srv.health_url + "/mcp")).status_code == 404
            for _, w in held:
                w.close()
                await w.wait_closed()
        await asyncio.sleep(0.3)
        assert await execute(srv.mcp_url, tokens["alice"], ECHO) == {"result": "x"}


async def _refused_client(srv: Running, source: str, headers: dict[str, str]) -> Any:
    transport = httpx.AsyncHTTPTransport(local_address=source)
    async with httpx.AsyncClient(transport=transport, timeout=10) as http:
        resp = await http.post(srv.mcp_url, json=LIST, headers={"Authorization": "Bearer nope", **headers})
        assert resp.status_code == 401
    lines = [json.loads(x) for x in Path(srv.service.settings.audit_log).read_text().splitlines()]
    return lines[-1]["client"]


async def test_forwarded_addresses_are_believed_only_from_trusted_proxies(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    audit = tmp_path / "audit.jsonl"
    cfg = settings(
        token_file=tokens.path,
        packs=[PACK_SPEC],
        audit_log=str(audit),
        trusted_proxies=["127.0.0.4/32"],
        max_unauthenticated_connections_per_address=2,
        header_timeout=30.0,
    )
    xff = {"X-Forwarded-For": "198.51.100.1, 203.0.113.9", "Forwarded": "for=192.0.2.60"}
    async with service(cfg) as srv:
        # From the proxy: the right-most forwarded address that is not a proxy; `Forwarded` is a
        # header this proxy does not write, so a client could have chosen it: never read.
        assert await _refused_client(srv, "127.0.0.4", xff) == "203.0.113.9"
        # From anyone else: the peer address, whatever the headers say.
        assert await _refused_client(srv, "127.0.0.5", xff) == "127.0.0.5"
        # Garbage where the proxy's entry should be: the proxy's own address.
        assert await _refused_client(srv, "127.0.0.4", {"X-Forwarded-For": "unknown"}) == "127.0.0.4"
        # The proxy's address is every tenant's: it is not bounded per address.
        held = [await _open(srv, "127.0.0.4") for _ in range(5)]
        await asyncio.sleep(0.2)
        assert srv.service.edge.open >= 5 and "127.0.0.4" not in srv.service.edge.unauthenticated
        for _, w in held:
            w.close()
            await w.wait_closed()
    cfg = cfg.model_copy(update={"trusted_proxy_header": "forwarded"})
    async with service(cfg) as srv:
        forwarded = {
            "Forwarded": 'for="[2001:db8::7]:4711";proto=https, for=127.0.0.4',
            "X-Forwarded-For": "192.0.2.1",
        }
        assert await _refused_client(srv, "127.0.0.4", forwarded) == "2001:db8::7"


def _audit(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


async def _refuse(srv: Running, source: str, n: int) -> None:
    transport = httpx.AsyncHTTPTransport(local_address=source)
    async with httpx.AsyncClient(transport=transport, timeout=10) as http:
        for i in range(n):
            auth = {"Authorization": f"Bearer bad-{i}"} if i % 3 else {}
            resp = await http.post(srv.mcp_url, json=LIST, headers={"Accept": ACCEPT, **auth})
            assert resp.status_code == 401


async def test_refused_requests_are_summarised_per_client_address_and_none_is_lost(tmp_path: Path) -> None:
    """Before: one audit line per refused request (5,000 bad tokens grew the log 585 KB in 5 s)."""
    tokens = write_token_file(tmp_path, ["alice"])
    audit = tmp_path / "audit.jsonl"
    sent = {"127.0.0.1": 200, "127.0.0.2": 30}
    cfg = settings(token_file=tokens.path, packs=[PACK_SPEC], audit_log=str(audit), auth_failure_window=600.0)
    async with service(cfg) as srv:
        for source, n in sent.items():
            await _refuse(srv, source, n)
        # During the window: one line per client address, however many refusals.
        assert [(x["event"], x["client"]) for x in _audit(audit)] == [
            ("auth_failure", "127.0.0.1"),
            ("auth_failure", "127.0.0.2"),
        ]
        # Authenticated decisions stay one line each.
        for _ in range(3):
            assert await execute(srv.mcp_url, tokens["alice"], ECHO) == {"result": "x"}
    # The window's summaries are written at shutdown at the latest: nothing is lost.
    lines = _audit(audit)
    refusals = [x for x in lines if x["event"] in ("auth_failure", "auth_failures")]
    assert len(refusals) == 4, refusals
    for source, n in sent.items():
        mine = [x for x in refusals if x["client"] == source]
        assert sum(1 if x["event"] == "auth_failure" else x["count"] for x in mine) == n
        summary = next(x for x in mine if x["event"] == "auth_failures")
        assert set(summary["reasons"]) == {"missing_token", "unknown_token"}
        assert sum(summary["reasons"].values()) == summary["count"]
    assert [x["event"] for x in lines if x["event"] in ("execute", "native_call")] == [
        "native_call",
        "execute",
    ] * 3


async def test_a_window_summary_is_written_when_the_window_ends(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    audit = tmp_path / "audit.jsonl"
    cfg = settings(token_file=tokens.path, packs=[PACK_SPEC], audit_log=str(audit), auth_failure_window=1.0)
    async with service(cfg) as srv:
        await _refuse(srv, "127.0.0.3", 6)
        # No further refusal comes: the timer writes the summary.
        async with asyncio.timeout(10):
            while not any(x["event"] == "auth_failures" for x in _audit(audit)):
                await asyncio.sleep(0.1)
    lines = _audit(audit)
    assert sum(1 if x["event"] == "auth_failure" else x["count"] for x in lines) == 6


async def test_sockets_re_opened_as_fast_as_the_health_port_closes_them_do_not_fail_a_probe(
    tmp_path: Path,
) -> None:
    """R19-E2, harder: the attacker keeps the health port's table full from 4 addresses, idle and
    half-sent sockets, re-opening each one the port closes, while the probes run. Before: with the
    table full every probe was refused (503)."""
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, packs=[PACK_SPEC])) as srv:
        host, port = srv.service.health_address
        opened = 0

        async def attacker(source: str) -> None:
            nonlocal opened
            while True:
                try:
                    reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
                except OSError:
                    await asyncio.sleep(0.01)
                    continue
                opened += 1
                if opened % 2:
                    writer.write(b"GET /healthz HTTP/1.1\r\nHo")  # half a request head
                _OPEN.append(writer)
                # the next one at once when this one is closed, else after a breath
                with contextlib.suppress(TimeoutError, OSError):
                    async with asyncio.timeout(0.05):
                        await reader.read(1)

        tasks = [asyncio.create_task(attacker(f"127.0.0.{2 + i}")) for i in range(4)]
        try:
            async with asyncio.timeout(10):
                while srv.service.health_address and opened < 64:
                    await asyncio.sleep(0.05)
            answers = []
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                async with httpx.AsyncClient(timeout=3) as probe:
                    answers.append((await probe.get(srv.health_url + "/healthz")).status_code)
                await asyncio.sleep(0.2)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    failed = [a for a in answers if a != 200]
    assert opened > 64 and answers and not failed, (opened, len(answers), failed)


async def test_connections_that_do_not_read_their_answers_do_not_fail_a_probe(tmp_path: Path) -> None:
    """A connection that pipelines requests and never reads is in a request for ever from the
    server's side; on the health port it counts as idle (waiting for its client), so it makes room
    for a probe. Before the write timeout and that rule, 64 of them made every probe fail."""
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, packs=[PACK_SPEC])) as srv:
        host, port = srv.service.health_address
        pipelined = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 20_000
        stalled = []
        for i in range(64):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            sock.bind((f"127.0.0.{2 + i // 32}", 0))
            sock.connect((host, port))
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.send(pipelined)
            stalled.append(sock)
        try:
            await asyncio.sleep(1)  # their answers fill the buffers
            answers = []
            for _ in range(3):
                async with httpx.AsyncClient(timeout=3) as probe:
                    answers.append((await probe.get(srv.health_url + "/healthz")).status_code)
        finally:
            for sock in stalled:
                sock.close()
    assert answers == [200, 200, 200], answers
