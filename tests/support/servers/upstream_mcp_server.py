"""A real MCP server (the SDK's MCPServer) used as an upstream by the upstream-MCP tests.

Run as ``python upstream_mcp_server.py stdio`` or ``python upstream_mcp_server.py http PORT
TOKEN_FILE`` (streamable HTTP under uvicorn on 127.0.0.1; every request must carry
``Authorization: Bearer <a token from TOKEN_FILE>``, one token a line; a request with an
``X-Tenant`` header leaves ``tenant-<its value>-<its token>`` in the markers directory).
``UPSTREAM_MARKERS`` names a directory where the ``slow`` tool records ``started-<tag>`` and,
when the call is cancelled, ``cancelled-<tag>``; ``UPSTREAM_PAGE_SIZE`` makes ``tools/list``
paginate; ``UPSTREAM_JSON_RESPONSE=1`` makes the HTTP server answer with JSON bodies instead of
server-sent event streams.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ListToolsResult, PaginatedRequestParams
from pydantic import BaseModel

MARKERS = Path(os.environ.get("UPSTREAM_MARKERS", "/tmp"))
PAGE_SIZE = int(os.environ.get("UPSTREAM_PAGE_SIZE", "0"))


class PagedServer(MCPServer):
    """Lists tools in pages of ``UPSTREAM_PAGE_SIZE`` (cursor = offset) when that is set."""

    async def _handle_list_tools(self, ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        tools = await self.list_tools()
        if not PAGE_SIZE:
            return ListToolsResult(tools=tools)
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + PAGE_SIZE
        return ListToolsResult(tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None)


server = PagedServer("codemode-test-upstream")


class Sum(BaseModel):
    total: int
    terms: list[int]


@server.tool(name="addNumbers", description="Add two integers. Returns their total.")
def add_numbers(a: int, b: int) -> Sum:
    return Sum(total=a + b, terms=[a, b])


@server.tool(
    description="Change the case of a text.\n\nMode picks upper or lower case.", structured_output=False
)
def shout(text: str, mode: Literal["upper", "lower"] = "upper") -> str:
    return text.upper() if mode == "upper" else text.lower()


@server.tool(description="Always fails with the given message.", structured_output=False)
def fail(message: str) -> str:
    raise ToolError(message)


@server.tool(description="Sleep, recording start and cancellation in the markers directory.")
async def slow(seconds: float, tag: str) -> str:
    (MARKERS / f"started-{tag}").write_text("1")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        (MARKERS / f"cancelled-{tag}").write_text("1")
        raise
    return "done"


@server.tool(description="The server's process id.")
def pid() -> int:
    return os.getpid()


@server.tool(description="Exit the server process in the middle of the call.")
def die() -> str:
    os._exit(3)


@server.tool(description="Takes an untyped value (cannot be represented).")
def untyped(value: object) -> str:
    return repr(value)


def main() -> None:
    if sys.argv[1] == "stdio":
        server.run("stdio")
        return
    import uvicorn
    from starlette.types import ASGIApp, Receive, Scope, Send

    port = int(sys.argv[2])
    tokens = {f"Bearer {t.strip()}".encode() for t in Path(sys.argv[3]).read_text().splitlines() if t.strip()}
    inner = server.streamable_http_app(json_response=os.environ.get("UPSTREAM_JSON_RESPONSE") == "1")

    def guarded(app: ASGIApp) -> ASGIApp:
        async def guard(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                headers = dict(scope["headers"])
                tenant = headers.get(b"x-tenant")
                if tenant is not None:  # who called, as the gateway says (a file per value)
                    token = headers.get(b"authorization", b"").decode().removeprefix("Bearer ")
                    (MARKERS / f"tenant-{tenant.decode()}-{token}").touch()
                if headers.get(b"authorization") not in tokens:
                    await send({"type": "http.response.start", "status": 401, "headers": []})
                    await send({"type": "http.response.body", "body": b"unauthorized"})
                    return
            await app(scope, receive, send)

        return guard

    app = inner
    uvicorn.run(guarded(app), host="127.0.0.1", port=port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
