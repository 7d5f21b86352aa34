"""The Host and Origin allow-lists: each works on its own, an empty list is off, but
for a service listening on loopback an empty ``allowed_hosts`` means the loopback names.
Real uvicorn; raw HTTP and the official MCP client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.service import PACK_SPEC, execute, service, settings, write_token_file

ECHO = "def main():\n    return svc.echo(value='x')['value']\n"
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


async def _status(url: str, token: str, **headers: str) -> int:
    extra = {k.replace("_", "-"): v for k, v in headers.items()}
    async with httpx.AsyncClient(timeout=10) as http:
        resp = await http.post(
            url,
            json=LIST,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2025-06-18",
                **extra,
            },
        )
        return resp.status_code


@pytest.mark.parametrize(
    ("lists", "cases"),
    [
        # Before: every request with an Origin got 403 (the empty origin list refused all of them).
        (
            {"allowed_hosts": ["127.0.0.1:*"]},
            [
                ({}, 200),
                ({"Origin": "http://anything.example"}, 200),
                ({"Host": "evil.example"}, 421),
                ({"Host": "127.0.0.1:80.evil.example"}, 421),
            ],
        ),
        # Before: every request got 421 (the empty host list refused every Host). Listening on every
        # interface: no Host check by default.
        (
            {"allowed_origins": ["http://app.example", "http://localhost:*"], "host": "0.0.0.0"},
            [
                ({}, 200),
                ({"Host": "whatever.example"}, 200),
                ({"Origin": "http://app.example"}, 200),
                ({"Origin": "http://localhost:3000"}, 200),
                ({"Origin": "http://evil.example"}, 403),
                ({"Origin": "http://localhost:3000.evil.example"}, 403),
            ],
        ),
        (
            {"allowed_hosts": ["127.0.0.1:*"], "allowed_origins": ["http://app.example"]},
            [
                ({}, 200),
                ({"Origin": "http://app.example"}, 200),
                ({"Origin": "http://evil.example"}, 403),
                ({"Host": "evil.example", "Origin": "http://app.example"}, 421),
            ],
        ),
    ],
)
async def test_each_allow_list_works_on_its_own(
    tmp_path: Path, lists: dict[str, Any], cases: list[tuple[dict[str, str], int]]
) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, packs=[PACK_SPEC], **lists)) as srv:
        got = [(headers, await _status(srv.mcp_url, tokens["alice"], **headers)) for headers, _ in cases]
        assert got == cases
        # The official client (no Origin, Host 127.0.0.1:port) works under every combination.
        assert await execute(srv.mcp_url, tokens["alice"], ECHO) == {"result": "x"}
        # Refused before authentication: a request without a token gets the same answer.
        for headers, status in cases:
            if status in (403, 421):
                assert await _status(srv.mcp_url, "no-such-token", **headers) == status


async def test_on_loopback_only_loopback_names_pass_by_default(tmp_path: Path) -> None:
    """Found by review: DNS-rebinding protection was off without --allowed-host, so a page of
    evil.example whose name resolved to 127.0.0.1 reached a service listening there."""
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, packs=[PACK_SPEC])) as srv:
        port = srv.mcp_url.split(":")[2].split("/")[0]
        cases = {
            f"127.0.0.1:{port}": 200,
            f"localhost:{port}": 200,
            f"[::1]:{port}": 200,
            "localhost": 200,
            "127.0.0.1": 200,
            f"evil.example:{port}": 421,
            "evil.example": 421,
            f"localhost.evil.example:{port}": 421,
            f"127.0.0.1.nip.io:{port}": 421,
            f"127.0.0.1:{port}.evil.example": 421,
        }
        got = {host: await _status(srv.mcp_url, tokens["alice"], Host=host) for host in cases}
        assert got == cases
        # Refused before authentication.
        assert await _status(srv.mcp_url, "no-such-token", Host="evil.example") == 421
        assert await execute(srv.mcp_url, tokens["alice"], ECHO) == {"result": "x"}
    # An explicit list replaces the default.
    async with service(
        settings(token_file=tokens.path, packs=[PACK_SPEC], allowed_hosts=["mcp.example"])
    ) as srv:
        assert await _status(srv.mcp_url, tokens["alice"], Host="mcp.example") == 200
        assert await _status(srv.mcp_url, tokens["alice"], Host="localhost") == 421
