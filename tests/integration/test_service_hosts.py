"""The Host and Origin allow-lists (issue 19 §2): each works on its own, an empty list is off.
Real uvicorn; raw HTTP and the official MCP client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from .support_service import PACK_SPEC, execute, service, settings, write_token_file

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
        # Before: every request got 421 (the empty host list refused every Host).
        (
            {"allowed_origins": ["http://app.example", "http://localhost:*"]},
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
