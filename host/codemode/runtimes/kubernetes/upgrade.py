"""A time bound on the websocket upgrade of the Kubernetes runtime's attaches.

``kubernetes.stream.stream`` opens its websocket (``kubernetes.stream.ws_client.create_websocket``)
without a timeout, and its ``_request_timeout`` bounds only the reading of a preloaded answer, which
an attach with ``_preload_content=False`` never does. So an API server, or a proxy or load balancer
in front of one, that accepts the TCP connection and then stalls the upgrade would hold the calling
thread until the kernel gives up on the connection.

websocket-client's ``WebSocket.connect`` takes a ``timeout``: the socket timeout of the connect, the
TLS handshake and the upgrade. ``bounded_upgrade(seconds)`` gives it one for the websockets this
thread opens meanwhile and clears it once the upgrade is done, so that reads block as before.
Websockets other threads (or other code) open are untouched: the client's websocket class is
replaced once by a subclass that adds the timeout only inside ``bounded_upgrade`` on its thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["bounded_upgrade", "upgrade_timed_out"]

_local = threading.local()
_install_lock = threading.Lock()


def _install() -> None:
    """Make ``kubernetes.stream.ws_client`` open its websockets with ``_BoundedWebSocket`` (once)."""
    from kubernetes.stream import ws_client as imported

    ws_client: Any = imported  # its WebSocket is websocket-client's, imported by name
    with _install_lock:
        base = ws_client.WebSocket
        if getattr(base, "_codemode_bounded", False):
            return

        class _BoundedWebSocket(base):  # type: ignore[misc,valid-type]
            _codemode_bounded = True

            def connect(self, url: str, **options: Any) -> None:
                seconds = getattr(_local, "seconds", None)
                if seconds is None:
                    super().connect(url, **options)
                    return
                options["timeout"] = seconds
                super().connect(url, **options)
                self.settimeout(None)  # the upgrade is done: reads block, as without a bound

        ws_client.WebSocket = _BoundedWebSocket


@contextlib.contextmanager
def bounded_upgrade(seconds: float) -> Iterator[None]:
    """Bound the connect, TLS handshake and upgrade of every attach websocket this thread opens
    inside the block by ``seconds`` each.

    Args:
        seconds: the bound (positive).

    Yields:
        Nothing; on leaving, this thread's websockets are opened without a bound again.
    """
    _install()
    previous = getattr(_local, "seconds", None)
    _local.seconds = seconds
    try:
        yield
    finally:
        _local.seconds = previous


def upgrade_timed_out(exc: BaseException) -> bool:
    """Whether an attach failed because its websocket did not open in time (``bounded_upgrade``).

    Args:
        exc: what the attach raised (the client wraps the websocket's error in an ``ApiException``
            raised while handling it).

    Returns:
        True when a timeout is among its causes.
    """
    from websocket import WebSocketTimeoutException

    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, TimeoutError | WebSocketTimeoutException):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
