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
- **Per-subject bound.** A connection counts for the subject of its first authenticated request
  until it closes; at most ``per_subject`` (less than ``max_connections``) connections count for one
  subject. A request that would make one more is answered ``429`` and its connection closed
  (:func:`connection_authenticated` says so), so one tenant cannot hold the whole table with
  keep-alive connections. Connections from a trusted proxy carry many tenants' requests and are
  not counted per subject.
- **Write timeout.** An answer may wait unsent, because the client does not read it (its TCP
  window stays full), for at most ``write_timeout`` seconds; then the connection is closed at once
  (its unsent data discarded). The timer starts when the first byte of an answer cannot be handed
  to the kernel and is not reset by partial progress, only by the backlog being handed over
  entirely, so reading one byte a second does not keep a connection either. Without it, a client
  that pipelined requests and never read the answers held its connection for ever, token or not.

A refused connection costs an accept, one short write and a close.

The side listeners (health and metrics ports) **make room instead of refusing** (``evict_idle``):
a probe there must be answered whatever other clients hold. A connection is *idle* while it is not
in the middle of a request its client waits for: before its request head is complete, between
requests, while its client does not read the answer, or while more requests are pipelined behind
the current one (no probe or scrape pipelines). When one
address is at ``per_address``, a new connection of that address closes the address's longest-idle
connection; when all ``max_connections`` are open, a new connection closes the longest-idle
connection of the address holding the most idle ones. So idle or half-sent sockets, from however
few addresses, never make a probe fail; only connections being answered count against it. A new
connection is refused only when every connection of its address (or every connection) is in a
request.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import fcntl
import struct
import termios
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_remote_addr

from .. import authz
from .connection_guard import Connection, ConnectionGuard

__all__ = [
    "UNDELIVERED_LIMIT",
    "ConnectionGuard",
    "connection_authenticated",
    "guarded_protocol",
    "undelivered",
]

_CONNECTION: contextvars.ContextVar[tuple[ConnectionGuard, Connection] | None] = contextvars.ContextVar(
    "codemode_connection", default=None
)


def connection_authenticated(subject: authz.Subject) -> bool:
    """The request being served authenticated as ``subject``: its connection stops counting as
    unauthenticated and counts for the subject.

    Args:
        subject: the authenticated subject.

    Returns:
        False: the subject holds all the connections it may, refuse the request and close the
        connection (True outside a guarded connection).
    """
    current = _CONNECTION.get()
    return current is None or current[0].authenticated(current[1], subject.id)


#: Bytes of earlier answers a client may leave undelivered before its next pipelined request is
#: started (more wait, under the write timeout).
UNDELIVERED_LIMIT = 64 * 1024
_DELIVERY_POLL = 0.05


def undelivered(transport: asyncio.Transport) -> int:
    """Bytes of answers the client has not taken: the transport's buffer and, on Linux, the
    kernel's send queue of the socket (``SIOCOUTQ``: not yet sent or not yet acknowledged).

    Args:
        transport: the connection's transport.

    Returns:
        The bytes.
    """
    size = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    request = getattr(termios, "TIOCOUTQ", None)  # SIOCOUTQ's number on Linux
    if sock is None or request is None:
        return size
    try:
        queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), request, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return size
    return size + int(queued)


class _GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol with the guard's bounds (the subclass made by :func:`guarded_protocol`
    sets ``guard``)."""

    guard: ConnectionGuard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._edge: Connection | None = None
        self._header_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._next_request: asyncio.TimerHandle | None = None  # a pipelined request, held back
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
        edge.close = transport.abort  # made room for another: nothing of it is worth waiting for
        super().connection_made(transport)
        # pause_writing as soon as one byte of an answer waits unsent (the write timeout's start);
        # the kernel's socket buffer still holds what is in flight.
        transport.set_write_buffer_limits(high=0)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._write_done()
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

    # ------------------------------------------------------------------ write timeout
    def pause_writing(self) -> None:
        super().pause_writing()
        self._waiting_for_reader()

    def resume_writing(self) -> None:
        if self._next_request is None:
            self._write_done()
        super().resume_writing()
        self._settle()

    def _settle(self) -> None:
        """Tell the guard whether the connection is busy: in a request that its client waits for.
        One whose client does not read, or that has more requests pipelined behind the current one
        (no probe or scrape does that), is as idle as one waiting for its client to write."""
        if self._edge is None:
            return
        if (
            self._in_request()
            and not self.flow.write_paused
            and self._next_request is None
            and not self.conn.trailing_data[0]
        ):
            self.guard.went_busy(self._edge)
        else:
            self.guard.went_idle(self._edge)

    def _waiting_for_reader(self) -> None:
        if self._edge is None:
            return
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.guard.write_timeout, self._write_timed_out)
        # Waiting for its client to read: as idle as one waiting for its client to write.
        self.guard.went_idle(self._edge)

    def _write_done(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        if self._next_request is not None:
            self._next_request.cancel()
            self._next_request = None

    def _write_timed_out(self) -> None:
        self._write_timer = None
        self.guard.note("write_timeout")
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._edge is None:
            return  # refused: closing
        if not self._in_request():
            self._arm()  # a new request head starts (or a body nobody reads any more)
        super().data_received(data)
        if self._in_request():
            self._disarm()
        self._settle()

    def on_response_complete(self) -> None:
        self._next_request = None
        if (
            self._edge is not None
            and self.conn.trailing_data[0]
            and not self.transport.is_closing()
            and undelivered(self.transport) > UNDELIVERED_LIMIT
        ):
            # A pipelined request waits while the client has not taken the answers before it.
            self._waiting_for_reader()
            self._next_request = self.loop.call_later(_DELIVERY_POLL, self.on_response_complete)
            return
        if not self.flow.write_paused:
            self._write_done()
        super().on_response_complete()
        if self._in_request():
            self._disarm()  # a pipelined request was already waiting
        self._settle()


def guarded_protocol(guard: ConnectionGuard) -> type[H11Protocol]:
    """A uvicorn ``http`` protocol class bound to ``guard`` (one per listener).

    Args:
        guard: the listener's bounds.

    Returns:
        The protocol class (an h11 protocol subclass).
    """
    return type("GuardedH11Protocol", (_GuardedProtocol,), {"guard": guard})
