"""/readyz on the health port never says ready before the MCP port listens.

The health and metrics listeners start in the application's lifespan, which uvicorn runs before it
binds the MCP socket: a probe could pass (and a Service send traffic) while connections to the MCP
port were still refused. Here the MCP socket's bind is held back one second, the window a loaded machine
can open (the full suite met it as ConnectionRefusedError right after /readyz passed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from codemode.service import serve_async
from tests.support.service import settings, write_token_file
from tests.support.service_process import free_port

pytestmark = pytest.mark.slow


async def _port_accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


@pytest.mark.timeout(60)
async def test_readyz_waits_for_the_mcp_listener(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    port, health = free_port(), free_port()
    real_create_server = asyncio.BaseEventLoop.create_server

    async def late_create_server(self: asyncio.BaseEventLoop, *args: Any, **kwargs: Any) -> Any:
        sock = kwargs.get("sock")  # serve_async binds every port first and hands uvicorn the socket
        if kwargs.get("port") == port or port in args or (sock is not None and sock.getsockname()[1] == port):
            await asyncio.sleep(1.0)  # the MCP socket is bound only after this
        return await real_create_server(self, *args, **kwargs)

    monkeypatch.setattr(asyncio.BaseEventLoop, "create_server", late_create_server)
    servers: list[uvicorn.Server] = []
    real_serve = uvicorn.Server.serve

    async def recorded_serve(self: uvicorn.Server, *args: Any, **kwargs: Any) -> None:
        servers.append(self)  # to stop it the way SIGTERM does
        await real_serve(self, *args, **kwargs)

    monkeypatch.setattr(uvicorn.Server, "serve", recorded_serve)
    task = asyncio.create_task(
        serve_async(
            settings(port=port, health_port=health, token_file=write_token_file(tmp_path, ["alice"]).path)
        )
    )
    answers: list[tuple[int, bool]] = []
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            for _ in range(400):
                try:
                    status = (await http.get(f"http://127.0.0.1:{health}/readyz")).status_code
                except httpx.TransportError:
                    status = 0
                if status == 200:
                    answers.append((status, await _port_accepts(port)))
                    break
                if status:
                    answers.append((status, False))
                await asyncio.sleep(0.02)
    finally:
        for server in servers:
            server.should_exit = True
        async with asyncio.timeout(30):
            await task
    assert answers and answers[-1] == (200, True), answers
    assert any(status == 503 for status, _ in answers), "the window was not observed: " + repr(answers)
