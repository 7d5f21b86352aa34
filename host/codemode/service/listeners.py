"""The service's second and third listeners: small uvicorn servers inside the main server's event
loop (the metrics port, the health port), each with its own :class:`~codemode.service.edge.ConnectionGuard`
so that nothing on the tenant-facing port can fill their connection tables."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import uvicorn

from ..startup.config import ConfigError, names
from .edge import ConnectionGuard, guarded_protocol
from .logconfig import side_listener

if TYPE_CHECKING:
    from ..startup.config import Settings

__all__ = [
    "SIDE_CONNECTIONS",
    "Listeners",
    "SideServer",
    "bind_listener",
    "bind_listeners",
    "start_side_server",
]

log = logging.getLogger("codemode.service")

#: Connections one side listener accepts (probes and scrapes need a handful).
SIDE_CONNECTIONS = 64


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server running inside another's event loop: it leaves signal handling alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class SideServer:
    """A running side listener; :meth:`stop` ends it.

    Args:
        server: the uvicorn server.
        task: the task serving.
        sock: the bound socket (its address is ``address``).
    """

    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None], sock: socket.socket) -> None:
        self._server = server
        self._task = task
        self._socket = sock
        addr = sock.getsockname()
        self.address: tuple[str, int] = (str(addr[0]), int(addr[1]))

    async def stop(self) -> None:
        """Stop serving (the task is cancelled after 5 s) and close the socket."""
        self._server.should_exit = True
        try:
            async with asyncio.timeout(5):
                await self._task
        except (TimeoutError, Exception):
            self._task.cancel()
        finally:
            self._socket.close()


async def _serve_side(server: uvicorn.Server, sock: socket.socket) -> None:
    side_listener()  # in this task's own context: its lifecycle lines are the MCP listener's
    await server.serve(sockets=[sock])


def bind_listener(host: str, port: int, field: str) -> socket.socket:
    """Bind ``host:port`` (not yet listening), or say in one line which setting names the port.

    Args:
        host: the address to bind.
        port: the port (0: any free one).
        field: the setting that names the listener, for errors.

    Returns:
        The bound socket.

    Raises:
        ConfigError: the address cannot be bound (in use, not local, not permitted).
    """
    # Bind here: uvicorn's own bind failure would sys.exit() out of the event loop.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"{names(field)}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


@dataclasses.dataclass
class Listeners:
    """The service's three sockets, bound before anything starts.

    Args:
        main: the MCP port (``port``).
        metrics: the metrics port.
        health: the health port.
    """

    main: socket.socket
    metrics: socket.socket
    health: socket.socket

    def close(self) -> None:
        """Close the three sockets (idempotent)."""
        for sock in (self.main, self.metrics, self.health):
            sock.close()


def bind_listeners(settings: Settings) -> Listeners:
    """Bind the MCP port, then the metrics and health ports, before anything starts, so that a port
    in use ends the start in one line naming its setting, with nothing logged before it.

    Args:
        settings: the service settings.

    Returns:
        The bound sockets.

    Raises:
        ConfigError: one of them cannot be bound (the ones bound already are closed).
    """
    bound: list[socket.socket] = []
    try:
        for host, port, field in (
            (settings.host, settings.port, "port"),
            (settings.metrics_host_address, settings.metrics_port, "metrics_port"),
            (settings.health_host_address, settings.health_port, "health_port"),
        ):
            bound.append(bind_listener(host, port, field))
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return Listeners(*bound)


async def start_side_server(
    app: Any,
    *,
    host: str,
    port: int,
    field: str,
    guard: ConnectionGuard,
    what: str,
    sock: socket.socket | None = None,
) -> SideServer:
    """Listen on ``host:port`` and serve ``app`` there (no lifespan, no access log).

    Args:
        app: the ASGI app.
        host: the address to bind.
        port: the port (0: any free one).
        field: the setting that names the listener, for errors.
        guard: the listener's connection bounds.
        what: the listener's name, for logs.
        sock: the socket, bound already (:func:`bind_listeners`); default: bound here.

    Returns:
        The running listener.

    Raises:
        RuntimeError: the server stopped during start-up (``ConfigError`` when it cannot bind).
    """
    if sock is None:
        sock = bind_listener(host, port, field)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        # Logging is the main server's (codemode.service.logconfig): never reconfigured here, and
        # no access lines for probes and scrapes (the guard's protocol turns them off).
        log_config=None,
        log_level=None,
        ws="none",
        server_header=False,
        http=guarded_protocol(guard),
        # The guard bounds the connections. uvicorn's own count would answer 503 to a probe
        # while the connections closed to make room for it still wait for their connection_lost.
        limit_concurrency=None,
        proxy_headers=False,
    )
    server = _EmbeddedServer(config)
    task = asyncio.get_running_loop().create_task(_serve_side(server, sock))
    try:
        async with asyncio.timeout(10):
            while not server.started:
                if task.done():
                    raise RuntimeError(f"the {what} server stopped during start-up")
                await asyncio.sleep(0.01)
    except BaseException:
        server.should_exit = True
        task.cancel()
        sock.close()
        raise
    side = SideServer(server, task, sock)
    log.info("%s at http://%s:%d", what, side.address[0], side.address[1])
    return side
