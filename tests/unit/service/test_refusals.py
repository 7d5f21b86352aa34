"""Refused requests in the audit log: per client address, one line now, one summary per window."""

from __future__ import annotations

from typing import Any

from codemode.service.refusals import OVERFLOW, RefusalSummary


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _summary(max_clients: int = 1024) -> tuple[RefusalSummary, list[dict[str, Any]], Clock]:
    lines: list[dict[str, Any]] = []
    clock = Clock()

    def emit(event: str, **fields: Any) -> None:
        lines.append({"event": event, **fields})

    return RefusalSummary(emit, window=10.0, max_clients=max_clients, clock=clock), lines, clock


def _total(lines: list[dict[str, Any]], client: str) -> int:
    return sum(1 if x["event"] == "auth_failure" else x["count"] for x in lines if x["client"] == client)


def test_the_first_refusal_is_written_at_once_and_the_rest_once_per_window() -> None:
    summary, lines, clock = _summary()
    for i in range(5000):
        summary.refused("unknown_token" if i % 2 else "missing_token", "10.0.0.7", "/mcp")
    assert lines == [
        {"event": "auth_failure", "reason": "missing_token", "client": "10.0.0.7", "path": "/mcp"}
    ]
    clock.now += 10.0
    summary.refused("expired", "10.0.0.7", "/mcp")  # a new window: written again at once
    assert lines[1] == {
        "event": "auth_failures",
        "client": "10.0.0.7",
        "count": 4999,
        "reasons": {"missing_token": 2499, "unknown_token": 2500},
        "window_s": 10.0,
    }
    assert lines[2]["event"] == "auth_failure" and lines[2]["reason"] == "expired"
    summary.flush()
    assert len(lines) == 3  # nothing more to say: only the one refusal in this window
    assert _total(lines, "10.0.0.7") == 5001


def test_addresses_past_the_table_share_one_overflow_line() -> None:
    summary, lines, _ = _summary(max_clients=3)
    for i in range(10):
        for _ in range(4):
            summary.refused("unknown_token", f"10.0.0.{i}", "/mcp")
    summary.flush()
    assert len([x for x in lines if x["event"] == "auth_failure"]) == 3
    assert len([x for x in lines if x["event"] == "auth_failures"]) == 4
    assert _total(lines, OVERFLOW) == 28
    assert sum(_total(lines, f"10.0.0.{i}") for i in range(3)) + _total(lines, OVERFLOW) == 40


def test_an_ipv6_client_is_counted_by_its_64_so_it_takes_one_entry() -> None:
    summary, lines, _ = _summary(max_clients=2)
    for i in range(50):  # 50 addresses of one /64 (one host usually holds all of it)
        summary.refused("unknown_token", f"2001:db8::{i + 1:x}", "/mcp")
    summary.refused("unknown_token", "2001:db8:0:1::1", "/mcp")  # another /64: its own entry
    summary.refused("missing_token", "198.51.100.7", "/mcp")  # the table is full: counted under "*"
    summary.flush()
    assert [x["client"] for x in lines if x["event"] == "auth_failure"] == ["2001:db8::1", "2001:db8:0:1::1"]
    assert _total(lines, "2001:db8::/64") == 49
    assert _total(lines, "2001:db8::1") == 1
    assert _total(lines, OVERFLOW) == 1
