"""The announced stop (docs/service.md, "Shutdown"): at SIGTERM a replica stops saying ready and
closes each connection after its response, but keeps serving new connections for ``drain_delay``
(the time a load balancer needs to stop sending), lets the executes in flight finish, then exits.

The service runs as ``codemode.service.serve()`` in its own process (support_process) and gets a
real SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path

from tests.support.service import PACK_SPEC, call, http_get, mcp_client, write_token_file
from tests.support.service_process import service_process

SLOW = "def main():\n    return svc.slow(seconds=%s)['value']\n"
ECHO = "def main():\n    return svc.echo(value=%r)['value']\n"


def config(tokens: Path, **extra: str) -> str:
    lines = [f'token_file = "{tokens}"', "allow_all = true", f'packs = ["{PACK_SPEC}"]', 'log_level = "info"']
    return "\n".join([*lines, *(f"{k} = {v}" for k, v in extra.items())]) + "\n"


async def test_sigterm_announces_the_stop_and_serves_new_connections_for_the_drain_delay(
    tmp_path: Path,
) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    delay = 4.0
    async with service_process(tmp_path, config(tokens.path, drain_delay=str(delay))) as srv:
        proc, base = srv.proc, srv.url
        async with mcp_client(srv.mcp_url, tokens["alice"]) as client:
            await client.list_tools()
            in_flight = asyncio.create_task(call(client, "execute", source=SLOW % "2.0"))
            await asyncio.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.sleep(0.3)
            # Not ready at once; the response closes its connection (a keep-alive client reconnects,
            # and a load balancer that has dropped this replica sends it elsewhere).
            ready = await http_get(base + "/readyz")
            assert ready.status_code == 503 and ready.json()["reason"] == "shutting down"
            assert ready.headers["connection"] == "close"
            # A client that connects after the readiness drop (its balancer had not updated yet) is
            # still served, end to end, through a new connection.
            async with mcp_client(srv.mcp_url, tokens["alice"]) as late:
                assert await call(late, "execute", source=ECHO % "late") == {"result": "late"}
            assert time.monotonic() - signalled < delay
            assert await in_flight == {"result": "slept"}
        # After the delay the listener closes and the process exits cleanly.
        code = await asyncio.to_thread(proc.wait, 60)
        assert code in (0, -signal.SIGTERM)
        assert time.monotonic() - signalled >= delay - 0.5
        text = srv.stderr()
    assert "drain_delay=4s" in text and "closing the listener" in text, text


async def test_without_a_drain_delay_sigterm_closes_the_listener_at_once(tmp_path: Path) -> None:
    # The default (drain_delay = 0): today's stop; in-flight executes still finish.
    tokens = write_token_file(tmp_path, ["alice"])
    async with service_process(tmp_path, config(tokens.path)) as srv:
        async with mcp_client(srv.mcp_url, tokens["alice"]) as client:
            await client.list_tools()
            in_flight = asyncio.create_task(call(client, "execute", source=SLOW % "1.5"))
            await asyncio.sleep(0.5)
            srv.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", srv.port)) != 0  # refused: the listener is closed
            assert await in_flight == {"result": "slept"}
        assert await asyncio.to_thread(srv.proc.wait, 60) in (0, -signal.SIGTERM)
