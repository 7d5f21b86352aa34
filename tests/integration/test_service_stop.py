"""The announced stop (docs/service.md, "Shutdown"): at SIGTERM a replica stops saying ready and
closes each connection after its response, but keeps serving new connections for ``drain_delay``
(the time a load balancer needs to stop sending), lets the executes in flight finish, then exits.

The service runs as ``codemode.service.serve()`` in its own process and gets a real SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from .support_service import PACK_SPEC, call, http_get, mcp_client, write_token_file

SLOW = "def main():\n    return svc.slow(seconds=%s)['value']\n"
ECHO = "def main():\n    return svc.echo(value=%r)['value']\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_process(tmp_path: Path, port: int, **env_extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """``serve()`` in a subprocess on 127.0.0.1:``port`` with the test pack, configured by env."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEMODE_")}
    root = Path(__file__).resolve().parents[2]
    env.update(
        {
            "CODEMODE_PORT": str(port),
            "CODEMODE_METRICS_PORT": "0",
            "CODEMODE_HEALTH_PORT": "0",
            "CODEMODE_ALLOW_ALL": "true",
            "CODEMODE_PACKS": PACK_SPEC,
            "CODEMODE_LOG_LEVEL": "info",
            "PYTHONPATH": str(root),
            **env_extra,
        }
    )
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-c", "from codemode.service import serve; serve()"],
        cwd=str(root),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


async def wait_ready(base: str, proc: subprocess.Popen[bytes]) -> None:
    async with asyncio.timeout(60):
        while True:
            assert proc.poll() is None, "server exited before it was ready"
            with contextlib.suppress(httpx.HTTPError):
                if (await http_get(base + "/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)


async def test_sigterm_announces_the_stop_and_serves_new_connections_for_the_drain_delay(
    tmp_path: Path,
) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    delay = 4.0
    with serve_process(
        tmp_path, port, CODEMODE_TOKEN_FILE=str(tokens.path), CODEMODE_DRAIN_DELAY=str(delay)
    ) as proc:
        await wait_ready(base, proc)
        async with mcp_client(base + "/mcp", tokens["alice"]) as client:
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
            async with mcp_client(base + "/mcp", tokens["alice"]) as late:
                assert await call(late, "execute", source=ECHO % "late") == {"result": "late"}
            assert time.monotonic() - signalled < delay
            assert await in_flight == {"result": "slept"}
        # After the delay the listener closes and the process exits cleanly.
        code = await asyncio.to_thread(proc.wait, 60)
        assert code in (0, -signal.SIGTERM)
        assert time.monotonic() - signalled >= delay - 0.5
    text = (tmp_path / "server.log").read_text()
    assert "drain_delay=4s" in text and "closing the listener" in text, text


async def test_without_a_drain_delay_sigterm_closes_the_listener_at_once(tmp_path: Path) -> None:
    # The default (drain_delay = 0): today's stop; in-flight executes still finish.
    tokens = write_token_file(tmp_path, ["alice"])
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with serve_process(tmp_path, port, CODEMODE_TOKEN_FILE=str(tokens.path)) as proc:
        await wait_ready(base, proc)
        async with mcp_client(base + "/mcp", tokens["alice"]) as client:
            await client.list_tools()
            in_flight = asyncio.create_task(call(client, "execute", source=SLOW % "1.5"))
            await asyncio.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", port)) != 0  # refused: the listener is closed
            assert await in_flight == {"result": "slept"}
        assert await asyncio.to_thread(proc.wait, 60) in (0, -signal.SIGTERM)
