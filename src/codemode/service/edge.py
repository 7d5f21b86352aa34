"""The connection edge of every listener (docs/service.md, "Before authentication").

uvicorn keeps a connection that has not sent a request open forever and counts it against
``limit_concurrency``, so idle sockets without a token used to take every slot (and ``/healthz``
with them). :func:`guarded_protocol` makes a uvicorn HTTP protocol class (a subclass of uvicorn's
h11 protocol) whose connections are bounded before any request is read:

- **Header timeout.** A connection must deliver a complete request head within ``header_timeout``
  seconds of being accepted, and of the first byte of each later request on it; the timer is not
  reset by partial data, so a trickle of one byte a second does not keep it alive. Otherwise it is
  closed. (Between requests the 5 s keep-alive timeout applies, as before.)
- **Per-address bound.** At most ``per_address`` connections of one client address (its
  :func:`~codemode.service.peers.address_key`: IPv4 address, IPv6 ``/64``) may be open without
  having carried an authenticated request; one more is answered ``429`` and closed at once. A
  connection stops counting when bearer authentication succeeds on it
  (:func:`connection_authenticated`). Connections from a trusted proxy are not bounded per address
  here: the proxy's address is every tenant's.
- **Total bound.** At most ``max_connections`` connections are open; one more is answered ``503``
  and closed at once (instead of being held and answered 503 only when it sends a request).

A refused connection costs an accept, one short write and a close.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_remote_addr

from .peers import TrustedProxies, address_key

__all__ = ["ConnectionGuard", "connection_authenticated", "guarded_protocol"]


@dataclass(eq=False)
class _Connection:
    key: str | None  # None: not bounded per address (a trusted proxy)
    authenticated: bool = False


_CONNECTION: contextvars.ContextVar[tuple[ConnectionGuard, _Connection] | None] = contextvars.ContextVar(
    "codemode_connection", default=None
)


def connection_authenticated() -> None:
    """The request being served authenticated: its connection stops counting as unauthenticated."""
    current = _CONNECTION.get()
    if current is not None:
        current[0].authenticated(current[1])


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
        proxies: the trusted proxies (their connections are not bounded per address).
        on_event: called with ``address``, ``total`` or ``header_timeout`` for each connection
            refused or closed.
        access_log: whether uvicorn writes its access log for the listener.
        unauthenticated: unauthenticated connections open, per address key.
        open: connections open.
    """

    max_connections: int
    per_address: int
    header_timeout: float
    proxies: TrustedProxies = field(default_factory=TrustedProxies)
    on_event: Callable[[str], None] | None = None
    access_log: bool = True
    unauthenticated: dict[str, int] = field(default_factory=dict)
    open: int = 0

    def note(self, event: str) -> None:
        """Tell ``on_event``.

        Args:
            event: ``address``, ``total`` or ``header_timeout``.
        """
        if self.on_event is not None:
            self.on_event(event)

    def admit(self, peer: str | None) -> tuple[_Connection | None, bytes]:
        """A new connection.

        Args:
            peer: its client address (None: unknown).

        Returns:
            Its record and ``b""``, or None and the canned answer (429 or 503) that refuses it.
        """
        if self.open >= self.max_connections:
            self.note("total")
            return None, _TOO_MANY
        key = None if self.proxies.trusts(peer) else address_key(peer)
        if key is not None:
            held = self.unauthenticated.get(key, 0)
            if held >= self.per_address:
                self.note("address")
                return None, _TOO_MANY_FROM_ADDRESS
            self.unauthenticated[key] = held + 1
        self.open += 1
        return _Connection(key), b""

    def authenticated(self, conn: _Connection) -> None:
        """A request on ``conn`` authenticated: it stops counting against its address.

        Args:
            conn: the connection's record.
        """
        if not conn.authenticated:
            conn.authenticated = True
            self._release(conn)

    def closed(self, conn: _Connection) -> None:
        """``conn`` closed.

        Args:
            conn: the connection's record.
        """
        self.open -= 1
        if not conn.authenticated:
            self._release(conn)

    def _release(self, conn: _Connection) -> None:
        if conn.key is None:
            return
        left = self.unauthenticated.get(conn.key, 0) - 1
        if left > 0:
            self.unauthenticated[conn.key] = left
        else:
            self.unauthenticated.pop(conn.key, None)


class _GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol with the guard's bounds (the subclass made by :func:`guarded_protocol`
    sets ``guard``)."""

    guard: ConnectionGuard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._edge: _Connection | None = None
        self._header_timer: asyncio.TimerHandle | None = None
        inner = self.app
        guard = self.guard
        if not guard.access_log:
            self.access_log = False

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if self._edge is not None:
                _CONNECTION.set((guard, self._edge))
            await inner(scope, receive, send)

        self.app = app

    # ------------------------------------------------------------------ accept
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = get_remote_addr(transport)
        edge, refusal = self.guard.admit(peer[0] if peer else None)
        if edge is None:
            # Never enters uvicorn's connection table (nor its limit_concurrency count).
            self.transport = transport
            transport.write(refusal)
            transport.close()
            return
        self._edge = edge
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._edge is not None:
            self.guard.closed(self._edge)
            self._edge = None
        super().connection_lost(exc)

    # ------------------------------------------------------------------ header timeout
    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.guard.header_timeout, self._header_timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self._in_request() or self.transport.is_closing():
            return
        self.guard.note("header_timeout")
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._edge is None:
            return  # refused: closing
        if not self._in_request():
            self._arm()  # a new request head starts (or a body nobody reads any more)
        super().data_received(data)
        if self._in_request():
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._in_request():
            self._disarm()  # a pipelined request was already waiting


def guarded_protocol(guard: ConnectionGuard) -> type[H11Protocol]:
    """A uvicorn ``http`` protocol class bound to ``guard`` (one per listener).

    Args:
        guard: the listener's bounds.

    Returns:
        The protocol class (an h11 protocol subclass).
    """
    return type("GuardedH11Protocol", (_GuardedProtocol,), {"guard": guard})
