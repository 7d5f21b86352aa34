"""Who a client is (docs/service.md, "Behind a proxy or an ingress").

The *client address* of a request is the TCP peer's address, except when the peer is one of the
configured ``trusted_proxies``: then it is the address that proxy forwarded, read from the one header
the proxy is configured to write (``trusted_proxy_header``: ``X-Forwarded-For``, or ``Forwarded``
of RFC 7239). A forwarded list is read from the right: proxies append, so the right-most address that
is not itself a trusted proxy is the client. Entries a client could have written further left are
never believed, and the other header is never read (a proxy passes a header it does not write
through unchanged, so the client would choose it). A forwarded entry that is not an IP address
(``unknown``, an obfuscated ``_name``, garbage) stops the walk at the proxy that wrote it: the
client address is then that proxy's.

:func:`address_key` is what the per-address bounds count: the address itself for IPv4, the ``/64``
network for IPv6 (one host usually holds a whole ``/64``), IPv4-mapped IPv6 as IPv4.

:class:`ClientAddress` is pure ASGI: it rewrites ``scope["client"]`` to the client address and makes
it available to the log filter (:func:`current_client`) for the request.
"""

from __future__ import annotations

import contextvars
import ipaddress
from collections.abc import Iterable, Sequence
from typing import Literal

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["Address", "ClientAddress", "Header", "TrustedProxies", "address_key", "current_client"]

#: An IP address (an IPv4-mapped IPv6 address is read as its IPv4 address).
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
#: The header trusted proxies write the client chain in.
Header = Literal["x-forwarded-for", "forwarded"]

_CLIENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("codemode_client", default=None)


def current_client() -> str | None:
    """The client address of the request being served.

    Returns:
        It, or None outside a request.
    """
    return _CLIENT.get()


def _ip(text: str) -> Address | None:
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def address_key(host: str | None) -> str:
    """The key one client address is counted under (IPv6: its ``/64``).

    Args:
        host: the address (None or empty: unknown).

    Returns:
        The IPv4 address, the IPv6 ``/64`` network, the text as given when it is not an address,
        or ``""`` for an unknown one.
    """
    if not host:
        return ""
    address = _ip(host)
    if address is None:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def _node(text: str) -> str:
    """An address of a forwarded list without quotes, brackets or port."""
    node = text.strip().strip('"')
    if node.startswith("["):
        return node[1:].partition("]")[0]
    if node.count(":") == 1:
        return node.partition(":")[0]
    return node


def _forwarded_for(values: Iterable[str]) -> list[str]:
    """The ``for=`` nodes of RFC 7239 ``Forwarded`` values, left to right (an element without
    ``for=`` gives ``""``)."""
    out: list[str] = []
    for value in values:
        for element in value.split(","):
            node = ""
            for pair in element.split(";"):
                name, _, raw = pair.strip().partition("=")
                if name.strip().lower() == "for":
                    node = _node(raw)
            out.append(node)
    return out


def _x_forwarded_for(values: Iterable[str]) -> list[str]:
    return [_node(item) for value in values for item in value.split(",")]


class TrustedProxies:
    """The ``trusted_proxies`` networks and the header they write.

    Args:
        entries: networks or addresses (``10.0.0.0/8``, ``::1``).
        header: ``x-forwarded-for`` or ``forwarded``.
    """

    def __init__(self, entries: Sequence[str] = (), header: Header = "x-forwarded-for") -> None:
        self.networks = [ipaddress.ip_network(e.strip(), strict=False) for e in entries]
        self.header = header
        self._name = header.encode("ascii")

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, host: str | None) -> bool:
        """Whether ``host`` is a trusted proxy.

        Args:
            host: an address.

        Returns:
            True when it is in one of the networks.
        """
        if not self.networks or not host:
            return False
        address = _ip(host)
        return address is not None and any(address in net for net in self.networks)

    def client(self, peer: str | None, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """The client address of a request from ``peer`` with these headers: the chain is read from
        the right, past trusted proxies, to the first address that is not one (a malformed entry
        stops it at the last good address).

        Args:
            peer: the connection's address.
            headers: the request's headers.

        Returns:
            The client address (``peer`` itself when it is not a trusted proxy).
        """
        if not self.trusts(peer):
            return peer
        values = [v.decode("latin-1") for k, v in headers if k == self._name]
        chain = _forwarded_for(values) if self.header == "forwarded" else _x_forwarded_for(values)
        client = peer
        for node in reversed(chain):
            address = _ip(node)
            if address is None:
                return client
            client = str(address)
            if not self.trusts(client):
                return client
        return client


class ClientAddress:
    """Pure ASGI: ``scope["client"]`` becomes the client address (and :func:`current_client`).

    Args:
        app: the wrapped app.
        proxies: the trusted proxies.
    """

    def __init__(self, app: ASGIApp, proxies: TrustedProxies) -> None:
        self.app = app
        self.proxies = proxies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        peer = scope.get("client")
        host = peer[0] if peer else None
        client = self.proxies.client(host, scope.get("headers", ()))
        if client != host and client is not None:
            scope["client"] = (client, 0)
        token = _CLIENT.set(client)
        try:
            await self.app(scope, receive, send)
        finally:
            _CLIENT.reset(token)
