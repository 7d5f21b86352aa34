"""Rate limiting of repeated log lines: one failure in a tight loop (``accept()`` failing with "Too
many open files", a client retrying a broken request) must not fill the disk, and one tenant's
flood must not hide another tenant's lines.

:class:`RepeatFilter` keys each record by logger, level, message **template** and **who** caused
it: the authenticated subject of the request being served, else its client address
(:func:`codemode.service.peers.current_client`, an IPv6 address by its ``/64``), else nobody.
The template is the record's format string when it has arguments; a message formatted before it
was logged (the MCP SDK's f-strings carry client-chosen session ids and header values) is cut
after its first ``": "`` and has its digit and hex runs replaced by ``#``, so bogus
``Mcp-Session-Id`` values do not make a new key each.

Within ``window`` seconds the first ``burst`` records of a key pass and the rest are dropped and
counted. When a key's window ends its count is kept: the next record of that key that passes says
``[N similar message(s) suppressed]``, and :meth:`RepeatFilter.flush` (called by the service
every window, and at shutdown) writes one line per key that has not had that chance.

The key table holds at most ``max_keys`` live keys. When it is full, a new key takes the place of
the **longest-idle** key (the one whose last record is the oldest), whose suppressed count is kept
like an ended window's: so one key's flood never hides a new client's first lines (before, new
keys shared one overflow key per template, and a flood from one more address suppressed every other
new client's lines of that template). At most ``max_keys`` keys are replaced per ``window``, so
many addresses cycling through the table cannot lift the bound: past that, new keys share one key
per template (and, past ``max_overflow`` templates, one key for everything) until the next window.
Nothing is forgotten: a replaced key's count is shown like an ended one's. The audit log is never
filtered (each audit line is an event the operator must see; it bounds its refusal lines itself).
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from .. import authz
from .peers import address_key, current_client

__all__ = [
    "AUDIT_LOGGER",
    "OVERFLOW",
    "SUMMARY_LOGGER",
    "Key",
    "RepeatFilter",
    "install_repeat_filter",
    "template",
]

#: The audit logger, never filtered.
AUDIT_LOGGER = "codemode.audit"
#: The logger of the ``[N similar message(s) suppressed]`` lines.
SUMMARY_LOGGER = "codemode.service.logs"
#: The "who" of keys that share one key per template once the table is full.
OVERFLOW = "*"
_DECIDED = "_codemode_repeat"
_SUMMARY = "codemode_summary"

#: A record's key: (logger, level, template, who).
Key = tuple[str, int, str, str]

_VARIABLE = re.compile(r"[0-9A-Fa-f]{8,}|[0-9A-Fa-f]+(?:-[0-9A-Fa-f]+){2,}|\d+")


def template(record: logging.LogRecord) -> str:
    """What records of one kind have in common (see the module docstring).

    Args:
        record: the log record.

    Returns:
        Its format string (with arguments), or its message cut after the first ``": "`` with digit
        and hex runs as ``#``; at most 200 characters.
    """
    msg = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
    if record.args:
        return msg[:200]
    head, sep, _ = msg.partition(": ")
    return _VARIABLE.sub("#", head + sep.rstrip())[:200]


def _who() -> str:
    subject = authz.current_subject()
    if subject is not None:
        return "subject " + subject.id
    client = current_client()
    return "client " + address_key(client) if client else ""


@dataclass
class _Window:
    started: float
    passed: int = 0
    dropped: int = 0


class RepeatFilter(logging.Filter):
    """The filter described in the module docstring.

    Args:
        window: seconds of one key's window.
        burst: records of a key that pass within a window.
        max_keys: live keys in the table.
        max_overflow: templates sharing one key each when the table is full (then one key for all).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        window: float = 10.0,
        burst: int = 5,
        max_keys: int = 1024,
        max_overflow: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.window = window
        self.burst = burst
        self.max_keys = max_keys
        self.max_overflow = max_overflow
        self.clock = clock
        self._live: OrderedDict[Key, _Window] = OrderedDict()  # oldest window first
        self._idle: OrderedDict[Key, None] = OrderedDict()  # live own keys, longest idle first
        self._overflow = 0  # live overflow keys
        self._replaced = 0  # own keys replaced in the replacement window that started at ...
        self._replacing_since = clock()
        self._pending: dict[Key, int] = {}  # suppressed counts of ended windows, not yet shown
        self._pending_other = 0  # ... of keys past the pending table's bound

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == AUDIT_LOGGER or record.name.startswith(AUDIT_LOGGER + "."):
            return True
        if getattr(record, _SUMMARY, False):
            return True
        decided = record.__dict__.get(_DECIDED)
        if isinstance(decided, bool):
            return decided  # the same record on another handler: counted once
        decision = self._decide(record)
        record.__dict__[_DECIDED] = decision
        return decision

    def _decide(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        self._expire(now)
        kind = template(record)
        key: Key = (record.name, record.levelno, kind, _who())
        state = self._live.get(key)
        if state is None and len(self._live) - self._overflow >= self.max_keys and not self._replace(now):
            key = (record.name, record.levelno, kind, OVERFLOW)
            state = self._live.get(key)
            if state is None and self._overflow >= self.max_overflow:
                key = (OVERFLOW, 0, OVERFLOW, OVERFLOW)
                state = self._live.get(key)
            if state is None:
                self._overflow += 1
        if state is None:
            state = self._live[key] = _Window(now)
        if key[3] != OVERFLOW:
            self._idle[key] = None
            self._idle.move_to_end(key)
        if state.passed >= self.burst:
            state.dropped += 1
            return False
        state.passed += 1
        earlier = self._pending.pop(key, 0)
        if earlier:
            record.msg = f"{record.msg} [{earlier} similar message(s) suppressed]"
        return True

    def _replace(self, now: float) -> bool:
        """Make room for a new key by ending the longest-idle own key's window early (False: this
        window's replacements are used up)."""
        if now - self._replacing_since >= self.window:
            self._replacing_since, self._replaced = now, 0
        if self._replaced >= self.max_keys or not self._idle:
            return False
        self._replaced += 1
        key, _ = self._idle.popitem(last=False)
        self._end(key, self._live.pop(key))
        return True

    def _expire(self, now: float) -> None:
        while self._live:
            key, state = next(iter(self._live.items()))
            if now - state.started < self.window:
                return
            del self._live[key]
            self._end(key, state)

    def _end(self, key: Key, state: _Window) -> None:
        """A key's window is over (it ended, or the key was replaced): keep its suppressed count."""
        if key[3] == OVERFLOW:
            self._overflow -= 1
        else:
            self._idle.pop(key, None)
        if state.dropped:
            if key in self._pending or len(self._pending) < self.max_keys:
                self._pending[key] = self._pending.get(key, 0) + state.dropped
            else:
                self._pending_other += state.dropped

    def flush(self, *, final: bool = False) -> None:
        """Write one line for each count of suppressed records whose window ended.

        Args:
            final: of every window, ended or not (at shutdown).
        """
        self._expire(self.clock() + (self.window if final else 0.0))
        pending, self._pending = self._pending, {}
        other, self._pending_other = self._pending_other, 0
        log = logging.getLogger(SUMMARY_LOGGER)
        extra = {_SUMMARY: True}
        for (name, level, kind, who), count in pending.items():
            log.warning(
                "%d similar message(s) suppressed: %s %s %r%s",
                count,
                name,
                logging.getLevelName(level),
                kind,
                f" ({who})" if who else "",
                extra=extra,
            )
        if other:
            log.warning("%d message(s) of other kinds suppressed", other, extra=extra)


_FILTER = RepeatFilter()


def install_repeat_filter(
    names: tuple[str, ...] = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "codemode"),
) -> RepeatFilter:
    """Add the process-wide :class:`RepeatFilter` to the handlers of these loggers (idempotent).
    The audit logger's own handler is left alone.

    Args:
        names: the loggers (``""``: the root).

    Returns:
        The process-wide filter.
    """
    for name in names:
        for handler in logging.getLogger(name).handlers:
            if _FILTER not in handler.filters:
                handler.addFilter(_FILTER)
    return _FILTER
