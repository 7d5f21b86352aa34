"""The service with the real Docker runtime: readiness flips when the engine becomes unreachable and
recovers when it is back; executes run in worker containers; nothing is left behind.

The engine is reached through a unix-socket proxy owned by the test (``docker_base_url``), and
"stopping the daemon" means stopping the proxy: the real daemon, which other tests use, is never
touched. Marked ``docker``: skips without an engine and the worker image, fails under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from codemode.service import create_app
from codemode.startup.config import ConfigError
from tests.support.docker_engine import worker_containers
from tests.support.service import execute, http_get, service, settings, write_token_file

pytestmark = pytest.mark.docker

ECHO = "def main():\n    return svc.echo(value='from-a-container')['value']\n"


def _daemon_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        pytest.skip(f"the socket proxy needs a unix-socket engine, DOCKER_HOST={host!r}")
    return host.removeprefix("unix://") or "/var/run/docker.sock"


class SocketProxy:
    """A byte pipe from a test-owned unix socket to the engine's; ``stop()`` refuses new connections
    and drops the open ones, like an engine that went away."""

    def __init__(self, path: Path, target: str) -> None:
        self.path = path
        self.target = target
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._client, path=str(self.path))

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()
        for task in list(self.pipes):
            task.cancel()
        await asyncio.gather(*self.pipes, return_exceptions=True)
        self.server = None

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.target)
        except OSError:
            writer.transport.abort()
            return
        self.writers |= {writer, up_writer}
        tasks = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ]
        self.pipes.update(tasks)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self.pipes.difference_update(tasks)
            self.writers -= {writer, up_writer}
            for w in (writer, up_writer):
                w.transport.abort()

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            with contextlib.suppress(OSError):
                dst.write_eof()


async def test_readiness_follows_the_docker_engine(tmp_path: Path, docker_api: Any) -> None:

    proxy = SocketProxy(tmp_path / "engine.sock", _daemon_socket())
    await proxy.start()
    tokens = write_token_file(tmp_path, ["alice"])
    cfg = settings(
        token_file=tokens.path,
        runtime="docker",
        docker_base_url=f"unix://{proxy.path}",
        max_execution_time=20,
    )
    instance = ""
    try:
        async with service(cfg) as srv:
            runtime = srv.service.server.runtime
            instance = runtime.instance_id
            ready = await http_get(srv.url + "/readyz")
            assert ready.status_code == 200, ready.text
            assert await execute(srv.mcp_url, tokens["alice"], ECHO) == {"result": "from-a-container"}

            await proxy.stop()
            down = await http_get(srv.url + "/readyz")
            assert down.status_code == 503
            assert down.json() == {"status": "not ready", "reason": "runtime unavailable"}
            assert str(proxy.path) not in down.text
            assert (await http_get(srv.url + "/healthz")).status_code == 200
            assert await execute(srv.mcp_url, tokens["alice"], ECHO) == ("error", "internal failure")

            await proxy.start()
            async with asyncio.timeout(30):
                while (await http_get(srv.url + "/readyz")).status_code != 200:
                    await asyncio.sleep(0.2)
            assert await execute(srv.mcp_url, tokens["alice"], ECHO) == {"result": "from-a-container"}
        assert worker_containers(docker_api, f"io.codemode.runtime-instance={instance}") == []
    finally:
        if proxy.server is not None:
            await proxy.stop()
        if instance:
            for c in worker_containers(docker_api, f"io.codemode.runtime-instance={instance}"):
                docker_api.remove_container(c["Id"], force=True)


@pytest.mark.usefixtures("docker_api")
async def test_missing_worker_image_stops_the_start_or_is_not_ready(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    cfg = settings(token_file=tokens.path, runtime="docker", docker_image="codemode-worker:no-such-tag")
    strict = create_app(cfg).state.codemode
    with pytest.raises(ConfigError, match=r"the docker runtime is not usable: .*no-such-tag"):
        await strict.check_start()
    await strict.shutdown()
    # a degraded start (the start-up rule, docs/service.md) serves and reports not ready
    async with service(cfg.model_copy(update={"start_degraded": True})) as srv:
        resp = await http_get(srv.url + "/readyz")
        assert resp.status_code == 503
        assert resp.json() == {"status": "not ready", "reason": "runtime unavailable"}
        assert "no-such-tag" not in resp.text
