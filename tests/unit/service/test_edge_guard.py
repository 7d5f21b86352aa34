"""The connection guard's bookkeeping (codemode.service.edge): what is refused, and on the side
listeners which idle connection makes room for a new one."""

from __future__ import annotations

from typing import Any

from codemode.service.edge import ConnectionGuard
from codemode.service.peers import TrustedProxies


def _side(max_connections: int, per_address: int) -> tuple[ConnectionGuard, list[str]]:
    guard = ConnectionGuard(max_connections, per_address, header_timeout=5, evict_idle=True)
    return guard, []


def _admitted(guard: ConnectionGuard, closed: list[str], peer: str, name: str) -> Any:
    conn, refusal = guard.admit(peer)
    assert conn is not None, refusal
    conn.close = lambda: closed.append(name)
    return conn


def _refused(guard: ConnectionGuard, peer: str) -> bytes:
    conn, refusal = guard.admit(peer)
    assert conn is None
    return refusal


def test_the_main_port_refuses_past_its_bounds() -> None:
    guard, closed = ConnectionGuard(max_connections=3, per_address=2, header_timeout=5), list[str]()
    _admitted(guard, closed, "10.0.0.1", "a0")
    _admitted(guard, closed, "10.0.0.1", "a1")
    assert _refused(guard, "10.0.0.1").startswith(b"HTTP/1.1 429")
    _admitted(guard, closed, "10.0.0.2", "b0")
    assert _refused(guard, "10.0.0.3").startswith(b"HTTP/1.1 503")
    assert closed == []


def test_a_full_side_listener_closes_the_longest_idle_of_the_fullest_address() -> None:
    guard, closed = _side(max_connections=4, per_address=3)
    for i in range(3):
        _admitted(guard, closed, "10.0.0.1", f"a{i}")
    _admitted(guard, closed, "10.0.0.2", "b0")
    _admitted(guard, closed, "10.0.0.9", "probe")  # full: a0 makes room, not b0
    assert closed == ["a0"] and guard.open == 4
    assert guard.unauthenticated == {"10.0.0.1": 2, "10.0.0.2": 1, "10.0.0.9": 1}


def test_an_address_at_its_bound_makes_room_from_its_own_connections() -> None:
    guard, closed = _side(max_connections=10, per_address=2)
    first = _admitted(guard, closed, "10.0.0.1", "a0")
    _admitted(guard, closed, "10.0.0.1", "a1")
    _admitted(guard, closed, "10.0.0.2", "b0")
    _admitted(guard, closed, "10.0.0.1", "a2")
    assert closed == ["a0"] and guard.unauthenticated == {"10.0.0.1": 2, "10.0.0.2": 1}
    guard.closed(first)  # its connection_lost comes later: counted once
    assert guard.open == 3


def test_connections_in_a_request_are_never_closed_to_make_room() -> None:
    guard, closed = _side(max_connections=2, per_address=2)
    busy = [_admitted(guard, closed, "10.0.0.1", f"a{i}") for i in range(2)]
    for conn in busy:
        guard.went_busy(conn)
    assert _refused(guard, "10.0.0.9").startswith(b"HTTP/1.1 503") and closed == []
    guard.went_idle(busy[1])  # answered: between requests now
    _admitted(guard, closed, "10.0.0.9", "probe")
    assert closed == ["a1"]


def test_connections_are_bounded_per_subject_from_their_first_authenticated_request() -> None:
    guard, closed = (
        ConnectionGuard(max_connections=10, per_address=5, header_timeout=5, per_subject=2),
        list[str](),
    )
    first, second, third = (_admitted(guard, closed, "10.0.0.1", f"m{i}") for i in range(3))
    assert guard.authenticated(first, "mallory") and guard.authenticated(second, "mallory")
    assert guard.authenticated(second, "mallory")  # a later request on the same connection
    assert not guard.authenticated(third, "mallory")  # refused: 429, and the connection closes
    assert guard.authenticated(third, "alice")
    assert guard.subjects == {"mallory": 2, "alice": 1} and guard.unauthenticated == {}
    guard.closed(first)
    assert guard.authenticated(_admitted(guard, closed, "10.0.0.1", "m3"), "mallory")
    # A trusted proxy's connection carries many tenants' requests: not counted per subject.
    proxied = ConnectionGuard(10, 5, header_timeout=5, per_subject=1, proxies=TrustedProxies(["10.9.0.0/16"]))
    for i in range(3):
        assert proxied.authenticated(_admitted(proxied, closed, "10.9.0.1", f"p{i}"), "mallory")
    assert proxied.subjects == {}
