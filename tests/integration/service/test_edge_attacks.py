"""Hostile review of the HTTP-service hardening (branch review-edges).

Each test is an attack against a real uvicorn server (support_service.running, the configuration
``serve`` uses). A test marked ``xfail(strict=True)`` is an attack that WORKED on the reviewed code:
it asserts the outcome the service should have, fails today, and its reason names the finding
(R19-Ex in the review report). The other tests are attacks that failed; they pin the defence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from codemode.service.logfilter import RepeatFilter
from tests.support.service import (
    PACK_SPEC,
    closed_within,
    execute,
    passed_records,
    service,
    settings,
    write_token_file,
)

ECHO = "def main():\n    return svc.echo(value='x')['value']\n"
ACCEPT = "application/json, text/event-stream"
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}

pytestmark = pytest.mark.slow

_SOCKETS: list[socket.socket] = []


def _close_attackers() -> None:
    while _SOCKETS:
        with contextlib.suppress(OSError):
            _SOCKETS.pop().close()


@pytest.fixture(autouse=True)
async def _close_sockets() -> AsyncIterator[None]:
    yield
    _close_attackers()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _authenticated_post(token: str) -> bytes:
    body = json.dumps(LIST).encode()
    return (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Accept: {ACCEPT}\r\nMCP-Protocol-Version: 2025-06-18\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


#: A request any client may send without a token (401 from /mcp, ~250 bytes of answer each).
_NO_TOKEN = b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def _stalled(port: int, source: str, *, token: str | None, pipelined: int) -> tuple[socket.socket, int]:
    """A connection from ``source`` that pipelines ``pipelined`` small requests (after one
    authenticated request when ``token``) and never reads an answer: once the answers fill the
    socket buffers, the server's write of the current answer waits for ever."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    _SOCKETS.append(sock)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    data = (_authenticated_post(token) if token else b"") + _NO_TOKEN * pipelined
    sock.setblocking(False)
    sent, deadline = 0, time.monotonic() + 3
    while sent < len(data) and time.monotonic() < deadline:
        try:
            sent += sock.send(data[sent:])
        except BlockingIOError:
            time.sleep(0.01)
    return sock, sent


# --------------------------------------------------------------------------------------------------
# R19-E1: a client that does not read its answers holds its connection for ever
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_token", [False, True], ids=["no-token", "tenant"])
@pytest.mark.timeout(120)
async def test_a_connection_that_never_reads_its_answers_is_closed(tmp_path: Path, with_token: bool) -> None:
    tokens = write_token_file(tmp_path, ["mallory"])
    cfg = settings(token_file=tokens.path, packs=[PACK_SPEC], header_timeout=1.0, max_connections=64)
    async with service(cfg) as srv:
        token = tokens["mallory"] if with_token else None
        for _ in range(3):
            await asyncio.to_thread(_stalled, _port(srv.url), "127.0.0.5", token=token, pipelined=8000)
        # header timeout (1 s) + keep-alive (5 s) + the time to answer 24,000 requests, with margin
        await asyncio.sleep(20)
        held = srv.service.edge.open
        unauthenticated = dict(srv.service.edge.unauthenticated)
        _close_attackers()  # before the server stops (a stalled answer also holds up its shutdown)
    assert held == 0, f"{held} connection(s) still open 20 s later; unauthenticated: {unauthenticated}"


