"""The worker template's contract with the host (``codemode.runtimes.process.template``, ``forked``): each
worker is a fresh process that is killed and reaped exactly once, and the host learns how it ended
(exit code, signal) from the template; a template that reads a control message it does not accept
ends, and its workers with it; closing the runtime leaves no process behind."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator

import pytest

from codemode.runtimes.base import SpawnFailed
from codemode.runtimes.process import ProcessOptions, ProcessRuntime
from codemode.runtimes.process.forked import ForkedSandbox
from codemode_worker.protocol import encode_frame

TESTING = {"CODEMODE_WORKER_TESTING": "1"}
LIMITS = {
    "max_steps": 1000,
    "max_value_depth": 8,
    "max_value_bytes": 1024,
    "max_native_calls": 1,
    "max_callstack": 50,
}


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(p) for p in children.read().split()]


async def _run(sandbox: ForkedSandbox, python: str) -> None:
    frame = {"k": "exec", "v": 1, "source": python, "manifest": [], "limits": LIMITS}
    await sandbox.write(encode_frame(frame))
    while await sandbox.read(65536):
        pass
    # Its stdout ends just before it does: a destroy() in between would kill it (SIGKILL, not its code).
    for _ in range(500):
        if not sandbox.alive():
            return
        await asyncio.sleep(0.01)


@pytest.fixture
async def runtime() -> AsyncIterator[ProcessRuntime]:
    rt = ProcessRuntime(ProcessOptions(module="codemode_worker.testing_entry", extra_env=TESTING))
    yield rt
    await rt.aclose()


@pytest.mark.parametrize(
    ("python", "code", "sig"),
    [
        ("raise SystemExit(7)", 7, None),
        ("import os\nos.abort()", None, signal.SIGABRT),
        ("import time\ntime.sleep(60)", None, signal.SIGKILL),  # still running: destroy kills it
    ],
)
async def test_the_host_learns_how_a_worker_ended_and_it_is_reaped_once(
    runtime: ProcessRuntime, python: str, code: int | None, sig: int | None
) -> None:
    sandbox = await runtime.spawn()
    assert isinstance(sandbox, ForkedSandbox)
    template = (await runtime.template()).pid
    assert _children(template) == [sandbox.pid]
    if sig == signal.SIGKILL:
        await sandbox.write(
            encode_frame({"k": "exec", "v": 1, "source": python, "manifest": [], "limits": LIMITS})
        )
        await asyncio.sleep(0.2)
        assert sandbox.alive()
    else:
        await _run(sandbox, python)
    info = await sandbox.destroy()
    assert (info.exit_code, info.signal) == (code, sig), info
    assert await sandbox.destroy() is info  # exactly once: later calls touch nothing
    assert _state(sandbox.pid) is None  # reaped: not even a zombie is left
    assert _children(template) == []
    assert not sandbox.alive()


async def test_a_template_refusing_a_control_message_ends_with_its_workers(runtime: ProcessRuntime) -> None:
    sandbox = await runtime.spawn()
    template = await runtime.template()
    template._control.send(b"not a control message")
    for _ in range(500):
        if template.gone:
            break
        await asyncio.sleep(0.01)
    assert template.gone and (await template._proc.wait()) == 2  # EXIT_CONTROL
    assert _state(sandbox.pid) is None  # killed and reaped by the template on its way out
    info = await sandbox.destroy()
    assert info.exit_code is None  # its status went with the template
    again = await runtime.spawn()  # a new template
    assert (await runtime.template()).pid != template.pid
    await again.destroy()


async def test_closing_the_runtime_leaves_no_process(runtime: ProcessRuntime) -> None:
    sandboxes = [await runtime.spawn() for _ in range(3)]
    template = (await runtime.template()).pid
    await runtime.aclose()
    assert _state(template) is None
    assert all(_state(s.pid) is None for s in sandboxes)


async def test_a_template_that_cannot_start_fails_the_spawn() -> None:
    runtime = ProcessRuntime(ProcessOptions(template_argv=["/bin/false"], spawn_timeout=5.0))
    try:
        with pytest.raises(SpawnFailed, match="did not start"):
            await runtime.spawn()
    finally:
        await runtime.aclose()
