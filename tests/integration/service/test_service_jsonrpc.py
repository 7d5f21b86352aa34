"""A body that is not one JSON-RPC message gets a fixed JSON-RPC error, not the parser's or
pydantic's text. Real uvicorn; raw HTTP and the official MCP client."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.service import PACK_SPEC, call, mcp_client, service, settings, write_token_file

ECHO = "def main():\n    return svc.echo(value='x')['value']\n"
INVALID = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Invalid Request"}}
PARSE = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
BODIES = [
    (b"null", INVALID),
    (b"0", INVALID),
    (b"[]", INVALID),
    (b'"x"', INVALID),
    (b"{}", INVALID),
    (b"[1]", INVALID),
    (b'{"jsonrpc":"2.0"}', INVALID),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":5}', INVALID),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":[]}', INVALID),
    (b"nope", PARSE),
    (b'{"jsonrpc":', PARSE),
    (b"\xff\xfe", PARSE),
]


@pytest.mark.parametrize("stateless", [True, False])
async def test_bodies_that_are_not_one_json_rpc_message_get_fixed_errors(
    tmp_path: Path, stateless: bool
) -> None:
    """Before: 'Validation error: 4 validation errors for union[JSONRPCRequest, ...]' with the input
    values, https://errors.pydantic.dev/2.x/... and 'Parse error: expected ident at line 1 column 2'."""
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, packs=[PACK_SPEC], mcp_stateless=stateless)) as srv:
        async with httpx.AsyncClient(timeout=10) as http:
            for version in ("2025-06-18", None):
                for body, expected in BODIES:
                    headers = {
                        "Authorization": f"Bearer {tokens['alice']}",
                        "Accept": "application/json, text/event-stream",
                        "Content-Type": "application/json",
                    }
                    if version is not None:
                        headers["MCP-Protocol-Version"] = version
                    resp = await http.post(srv.mcp_url, content=body, headers=headers)
                    assert (body, resp.status_code, resp.json()) == (body, 400, expected)
                    assert "pydantic" not in resp.text and "alidation" not in resp.text
            # Another content type still gets the SDK's fixed answer.
            resp = await http.post(
                srv.mcp_url,
                content=b"null",
                headers={"Authorization": f"Bearer {tokens['alice']}", "Content-Type": "text/plain"},
            )
            assert resp.status_code in (400, 406, 415) and "alidation" not in resp.text, resp.text
        # Valid messages are untouched: the official client works.
        async with mcp_client(srv.mcp_url, tokens["alice"]) as client:
            assert await call(client, "execute", source=ECHO) == {"result": "x"}


async def test_interpreter_texts_reach_an_http_client_only_in_the_approved_form(tmp_path: Path) -> None:
    """'Error unpacking value for parameter `a1` of type `int' (starlark-rust, not the SDK) came
    through the service to the official client; the worker now maps it (codemode_worker.foreign_texts)
    and this checks the whole way: HTTP, the SDK transport, the tool result."""
    tokens = write_token_file(tmp_path, ["alice"])
    cfg = settings(token_file=tokens.path, packs=[PACK_SPEC])
    async with service(cfg) as srv, mcp_client(srv.mcp_url, tokens["alice"]) as client:
        for source, expected in [
            (
                "def main():\n    return range(1099511627776)\n",
                "invalid program: <codemode>:2:12: integer out of range for parameter `a1`",
            ),
            (
                "def main():\n    return 'a,b'.split(',', 1099511627776)\n",
                "invalid program: <codemode>:2:12: integer out of range for parameter `maxsplit`",
            ),
        ]:
            assert await call(client, "execute", source=source) == ("error", expected)