@pytest.mark.timeout(240)
async def test_one_tenant_cannot_hold_every_connection_of_the_service(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["mallory", "alice"])
    limit = 10
    cfg = settings(token_file=tokens.path, packs=[PACK_SPEC], header_timeout=1.0, max_connections=limit)
    async with service(cfg) as srv:
        edge = srv.service.edge
        # Stalled connections (they cost mallory nothing once the buffers are full)...
        attempts = 0
        while edge.open < limit - 1 and attempts < 3 * limit:
            attempts += 1
            await asyncio.to_thread(
                _stalled, _port(srv.url), "127.0.0.6", token=tokens["mallory"], pipelined=8000
            )
            await asyncio.sleep(1.5)
        stalled = edge.open

        # ...and the last slot(s) held by a keep-alive connection that sends a request every 3 s.
        async def keep_alive() -> None:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", _port(srv.url), local_addr=("127.0.0.6", 0)
            )
            try:
                # authenticated (a stateless GET /mcp is answered 405 at once, with a length)
                auth = f"Authorization: Bearer {tokens['mallory']}\r\n"
                writer.write(f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n".encode())
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next(
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                    await reader.readexactly(length)
                    await asyncio.sleep(3)
                    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            finally:
                writer.close()

        pingers = [asyncio.create_task(keep_alive()) for _ in range(limit - stalled)]
        try:
            await asyncio.sleep(10)  # past the header timeout and the keep-alive timeout
            held = edge.open
            outcome: object
            try:
                async with asyncio.timeout(30):
                    outcome = await execute(srv.mcp_url, tokens["alice"], ECHO)
            except Exception as exc:  # the MCP client's error for the 503 "too many connections"
                inner: BaseException = exc
                while isinstance(inner, BaseExceptionGroup):
                    inner = inner.exceptions[0]
                outcome = f"{type(inner).__name__}: {inner}"[:300]
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", _port(srv.url), local_addr=("127.0.0.21", 0)
            )
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            other = (await closed_within(reader, 10)).split(b"\r\n")[0]
            writer.close()
        finally:
            for task in pingers:
                task.cancel()
            await asyncio.gather(*pingers, return_exceptions=True)
            _close_attackers()
    assert held < limit and outcome == {"result": "x"}, (
        f"mallory held {held} of {limit} connections ({stalled} stalled after {attempts} attempts, "
        f"{len(pingers)} keep-alive); alice's execute: {outcome!r}; another client's /healthz: {other!r}"
    )


# --------------------------------------------------------------------------------------------------
# R19-E2: the health port is one more target, and a small one
# --------------------------------------------------------------------------------------------------


async def test_idle_sockets_from_two_addresses_do_not_fail_the_probes(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, packs=[PACK_SPEC])) as srv:  # defaults
        host, port = srv.service.health_address
        writers = []
        for i in range(64):
            _, writer = await asyncio.open_connection(host, port, local_addr=(f"127.0.0.{2 + i // 32}", 0))
            writers.append(writer)
        await asyncio.sleep(0.2)
        try:
            answers = []
            for _ in range(3):  # a liveness probe's failureThreshold
                async with httpx.AsyncClient(timeout=3) as probe:
                    answers.append((await probe.get(srv.health_url + "/healthz")).status_code)
        finally:
            for writer in writers:
                writer.close()
    assert answers == [200, 200, 200], answers


