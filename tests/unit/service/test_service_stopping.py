"""The announced stop's signal handling (codemode.service.stopping); the whole stop with a real
SIGTERM is in tests/integration/service/test_service_stop.py."""

from __future__ import annotations

import asyncio
import signal

import uvicorn

from codemode.service.stopping import AnnouncedStopServer


async def _app(scope: object, receive: object, send: object) -> None:  # pragma: no cover
    raise AssertionError("not served")


def server(delay: float, announced: list[int]) -> AnnouncedStopServer:
    return AnnouncedStopServer(uvicorn.Config(_app), drain_delay=delay, announce=lambda: announced.append(1))


async def test_the_first_signal_announces_and_the_listener_closes_after_the_delay() -> None:
    announced: list[int] = []
    srv = server(0.3, announced)
    srv.handle_exit(signal.SIGTERM, None)
    assert announced == [1] and not srv.should_exit
    assert await srv.on_tick(1) is False  # still serving
    await asyncio.sleep(0.35)
    assert await srv.on_tick(1) is True and srv.should_exit


def test_a_second_signal_skips_the_rest_of_the_delay() -> None:
    announced: list[int] = []
    srv = server(60, announced)
    srv.handle_exit(signal.SIGTERM, None)
    srv.handle_exit(signal.SIGTERM, None)
    assert srv.should_exit and announced == [1]


def test_without_a_delay_the_first_signal_stops_at_once() -> None:
    announced: list[int] = []
    srv = server(0, announced)
    srv.handle_exit(signal.SIGINT, None)
    assert srv.should_exit and announced == [1]
