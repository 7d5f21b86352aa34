"""Rate limiting of repeated log lines: one failure in a tight loop (``accept()`` failing with "Too
many open files", a client retrying a broken request) must not fill the disk.

:class:`RepeatFilter` keys each record by logger, level and message template (not its arguments):
within ``window`` seconds the first ``burst`` records of a key pass and the rest are dropped; the
next record that passes after a drop says how many were suppressed. The audit log is never filtered
(each audit line is an event the operator must see).
"""

from __future__ import annotations

import logging
import time

__all__ = ["RepeatFilter", "install_repeat_filter"]

AUDIT_LOGGER = "codemode.audit"


class RepeatFilter(logging.Filter):
    def __init__(self, window: float = 10.0, burst: int = 5, max_keys: int = 1024) -> None:
        super().__init__()
        self.window = window
        self.burst = burst
        self.max_keys = max_keys
        self._seen: dict[tuple[str, int, str], list[float]] = {}  # key -> [window start, count, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == AUDIT_LOGGER or record.name.startswith(AUDIT_LOGGER + "."):
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = time.monotonic()
        state = self._seen.get(key)
        if state is None or now - state[0] >= self.window:
            dropped = int(state[2]) if state is not None else 0
            if len(self._seen) >= self.max_keys:
                self._seen.clear()
            self._seen[key] = [now, 1, 0]
            if dropped:
                _note(record, dropped)
            return True
        state[1] += 1
        if state[1] <= self.burst:
            return True
        state[2] += 1
        return False


def _note(record: logging.LogRecord, dropped: int) -> None:
    record.msg = f"{record.msg} [{dropped} similar message(s) suppressed]"


_FILTER = RepeatFilter()


def install_repeat_filter(
    names: tuple[str, ...] = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "codemode"),
) -> RepeatFilter:
    """Add the process-wide :class:`RepeatFilter` to the handlers of these loggers (idempotent).
    The audit logger's own handler is left alone."""
    for name in names:
        for handler in logging.getLogger(name).handlers:
            if _FILTER not in handler.filters:
                handler.addFilter(_FILTER)
    return _FILTER
