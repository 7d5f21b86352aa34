"""Careless backends for the credential-oracle tests (issue 31 §1): they repeat what they were sent.

* ``app``: a FastAPI service (the OpenAPI path). ``GET /error?msg=&status=`` answers ``status`` with
  ``{"detail": msg}`` (a backend quoting a value it refused); ``GET /credential/{form}?status=``
  answers ``status`` with the ``Authorization`` header it received, spelled as :data:`FORMS` says,
  in an error body (``{"detail": "key <it> refused"}``) or, for 200, in a result
  (``{"echo": "key <it> refused"}``). ``POST /echo {"text": ...}`` answers ``{"echo": text}`` (a
  backend that returns what it stored).
* ``python credential_echo.py``: a stdio MCP server (the SDK's ``MCPServer``; the upstream MCP
  path). ``say_error(text)`` fails with exactly ``text``; ``credential_error(form)`` fails with
  its ``API_KEY`` environment variable (an ``env_from_host`` credential) spelled as :data:`FORMS`
  says; ``credential(form)`` and ``credential_structured(form)`` answer with it (as text, and as
  ``{"echo": ...}`` structured content).
"""

from __future__ import annotations

import base64
import binascii
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


def serve_fastapi() -> object:
    """The FastAPI app (built on demand: the MCP server process does not need FastAPI)."""
    from fastapi import Body, FastAPI, Header, Query
    from fastapi.responses import JSONResponse
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
    def credential(form: str, status: int = Query(), authorization: str = Header(default="")) -> JSONResponse:
        said = f"key {FORMS[form](authorization)} refused"
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
        raise ToolError(f"key {FORMS[form](os.environ.get('API_KEY', ''))} refused")

    @server.tool(description="Answers quoting the API key it was started with.", structured_output=False)
    def credential(form: str) -> str:
        return f"key {FORMS[form](os.environ.get('API_KEY', ''))} refused"

    @server.tool(description="Answers with the key, structured.", structured_output=True)
    def credential_structured(form: str) -> Said:
        return {"echo": f"key {FORMS[form](os.environ.get('API_KEY', ''))} refused"}

    server.run("stdio")


if __name__ == "__main__":
    main()
