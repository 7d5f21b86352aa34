"""Closing a process worker's input and then destroying it leaves no error in the event loop
(found by the native-call benchmark: the input transport was aborted after it had already closed,
and asyncio reported ``_call_connection_lost`` failing on a transport without protocol)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from codemode.runtimes.process import SPAWN_MODES, ProcessOptions, ProcessRuntime, Spawn


@pytest.mark.parametrize("spawn", SPAWN_MODES)
async def test_close_input_then_destroy_reports_nothing_to_the_loop(spawn: Spawn) -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    runtime = ProcessRuntime(ProcessOptions(spawn=spawn))
    try:
        for close_first in ("awaited", "racing", "no"):
            sandbox = await runtime.spawn()
            if close_first == "awaited":
                await sandbox.close_input()
            elif close_first == "racing":  # destroy while close_input() waits for the pipe to close
                closing = asyncio.ensure_future(sandbox.close_input())
                await asyncio.sleep(0)
            info = await sandbox.destroy()
            assert info is not None
            if close_first == "racing":
                await closing
        for _ in range(3):  # let every scheduled callback run
            await asyncio.sleep(0.01)
    finally:
        loop.set_exception_handler(previous)
        await runtime.aclose()
    assert errors == [], [str(e.get("exception") or e.get("message")) for e in errors]
