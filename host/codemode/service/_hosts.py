"""``Host`` and ``Origin`` allow-lists in front of ``/mcp`` (docs/service.md, "Authentication").

Protection against DNS rebinding: a page in a victim's browser that makes the browser talk to a
service on the victim's network sends a ``Host`` (and ``Origin``) of the attacker's choosing. Each
list works on its own, and an empty list is off, with one exception:

- ``allowed_hosts`` non-empty: a request whose ``Host`` is not listed gets ``421``; empty while the
  service listens on a loopback address (the default, ``127.0.0.1``): the loopback names
  (:func:`allowed_hosts_for`), since a name the attacker controls can resolve to 127.0.0.1 too;
- ``allowed_origins`` non-empty: a request *with* an ``Origin`` that is not listed gets ``403``
  (requests without one, which is every non-browser client, pass).

An entry matches exactly, or ``name:*`` matches ``name:PORT`` for any decimal port (so not
``name:80.evil.example``, which the SDK's prefix match accepted). The check runs before
authentication: a refused request reaches nothing else. (The MCP SDK's own check applied both
lists whenever either was set, so ``allowed_hosts`` alone refused every request with an ``Origin``
and ``allowed_origins`` alone every request; it is not used.)
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from .responses import plain_json

__all__ = ["LOOPBACK_HOSTS", "HostOriginCheck", "allowed_hosts_for"]

log = logging.getLogger("codemode.service")


#: The ``Host`` values a service listening on loopback accepts when ``allowed_hosts`` is empty.
LOOPBACK_HOSTS: tuple[str, ...] = ("localhost", "localhost:*", "127.0.0.1", "127.0.0.1:*", "[::1]", "[::1]:*")


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts_for(allowed_hosts: Sequence[str], listen_host: str) -> list[str]:
    """The ``Host`` allow-list in force: ``allowed_hosts`` when set; else, for a loopback listen
    address, :data:`LOOPBACK_HOSTS` and that address (``127.0.0.2``, with and without a port); else
    none (the check is off).

    Args:
        allowed_hosts: the configured list (``allowed_hosts``).
        listen_host: the address the service listens on (``host``).

    Returns:
        The entries a ``Host`` must match; empty for no check.
    """
    if allowed_hosts:
        return list(allowed_hosts)
    if not _loopback(listen_host):
        return []
    own = listen_host.lower()
    if ":" in own and not own.startswith("["):
        own = f"[{own}]"
    extra = [] if own in LOOPBACK_HOSTS else [own, f"{own}:*"]
    return [*LOOPBACK_HOSTS, *extra]


def _matches(value: str, entry: str) -> bool:
    if entry.endswith(":*"):
        base, _, port = value.rpartition(":")
        return base == entry[:-2] and port.isdigit() and port.isascii()
    return value == entry


def _listed(value: str, allowed: Sequence[str]) -> bool:
    return any(_matches(value, entry) for entry in allowed)


class HostOriginCheck:
    """Pure ASGI.

    Args:
        app: the wrapped app.
        allowed_hosts: the ``Host`` values accepted.
        allowed_origins: the ``Origin`` values accepted.
    """

    def __init__(self, app: ASGIApp, *, allowed_hosts: Sequence[str], allowed_origins: Sequence[str]) -> None:
        self.app = app
        self.hosts = list(allowed_hosts)
        self.origins = list(allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (self.hosts or self.origins):
            headers = {k: v for k, v in scope.get("headers", ()) if k in (b"host", b"origin")}
            host = headers.get(b"host", b"").decode("latin-1")
            origin = headers.get(b"origin", b"").decode("latin-1")
            if self.hosts and not _listed(host, self.hosts):
                log.warning(
                    "refused a request for host %r: not in the Host allow-list (--allowed-host / "
                    "CODEMODE_ALLOWED_HOSTS; on loopback its default is the loopback names)",
                    host[:100],
                )
                await plain_json(send, 421, {"error": "invalid host header"}, [])
                return
            if self.origins and origin and not _listed(origin, self.origins):
                log.warning("refused a request from origin %r (allowed_origins)", origin[:100])
                await plain_json(send, 403, {"error": "invalid origin header"}, [])
                return
        await self.app(scope, receive, send)
