"""Which connections a listener admits, and what it counts (docs/service.md, "Before
authentication" and "Connections"): the bookkeeping of :mod:`codemode.service.edge`'s protocol,
with no I/O of its own. :class:`ConnectionGuard` holds one listener's bounds (total, per address
before authentication, per subject) and, on the side listeners, the idle connections that can make
room for a new one.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from .peers import TrustedProxies, address_key

__all__ = ["Connection", "ConnectionGuard"]


@dataclass(eq=False)
class Connection:
    """One open connection, as the guard counts it.

    Attributes:
        key: its address key (None: not bounded per address, a trusted proxy).
        authenticated: whether a request on it authenticated.
        subject: the subject it counts for.
        gone: closed, or closed by the guard to make room: no longer counted.
        close: what the guard calls to close it.
    """

    key: str | None
    authenticated: bool = False
    subject: str | None = None
    gone: bool = False
    close: Callable[[], None] | None = None


def _canned(status: int, reason: str, error: str, extra: str = "") -> bytes:
    body = json.dumps({"error": error}).encode("utf-8")
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\ncache-control: no-store\r\nconnection: close\r\n{extra}\r\n"
    )
    return head.encode("ascii") + body


_TOO_MANY_FROM_ADDRESS = _canned(429, "Too Many Requests", "too many connections", "retry-after: 1\r\n")
_TOO_MANY = _canned(503, "Service Unavailable", "too many connections", "retry-after: 1\r\n")


@dataclass(eq=False)
class ConnectionGuard:
    """The bounds of one listener and its table of unauthenticated connections per address.

    Attributes:
        max_connections: connections open at once (the total bound).
        per_address: unauthenticated connections of one address.
        header_timeout: seconds a connection has to deliver a complete request head.
        per_subject: connections counted for one subject (None: not bounded).
        write_timeout: seconds an answer may wait unsent because the client does not read.
        proxies: the trusted proxies (their connections are not bounded per address).
        on_event: called with ``address``, ``total``, ``subject``, ``header_timeout``,
            ``write_timeout`` or ``evicted`` for each connection refused or closed.
        access_log: whether uvicorn writes its access log for the listener.
        evict_idle: make room by closing idle connections instead of refusing (the side
            listeners; see above).
        unauthenticated: unauthenticated connections open, per address key.
        subjects: connections counted for each subject.
        open: connections open.
        idle: with ``evict_idle``, the idle connections per address key, longest idle first.
    """

    max_connections: int
    per_address: int
    header_timeout: float
    per_subject: int | None = None
    write_timeout: float = 10.0
    proxies: TrustedProxies = field(default_factory=TrustedProxies)
    on_event: Callable[[str], None] | None = None
    access_log: bool = True
    evict_idle: bool = False
    unauthenticated: dict[str, int] = field(default_factory=dict)
    subjects: dict[str, int] = field(default_factory=dict)
    open: int = 0
    idle: dict[str | None, OrderedDict[Connection, None]] = field(default_factory=dict)

    def note(self, event: str) -> None:
        """Tell ``on_event``.

        Args:
            event: what happened (see ``on_event``).
        """
        if self.on_event is not None:
            self.on_event(event)

    def admit(self, peer: str | None) -> tuple[Connection | None, bytes]:
        """A new connection (with ``evict_idle``, an idle one may be closed to make room first).

        Args:
            peer: its client address (None: unknown).

        Returns:
            Its record and ``b""``, or None and the canned answer (429 or 503) that refuses it.
        """
        key = None if self.proxies.trusts(peer) else address_key(peer)
        if self.evict_idle:
            if key is not None and self.unauthenticated.get(key, 0) >= self.per_address:
                self._evict(key)
            if self.open >= self.max_connections and self.idle:
                self._evict(max(self.idle, key=lambda k: len(self.idle[k])))
        if self.open >= self.max_connections:
            self.note("total")
            return None, _TOO_MANY
        if key is not None:
            held = self.unauthenticated.get(key, 0)
            if held >= self.per_address:
                self.note("address")
                return None, _TOO_MANY_FROM_ADDRESS
            self.unauthenticated[key] = held + 1
        self.open += 1
        conn = Connection(key)
        self.went_idle(conn)
        return conn, b""

    def authenticated(self, conn: Connection, subject: str) -> bool:
        """An authenticated request of ``subject`` on ``conn``: it stops counting against its address
        and, on its first, counts for the subject.

        Args:
            conn: the connection's record.
            subject: the subject id.

        Returns:
            False: refuse the request (the subject holds ``per_subject`` connections already).
        """
        if conn.subject is None and conn.key is not None and self.per_subject is not None:
            held = self.subjects.get(subject, 0)
            if held >= self.per_subject:
                self.note("subject")
                return False
            conn.subject = subject
            self.subjects[subject] = held + 1
        if not conn.authenticated:
            conn.authenticated = True
            self._release(conn)
        return True

    def went_idle(self, conn: Connection) -> None:
        """``conn`` is between requests (or has not completed its first request head).

        Args:
            conn: the connection's record.
        """
        if self.evict_idle and not conn.gone:
            self.idle.setdefault(conn.key, OrderedDict())[conn] = None

    def went_busy(self, conn: Connection) -> None:
        """``conn`` carries a request now: it is not closed to make room.

        Args:
            conn: the connection's record.
        """
        if self.evict_idle:
            self._not_idle(conn)

    def closed(self, conn: Connection) -> None:
        """``conn`` closed (a second call does nothing).

        Args:
            conn: the connection's record.
        """
        if conn.gone:
            return
        conn.gone = True
        self._not_idle(conn)
        self.open -= 1
        if not conn.authenticated:
            self._release(conn)
        if conn.subject is not None:
            left = self.subjects[conn.subject] - 1
            if left:
                self.subjects[conn.subject] = left
            else:
                del self.subjects[conn.subject]

    def _not_idle(self, conn: Connection) -> None:
        idle = self.idle.get(conn.key)
        if idle is not None:
            idle.pop(conn, None)
            if not idle:
                del self.idle[conn.key]

    def _evict(self, key: str | None) -> None:
        """Close the longest-idle connection of ``key`` (if it has one) to make room."""
        idle = self.idle.get(key)
        if not idle:
            return
        conn = next(iter(idle))
        self.closed(conn)
        self.note("evicted")
        if conn.close is not None:
            conn.close()

    def _release(self, conn: Connection) -> None:
        if conn.key is None:
            return
        left = self.unauthenticated.get(conn.key, 0) - 1
        if left > 0:
            self.unauthenticated[conn.key] = left
        else:
            self.unauthenticated.pop(conn.key, None)
