"""codemode_capabilities.mcp.bounded_http: response bodies stop being read past the limit.

The inner transport here is a stand-in upstream (``httpx2.MockTransport``) whose body is an endless
stream that counts what was pulled from it; the transport under test is the real one, used through a
real ``httpx2.AsyncClient``. End to end against a real MCP server:
tests/integration/capabilities/test_mcp_upstream.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import pytest

from codemode_capabilities.mcp.bounded_http import ACCEPT_IDENTITY, BodyTooLarge, BoundedBodies

CHUNK = 64 * 1024


class Endless(httpx2.AsyncByteStream):
    def __init__(self) -> None:
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            self.pulled += 1
            yield b"x" * CHUNK


def upstream(body: Endless, headers: dict[str, str], status: int = 200) -> httpx2.MockTransport:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers=headers, stream=body)

    return httpx2.MockTransport(answer)


async def test_a_body_past_the_limit_stops_being_read() -> None:
    body = Endless()
    transport = BoundedBodies(10 * CHUNK, upstream(body, {"content-type": "application/json"}))
    async with httpx2.AsyncClient(transport=transport) as client:
        with pytest.raises(BodyTooLarge):
            await (await client.post("http://upstream/mcp", content=b"{}")).aread()
    assert body.pulled == 11  # the chunk that crossed the limit, and not one more


async def test_a_body_within_the_limit_is_read_whole() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "application/json"}, content=b"y" * 1000)

    transport = BoundedBodies(1000, httpx2.MockTransport(answer))
    async with httpx2.AsyncClient(transport=transport) as client:
        assert (await client.get("http://upstream/")).content == b"y" * 1000


async def test_a_compressed_body_is_refused_before_any_byte_is_read() -> None:
    body = Endless()
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    transport = BoundedBodies(10 * CHUNK, upstream(body, headers))
    async with httpx2.AsyncClient(transport=transport, headers=ACCEPT_IDENTITY) as client:
        with pytest.raises(BodyTooLarge, match="compressed"):
            await (await client.get("http://upstream/")).aread()
    assert body.pulled == 0


async def test_event_streams_pass_through_for_the_client_to_bound_per_event() -> None:
    body = Endless()
    transport = BoundedBodies(CHUNK, upstream(body, {"content-type": "text/event-stream"}))
    seen = 0
    async with httpx2.AsyncClient(transport=transport) as c, c.stream("GET", "http://upstream/") as r:
        async for chunk in r.aiter_raw():
            seen += len(chunk)
            if seen > 4 * CHUNK:
                break
    assert seen > CHUNK


@pytest.mark.parametrize(("status", "method"), [(307, "POST"), (500, "GET"), (200, "DELETE")])
async def test_other_event_streams_are_counted(status: int, method: str) -> None:
    """A redirect, an error or a DELETE answer typed as an event stream is read whole by the client:
    it gets the same bound as any body."""
    body = Endless()
    headers = {"content-type": "Text/Event-Stream; charset=utf-8"}
    if status == 307:
        headers["location"] = "http://upstream/elsewhere"
    transport = BoundedBodies(10 * CHUNK, upstream(body, headers, status))
    async with httpx2.AsyncClient(transport=transport) as client:
        with pytest.raises(BodyTooLarge):
            await (await client.request(method, "http://upstream/mcp")).aread()
    assert body.pulled == 11


def test_the_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        BoundedBodies(0)
