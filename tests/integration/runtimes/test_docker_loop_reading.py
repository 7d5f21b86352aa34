"""The Docker attach stream is read by the event loop itself (real engine).

No reader thread per sandbox; the loop stops reading while the stdout buffer is full and resumes when
``read()`` makes room; destroy unregisters the socket from the loop before closing it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from codemode.runtimes.docker import DockerOptions, DockerRuntime
from tests.support.docker_engine import encode, fake_worker, read_frame

pytestmark = pytest.mark.docker

MiB = 1024 * 1024


def reader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("codemode-docker-reader")]


async def test_no_reader_thread_and_frames_round_trip(docker_api: Any) -> None:
    rt = DockerRuntime()
    try:
        sandbox = await rt.spawn()  # the probe already went through the loop-read socket
        assert sandbox._on_loop
        assert reader_threads() == []
        loop = asyncio.get_running_loop()
        fd = sandbox._fd
        await sandbox.close_input()
        assert await read_frame(sandbox) is None  # the real worker exits at end of input
        info = await sandbox.destroy()
        assert info.exit_code == 0
        assert loop.remove_reader(fd) is False  # unregistered before the socket was closed
        assert sandbox._sock.fileno() == -1
    finally:
        await rt.aclose()


async def test_full_buffer_pauses_reading_then_resumes(docker_api: Any) -> None:
    # The worker stays alive until its input ends: the engine may drop output it still holds when a
    # container exits while its attach stream is back-pressured (seen once in CI), which is not
    # what this test is about.
    body = r"""
_read_frame()
for i in range(32):
    _o.write(bytes([i]) * 65536)
_o.flush()
_i.read()
"""
    rt = DockerRuntime(DockerOptions(entrypoint=fake_worker(body), stdout_buffer_bytes=256 * 1024))
    try:
        sandbox = await rt.spawn()
        await sandbox.write(encode({"k": "go"}))
        for _ in range(100):  # the worker writes 2 MiB; the host buffers at most 256 KiB + a chunk
            await asyncio.sleep(0.02)
            assert sandbox.buffered_bytes <= 256 * 1024 + 64 * 1024
        assert not sandbox._reading  # paused: the worker waits on its own pipe
        received = bytearray()
        expected = b"".join(bytes([i]) * 65536 for i in range(32))
        async with asyncio.timeout(60):
            while len(received) < len(expected) and (chunk := await sandbox.read(100_000)):
                received += chunk
        assert bytes(received) == expected
        await sandbox.close_input()
        async with asyncio.timeout(60):
            assert await sandbox.read(100_000) == b""  # nothing more, then the end of the stream
        assert (await sandbox.destroy()).exit_code == 0
    finally:
        await rt.aclose()
