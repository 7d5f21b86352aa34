"""A compromised worker: every misbehaviour is classified, bounded, and never dispatches a handler
without the host's own rebind and authorization."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

import codemode
from codemode.errors import client_text

from ..integration.helpers import ALICE, Recorder, make_server

FAKE = str(Path(__file__).with_name("fake_worker.py"))


async def outcome(mode: str, **limits: object) -> tuple[str, Recorder, float]:
    runtime = codemode.ProcessRuntime(argv=[sys.executable, FAKE, mode])
    srv, rec = make_server(runtime=runtime, **limits)  # type: ignore[arg-type]
    t0 = time.monotonic()
    try:
        value = await srv.execute("def main():\n    return 1\n", subject=ALICE)
        return f"value:{value}", rec, time.monotonic() - t0
    except codemode.CodeModeError as exc:
        return client_text(exc), rec, time.monotonic() - t0
    finally:
        await srv.aclose()


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("oversized", "internal failure"),
        ("truncated", "internal failure"),
        ("unknown_kind", "internal failure"),
        ("extra_key", "internal failure"),
        ("garbage_json", "internal failure"),
        ("nan", "internal failure"),
        ("unknown_capability", "internal failure"),
        ("disabled_capability", "internal failure"),
        ("bad_args", "internal failure"),
        ("extra_args", "internal failure"),
        ("wrong_seq", "internal failure"),
        ("deep_args", "resource limit exceeded"),
        ("deep_final", "resource limit exceeded"),
        ("very_deep_final", "internal failure"),  # undecodable: nested past the JSON parser
        ("huge_int", "internal failure"),
        ("flood_calls", "resource limit exceeded"),
        ("flood_bytes", "internal failure"),
        ("unsolicited_result", "internal failure"),
        ("unknown_error", "internal failure"),
        ("silent_exit", "internal failure"),
    ],
)
async def test_hostile_worker_is_classified(mode: str, expected: str) -> None:
    text, rec, elapsed = await outcome(mode)
    assert text == expected
    assert elapsed < 3.0
    if mode != "flood_calls":
        assert rec.handler_calls == []
        assert rec.authz_inputs == []
    else:
        # Every dispatched call went through authorization first, and no more than the budget.
        assert len(rec.handler_calls) == len(rec.authz_inputs) == 100


async def test_call_after_final_is_never_dispatched() -> None:
    text, rec, _ = await outcome("call_after_final")
    assert text == "value:done"
    assert rec.handler_calls == [] and rec.authz_inputs == []


async def test_long_error_message_is_sanitized_and_bounded() -> None:
    text, _, _ = await outcome("long_error")
    assert text.startswith("invalid program: ")
    assert "\x1b" not in text
    assert len(text.encode()) <= len("invalid program: ") + 1024


async def test_hanging_worker_hits_the_deadline() -> None:
    text, _, elapsed = await outcome("hang", max_execution_time=0.5)
    assert text == "resource limit exceeded"
    assert elapsed < 1.2


async def test_honest_fake_worker_passes_through_the_pipeline() -> None:
    text, rec, _ = await outcome("honest_echo")
    assert text == "value:{'value': 'hi'}"
    assert len(rec.authz_inputs) == 1 and rec.authz_inputs[0].arguments == {"value": "hi"}
