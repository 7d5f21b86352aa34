"""The log rate limiter: keyed by template and by who caused the line, a bounded table that
never forgets the live keys, suppressed counts always shown."""

from __future__ import annotations

import logging

from codemode import authz
from codemode.service.logfilter import RepeatFilter, template


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(msg: str, *args: object, name: str = "t") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args or None, None)


def test_preformatted_messages_with_client_chosen_ids_share_a_template() -> None:
    texts = [
        "Rejected request with unknown or expired session ID: zzz-not-hex",
        "Rejected request with unknown or expired session ID: 0123456789abcdef",
        "Rejected request with unknown or expired session ID: ",
    ]
    assert {template(_record(t)) for t in texts} == {"Rejected request with unknown or expired session ID:"}
    assert (
        template(_record("Session 3fa85f6457174562b3fc2c963f66afa6 idle timeout")) == "Session # idle timeout"
    )
    assert template(_record("Session 12 of 40 idle")) == "Session # of # idle"
    # With arguments the format string is the template.
    assert template(_record("accept failed: %s", "Too many open files")) == "accept failed: %s"


def test_keys_are_per_subject_so_one_tenant_does_not_hide_another() -> None:
    f = RepeatFilter(window=10, burst=2, clock=Clock())
    with authz.with_subject(authz.Subject("mallory")):
        passed = [f.filter(_record("Invalid Host header: %s", f"h{i}")) for i in range(50)]
    assert passed.count(True) == 2
    with authz.with_subject(authz.Subject("alice")):
        assert f.filter(_record("Invalid Host header: %s", "x"))


def test_a_full_table_keeps_its_live_keys_and_shares_one_key_per_template() -> None:
    clock = Clock()
    f = RepeatFilter(window=10, burst=2, max_keys=4, max_overflow=2, clock=clock)
    assert [f.filter(_record("flood %s", 1)) for _ in range(3)] == [True, True, False]
    for i in range(3):
        assert f.filter(_record(f"other kind {'abcdefghij'[i]} %s", 1, name=f"l{i}"))
    # The table is full (4 live keys): the flood's key is not forgotten (before: every key was
    # cleared once 1,024 were seen, and the flood passed again).
    assert not f.filter(_record("flood %s", 2))
    # New keys share one key per template: 2 more lines of a new kind from many places pass.
    results = [f.filter(_record("new kind %s", i, name="x")) for i in range(20)]
    assert results.count(True) == 2
    # Past max_overflow templates, one key for everything.
    everything = [f.filter(_record(f"kind {c} %s", 0, name="y")) for c in "klmnopqrstuvwxyz"]
    assert everything == [True, True, True] + [False] * 13  # one key of its own, then the shared one
    # When the windows end, live keys make room again.
    clock.now = 11
    assert f.filter(_record("brand new %s", 1))
    assert len(f._live) == 1


def test_suppressed_counts_are_shown_on_the_next_line_or_by_flush(caplog: object) -> None:
    clock = Clock()
    f = RepeatFilter(window=10, burst=1, clock=clock)
    for _ in range(5):
        f.filter(_record("a %s", 1))
    for _ in range(3):
        f.filter(_record("b %s", 1))
    clock.now = 10
    record = _record("a %s", 2)
    assert f.filter(record) and record.getMessage() == "a 2 [4 similar message(s) suppressed]"
    lines: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record)

    handler = Collect()
    handler.addFilter(f)
    logger = logging.getLogger("codemode.service.logs")
    logger.addHandler(handler)
    try:
        f.flush()
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in lines] == ["2 similar message(s) suppressed: t WARNING 'b %s'"]
    f.flush()  # nothing left to say
    assert len(lines) == 1


def test_one_record_on_two_handlers_counts_once() -> None:
    f = RepeatFilter(window=10, burst=2, clock=Clock())
    decisions = []
    for _ in range(3):
        record = _record("x %s", 1)
        decisions.append((f.filter(record), f.filter(record)))
    assert decisions == [(True, True), (True, True), (False, False)]


def test_the_final_flush_counts_windows_that_have_not_ended() -> None:
    f = RepeatFilter(window=10, burst=1, clock=Clock())
    for _ in range(4):
        f.filter(_record("a %s", 1))
    f.flush()
    assert f._pending == {} and f._live  # the window is still open: nothing to write yet
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("codemode.service.logs")
    handler = Collect()
    logger.addHandler(handler)
    try:
        f.flush(final=True)  # shutdown
    finally:
        logger.removeHandler(handler)
    assert lines == ["3 similar message(s) suppressed: t WARNING 'a %s'"]
