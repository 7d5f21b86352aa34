"""Watching the event loop: how often another task runs while something is awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def ticks_while(awaitable: Awaitable[Any]) -> tuple[int, Any]:
    """How many times another task ran while ``awaitable`` was awaited, and its outcome (its
    result, or the exception it raised)."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    try:
        result: Any = await awaitable
    except Exception as exc:
        result = exc
    task.cancel()
    return ticks - before, result
