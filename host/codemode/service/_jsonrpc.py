"""Fixed JSON-RPC answers for ``POST /mcp`` bodies that are not one JSON-RPC message
(docs/reference/errors.md, "Other rules").

The MCP SDK's transport answered such a body with the parser's or pydantic's own text: ``null``,
``0``, ``[]`` or ``{}`` got ``Validation error: 4 validation errors for union[...]`` with every
input value, pydantic's documentation URL and its version; ``nope`` got the parser's position.
:class:`JSONRPCBodyCheck` reads the (already size-bounded) JSON body first, with the SDK's own
parser and message model, and answers

- not JSON: ``400 {"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "Parse error"}}``;
- JSON, but not a JSON-RPC request, notification or response object:
  ``400 {..., "error": {"code": -32600, "message": "Invalid Request"}}``;

(the texts of the JSON-RPC 2.0 specification) and replays the body to the SDK otherwise. Bodies
that are not declared ``application/json`` go to the SDK untouched (it answers ``415`` with a
fixed text).
"""

from __future__ import annotations

import json

import pydantic_core
from mcp_types import INVALID_REQUEST, PARSE_ERROR, jsonrpc_message_adapter
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["JSONRPCBodyCheck"]

_TEXTS = {PARSE_ERROR: "Parse error", INVALID_REQUEST: "Invalid Request"}


def _problem(body: bytes) -> int | None:
    try:
        raw = pydantic_core.from_json(body)
    except ValueError:
        return PARSE_ERROR
    try:
        jsonrpc_message_adapter.validate_python(raw, by_name=False)
    except ValidationError:
        return INVALID_REQUEST
    return None


async def _refuse(send: Send, code: int) -> None:
    payload = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": _TEXTS[code]}})
    data = payload.encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode("ascii")),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


class JSONRPCBodyCheck:
    """Pure ASGI; behind a body-size limit (it reads the whole body).

    Args:
        app: the wrapped app.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or not _declares_json(scope):
            await self.app(scope, receive, send)
            return
        body = bytearray()
        trailing: list[Message] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                trailing.append(message)
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        if not trailing:
            code = _problem(bytes(body))
            if code is not None:
                await _refuse(send, code)
                return
        replay: list[Message] = [{"type": "http.request", "body": bytes(body), "more_body": False}, *trailing]

        async def receive_again() -> Message:
            return replay.pop(0) if replay else await receive()

        await self.app(scope, receive_again, send)


def _declares_json(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return bytes(value).lower().startswith(b"application/json")
    return False
