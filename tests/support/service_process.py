"""``codemode.service.serve()`` in a process of its own (no tests here): configured by a TOML file
and ``CODEMODE_*`` variables only, every port chosen free, stderr kept in a file for the test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServiceProcess:
    proc: subprocess.Popen[bytes]
    port: int
    health_port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mcp_url(self) -> str:
        return self.url + "/mcp"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}"

    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


@contextlib.asynccontextmanager
async def service_process(
    directory: Path, toml: str, *, env: dict[str, str] | None = None
) -> AsyncIterator[ServiceProcess]:
    """Start the service with ``toml`` as its configuration file; wait until ``/readyz`` passes on
    the health port; SIGTERM (then kill) at the end."""
    config = directory / "codemode.toml"
    config.write_text(toml)
    port, health = free_port(), free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CODEMODE_")}
    environment.update(
        {
            "CODEMODE_CONFIG": str(config),
            "CODEMODE_PORT": str(port),
            "CODEMODE_HEALTH_PORT": str(health),
            "CODEMODE_METRICS_PORT": "0",
            "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p),
            **(env or {}),
        }
    )
    log = directory / "service.stderr"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from codemode.service import serve; serve()"],
            cwd=str(directory),
            env=environment,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    running = ServiceProcess(proc, port, health, log)
    try:
        async with asyncio.timeout(60):
            while True:
                assert proc.poll() is None, running.stderr()
                try:
                    async with httpx.AsyncClient(timeout=5) as http:
                        if (await http.get(running.health_url + "/readyz")).status_code == 200:
                            break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        yield running
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