# --------------------------------------------------------------------------------------------------
# R19-E3: the refusal summary counts an IPv6 client per address, not per /64
# --------------------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
async def test_one_ipv6_network_cannot_push_other_clients_out_of_the_refusal_summary(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    audit = tmp_path / "audit.jsonl"
    cfg = settings(
        token_file=tokens.path,
        packs=[PACK_SPEC],
        audit_log=str(audit),
        auth_failure_window=600,
        trusted_proxies=["127.0.0.1"],  # the test client plays the ingress
    )
    async with service(cfg) as srv:
        async with httpx.AsyncClient(timeout=10) as http:
            for i in range(1100):  # one /64: 2001:db8::1 ... 2001:db8::44c
                resp = await http.post(
                    srv.mcp_url, json=LIST, headers={"X-Forwarded-For": f"2001:db8::{i + 1:x}"}
                )
                assert resp.status_code == 401
            for _ in range(3):  # another client behind the same ingress
                resp = await http.post(srv.mcp_url, json=LIST, headers={"X-Forwarded-For": "198.51.100.7"})
                assert resp.status_code == 401
        srv.service.refusals.flush()
    lines = [json.loads(x) for x in audit.read_text().splitlines()]
    from_v6 = [x for x in lines if x["event"] == "auth_failure" and x["client"].startswith("2001:db8:")]
    victim = [x for x in lines if x.get("client") == "198.51.100.7"]
    assert victim, (
        f"{len(from_v6)} auth_failure lines for one /64; 198.51.100.7 appears in none of {len(lines)}"
    )


# --------------------------------------------------------------------------------------------------
# R19-E4: a full key table of the log limiter lets one client's flood hide another client's lines
# --------------------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
async def test_a_full_log_key_table_does_not_let_one_client_hide_another(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    cfg = settings(
        token_file=tokens.path,
        packs=[PACK_SPEC],
        allowed_hosts=["mcp.example:*"],
        trusted_proxies=["127.0.0.1"],  # the test client plays the ingress
    )
    limiter = RepeatFilter(window=60, burst=5)
    with passed_records(logging.getLogger("codemode.service"), limiter) as records:
        async with service(cfg) as srv, httpx.AsyncClient(timeout=10) as http:

            async def bad_host(client: str, host: str = "rebind.example") -> None:
                headers = {"Host": host, "X-Forwarded-For": client}
                assert (await http.post(srv.mcp_url, json=LIST, headers=headers)).status_code == 421

            for i in range(1024):  # one line each: the table is full of live keys
                await bad_host(f"10.1.{i // 256}.{i % 256}")
            for _ in range(20):  # one more address floods the shared overflow key
                await bad_host("10.2.0.1")
            await bad_host("198.51.100.7", "victim.example")  # a client that has logged nothing yet
    flood = sum(1 for r in records if "rebind.example" in r.getMessage())
    victim = [r for r in records if "victim.example" in r.getMessage()]
    assert victim, f"{flood} flood lines passed; 198.51.100.7's line did not"


# --------------------------------------------------------------------------------------------------
# Attacks that failed (the defence holds)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        # a complete head, then a body trickled one byte a second (answered 401 before the body)
        b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n",
        # the same, chunked
        b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n",
        # Expect: 100-continue, then nothing
        b"POST /mcp HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n",
        # a body on a probe path (never read)
        b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
        # HTTP/1.0 keep-alive, then half a second request
        b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /heal",
    ],
    ids=["trickled-body", "trickled-chunks", "expect-continue", "probe-body", "http10-keepalive"],
)
async def test_a_body_or_second_request_nobody_reads_does_not_keep_a_connection(
    tmp_path: Path, head: bytes
) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, packs=[PACK_SPEC], header_timeout=1.0)) as srv:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", _port(srv.url), local_addr=("127.0.0.7", 0)
        )
        writer.write(head)
        started = time.monotonic()

        async def drip() -> None:
            with contextlib.suppress(OSError):
                while True:
                    await asyncio.sleep(0.5)
                    writer.write(b"1\r\na\r\n" if b"chunked" in head else b"a")

        dripping = asyncio.create_task(drip())
        try:
            await closed_within(reader, 15)
        finally:
            dripping.cancel()
            writer.close()
        assert time.monotonic() - started < 15


async def test_an_authenticated_connection_that_goes_idle_is_closed(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, packs=[PACK_SPEC], header_timeout=1.0)) as srv:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", _port(srv.url), local_addr=("127.0.0.8", 0)
        )
        writer.write(_authenticated_post(tokens["alice"]) + b"GET /mcp HTTP/1.1\r\nHost")  # then idle
        started = time.monotonic()
        data = await closed_within(reader, 15)
        writer.close()
        assert data.startswith(b"HTTP/1.1 200")
        assert time.monotonic() - started < 8


@pytest.mark.parametrize(
    "forwarded",
    [
        ["203.0.113.9"],  # not from a trusted proxy: never believed
    ],
)
async def test_forwarded_headers_from_an_untrusted_peer_do_not_change_the_audit_client(
    tmp_path: Path, forwarded: list[str]
) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    audit = tmp_path / "audit.jsonl"
    cfg = settings(
        token_file=tokens.path, packs=[PACK_SPEC], audit_log=str(audit), trusted_proxies=["10.0.0.0/8"]
    )
    async with service(cfg) as srv:
        transport = httpx.AsyncHTTPTransport(local_address="127.0.0.9")
        async with httpx.AsyncClient(transport=transport, timeout=10) as http:
            headers = [("X-Forwarded-For", v) for v in forwarded] + [("Forwarded", "for=203.0.113.9")]
            resp = await http.post(srv.mcp_url, json=LIST, headers=headers)
            assert resp.status_code == 401
    lines = [json.loads(x) for x in audit.read_text().splitlines()]
    assert [x["client"] for x in lines if x["event"] == "auth_failure"] == ["127.0.0.9"]
