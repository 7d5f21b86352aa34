"""Careless backends for the credential-oracle tests: they repeat what they were sent.

* ``app``: a FastAPI service (the OpenAPI path). ``GET /error?msg=&status=`` answers ``status`` with
  ``{"detail": msg}`` (a backend quoting a value it refused); ``GET /credential/{form}?status=``
  answers ``status`` with the ``Authorization`` header it received, spelled as :data:`FORMS` or
  :data:`ENCODED` says, in an error body (``{"detail": "key <it> refused"}``) or, for 200, in a
  result (``{"echo": "key <it> refused"}``). ``POST /echo {"text": ...}`` answers ``{"echo": text}`` (a
  backend that returns what it stored).
* ``python credential_echo.py``: a stdio MCP server (the SDK's ``MCPServer``; the upstream MCP
  path). ``say_error(text)`` fails with exactly ``text``; ``credential_error(form)`` fails with
  its ``API_KEY`` environment variable (an ``env_from_host`` credential) spelled as :data:`FORMS`
  or :data:`ENCODED` says; ``credential(form)`` and ``credential_structured(form)`` answer with it
  (as text, and as ``{"echo": ...}`` structured content).
"""

from __future__ import annotations

import base64
import binascii
import html.entities
import json
import os
from collections.abc import Callable
from typing import TypedDict
from urllib.parse import quote, quote_plus


class Said(TypedDict):
    echo: str


def _token(value: str) -> str:
    scheme, _, rest = value.partition(" ")
    return rest or scheme


def _decoded(value: str) -> str:
    try:
        return base64.b64decode(_token(value), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return value


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


#: How a careless backend may spell the credential it received.
FORMS: dict[str, Callable[[str], str]] = {
    "raw": lambda v: v,
    "token": _token,  # without its scheme
    "lower": str.lower,
    "upper": str.upper,
    "percent": lambda v: quote(v, safe=""),
    "form": quote_plus,
    "json": lambda v: json.dumps(v)[1:-1].replace("/", "\\/"),  # JSON-escaped, "/" too
    "base64": lambda v: _b64(v.encode()),
    "base64url": lambda v: base64.urlsafe_b64encode(v.encode()).decode().rstrip("="),
    "base64-in-a-blob-1": lambda v: _b64(b"{" + v.encode() + b"}"),  # the value at offset 1
    "base64-in-a-blob-2": lambda v: _b64(b'{"' + v.encode() + b'"}'),  # at offset 2
    "decoded": _decoded,  # Basic: the user:password it carries
}


def _unicode_escaped(value: str) -> str:
    """Every character a JSON ``\\uXXXX`` escape, the hex digits in upper and lower case by turns."""
    return "".join(f"\\u{ord(c):04X}" if i % 2 else f"\\u{ord(c):04x}" for i, c in enumerate(value))


#: The shortest HTML5 character reference of each character that has one (``&sol;`` for ``/``).
_NAMED = {
    ch: "&" + name
    for name, ch in sorted(html.entities.html5.items(), key=lambda item: (-len(item[0]), item[0]))
    if name.endswith(";") and len(ch) == 1
}


def _by_turns(value: str, *spellers: Callable[[str], str]) -> str:
    return "".join(spellers[i % len(spellers)](ch) for i, ch in enumerate(value))


#: How a hostile backend may spell the credential in an encoding that is not a whole spelling of
#: it, or in several mixed: each is text inside the reason (``{"detail": "key <it> refused"}``), so
#: the JSON body itself carries its escapes once more; ``json-body`` escapes the body's own JSON.
ENCODED: dict[str, Callable[[str], str]] = {
    "json-body": lambda v: v,  # the body is written by hand: see serve_fastapi
    "json-unicode": lambda v: '"' + _unicode_escaped(v) + '"',
    "html-decimal": lambda v: "".join(f"&#{ord(c)};" for c in v),
    "html-hex": lambda v: _by_turns(v, lambda c: f"&#x{ord(c):x};", lambda c: f"&#X{ord(c):02X};"),
    "html-named": lambda v: "".join(_NAMED.get(c, c) for c in v),
    "form-mixed": lambda v: _by_turns(v, lambda c: "+" if c == " " else f"%{ord(c):02X}", quote_plus),
    "json-double": lambda v: json.dumps({"inner": '{"key": "' + _unicode_escaped(v) + '"}'}),
    "percent-json": lambda v: quote(_unicode_escaped(v), safe=""),
    "html-json": lambda v: "".join(f"&#92;u{ord(c):04x}" for c in v),
    "mixed": lambda v: _by_turns(
        v,
        _unicode_escaped,
        lambda c: f"&#{ord(c)};",
        lambda c: f"%{ord(c):02x}",
        lambda c: f"&#x{ord(c):X};",
        lambda c: c,
    ),
}


def spelled(form: str, value: str) -> str:
    """``value`` as the backend spells it in ``form`` (of :data:`FORMS` or :data:`ENCODED`)."""
    return (FORMS | ENCODED)[form](value)


def serve_fastapi() -> object:
    """The FastAPI app (built on demand: the MCP server process does not need FastAPI)."""
    from fastapi import Body, FastAPI, Header, Query
    from fastapi.responses import JSONResponse, Response
    from pydantic import BaseModel

    api = FastAPI(title="Echo", version="1.0")

    class Echo(BaseModel):
        echo: str

    @api.get("/error", operation_id="error", response_model=Echo)
    def error(msg: str = Query(), status: int = Query()) -> JSONResponse:
        return JSONResponse({"detail": msg}, status_code=status)

    @api.post("/echo", operation_id="echo", response_model=Echo)
    def echo(text: str = Body(embed=True)) -> JSONResponse:
        return JSONResponse({"echo": text})

    @api.get("/credential/{form}", operation_id="credential", response_model=Echo)
    def credential(form: str, status: int = Query(), authorization: str = Header(default="")) -> Response:
        said = f"key {spelled(form, authorization)} refused"
        if form == "json-body":
            field = "echo" if status == 200 else "detail"
            body = f'{{"{field}": "key {_unicode_escaped(authorization)} refused"}}'
            return Response(body, status_code=status, media_type="application/json")
        return JSONResponse({"echo": said} if status == 200 else {"detail": said}, status_code=status)

    return api


def main() -> None:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("credential-echo")

    @server.tool(description="Fails with exactly the text.", structured_output=False)
    def say_error(text: str) -> str:
        raise ToolError(text)

    @server.tool(description="Fails quoting the API key it was started with.", structured_output=False)
    def credential_error(form: str) -> str:
        raise ToolError(f"key {spelled(form, os.environ.get('API_KEY', ''))} refused")

    @server.tool(description="Answers quoting the API key it was started with.", structured_output=False)
    def credential(form: str) -> str:
        return f"key {spelled(form, os.environ.get('API_KEY', ''))} refused"

    @server.tool(description="Answers with the key, structured.", structured_output=True)
    def credential_structured(form: str) -> Said:
        return {"echo": f"key {spelled(form, os.environ.get('API_KEY', ''))} refused"}

    server.run("stdio")


if __name__ == "__main__":
    main()
