"""The log rate limiter: keyed by template and by who caused the line, a bounded table that
never forgets the live keys, suppressed counts always shown."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from codemode import authz
from codemode.service import peers
from codemode.service.logfilter import RepeatFilter, template
from tests.support.fakes import Clock


def _record(msg: str, *args: object, name: str = "t") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args or None, None)


@contextlib.contextmanager
def _client(address: str) -> Iterator[None]:
    """Records logged while serving a request of the client ``address``."""
    token = peers._CLIENT.set(address)
    try:
        yield
    finally:
        peers._CLIENT.reset(token)


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


def test_a_full_table_keeps_the_flood_and_makes_room_for_a_new_client() -> None:
    clock = Clock()
    f = RepeatFilter(window=10, burst=2, max_keys=4, max_overflow=2, clock=clock)
    for i in range(4):  # four clients, one line each: the table is full of live, idle keys
        with _client(f"10.1.0.{i}"):
            assert f.filter(_record("Invalid Host header: %s", "x"))
    with _client("10.2.0.1"):  # one more address floods
        flood = [f.filter(_record("Invalid Host header: %s", "x")) for _ in range(20)]
    assert flood.count(True) == 2
    # A client that has logged nothing yet: its first lines pass (before: it shared one overflow
    # key with the flood, which had used up that key's lines). It takes the place of the
    # longest-idle key, not the flood's, which stays suppressed.
    with _client("198.51.100.7"):
        assert [f.filter(_record("Invalid Host header: %s", "y")) for _ in range(3)] == [True, True, False]
    with _client("10.2.0.1"):
        assert not f.filter(_record("Invalid Host header: %s", "x"))
    assert [key[3] for key in f._live] == [
        "client 10.1.0.2",
        "client 10.1.0.3",
        "client 10.2.0.1",
        "client 198.51.100.7",
    ]


def test_a_replaced_key_keeps_its_suppressed_count() -> None:
    f = RepeatFilter(window=10, burst=1, max_keys=2, clock=Clock())
    with _client("10.1.0.1"):
        assert [f.filter(_record("a %s", 1)) for _ in range(4)] == [True, False, False, False]
    with _client("10.1.0.2"):
        f.filter(_record("a %s", 1))
    with _client("10.1.0.3"):  # replaces 10.1.0.1 (the longest idle), with its 3 suppressed lines
        f.filter(_record("a %s", 1))
    with _client("10.1.0.1"):  # back: a new window, which says what the replaced one suppressed
        record = _record("a %s", 2)
        assert f.filter(record) and record.getMessage() == "a 2 [3 similar message(s) suppressed]"


def test_replacements_are_bounded_per_window_then_new_keys_share_one_per_template() -> None:
    clock = Clock()
    f = RepeatFilter(window=10, burst=2, max_keys=4, max_overflow=2, clock=clock)
    for i in range(4):
        assert f.filter(_record(f"kind {'abcd'[i]} %s", 1, name=f"l{i}"))
    # Four more keys (max_keys per window) take the places of the four idle ones...
    for i in range(4):
        assert f.filter(_record(f"kind {'efgh'[i]} %s", 1, name=f"m{i}"))
    # ...and past that, many addresses cycling through cannot lift the bound: new keys share one
    # key per template (2 lines of a new kind from many places pass)...
    results = []
    for i in range(20):
        with _client(f"10.3.0.{i}"):
            results.append(f.filter(_record("new kind %s", i, name="x")))
    assert results.count(True) == 2
    # ...and past max_overflow templates, one key for everything.
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
