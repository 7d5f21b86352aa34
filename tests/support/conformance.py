"""What the MCP conformance suite lacks to test this server (no tests here).

The suite (``@modelcontextprotocol/conformance``) takes only a URL and sends no headers, so:

- :class:`BearerProxy` sits in front of ``codemode serve --http`` and adds the bearer token to every
  request, byte for byte otherwise (one request per connection: the proxy answers ``Connection:
  close``, so each request's head is rewritten and the rest is copied as it comes, event streams
  included);
- :class:`StdioBridge` speaks the JSON-response form of streamable HTTP to the suite and the
  newline-delimited stdio transport to a ``codemode serve --stdio`` child: each posted JSON-RPC
  request becomes one line on the child's stdin and the line answering its id is the HTTP response;
  a notification is ``202``. An ``initialize`` starts a fresh child, as a new stdio session would be.
  The bridge carries messages only; every answer is the stdio server's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

HEAD_LIMIT = 64 * 1024


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _read_head(reader: asyncio.StreamReader) -> list[bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    return head[:-4].split(b"\r\n")


class BearerProxy:
    """Loopback HTTP proxy adding ``Authorization: Bearer <token>`` to each request."""

    def __init__(self, token: str, upstream_port: int) -> None:
        self.token = token
        self.upstream_port = upstream_port
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            lines = await _read_head(reader)
            if not lines:
                return
            keep = [h for h in lines[1:] if not h.lower().startswith((b"authorization:", b"connection:"))]
            head = [lines[0], *keep, b"Authorization: Bearer " + self.token.encode(), b"Connection: close"]
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            try:
                up_writer.write(b"\r\n".join(head) + b"\r\n\r\n")
                await up_writer.drain()
                await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
            finally:
                up_writer.close()
        except OSError:
            pass
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def serving(self, port: int = 0) -> AsyncIterator[BearerProxy]:
        server = await asyncio.start_server(self._handle, "127.0.0.1", port, limit=HEAD_LIMIT)
        self.port = server.sockets[0].getsockname()[1]
        async with server:
            yield self


class StdioBridge:
    """Streamable HTTP (JSON responses) in front of a ``codemode serve --stdio`` child."""

    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        self.argv = list(argv)
        self.env = env
        self.port = 0
        self._child: asyncio.subprocess.Process | None = None
        self._waiting: dict[Any, asyncio.Future[bytes]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.children = 0

    async def _start_child(self) -> None:
        await self._stop_child()
        self._child = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=self.env,
            limit=16 * 1024 * 1024,
        )
        self.children += 1
        self._reader = asyncio.create_task(self._read_child(self._child))

    async def _stop_child(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if child.stdin is not None:
            child.stdin.close()
        try:
            async with asyncio.timeout(10):
                await child.wait()
        except TimeoutError:
            child.kill()
            await child.wait()
        if self._reader is not None:
            await self._reader
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("the stdio server ended"))
        self._waiting.clear()

    async def _read_child(self, child: asyncio.subprocess.Process) -> None:
        assert child.stdout is not None
        while line := await child.stdout.readline():
            message = json.loads(line)
            if "method" in message:
                continue  # the server's own requests and notifications: nothing to relay in JSON mode
            future = self._waiting.pop(message.get("id"), None)
            if future is not None and not future.done():
                future.set_result(line.rstrip(b"\n"))

    async def _send(self, message: dict[str, Any]) -> bytes | None:
        async with self._lock:
            if message.get("method") == "initialize" or self._child is None:
                await self._start_child()
            assert self._child is not None and self._child.stdin is not None
            future: asyncio.Future[bytes] | None = None
            if "id" in message:
                future = asyncio.get_running_loop().create_future()
                self._waiting[message["id"]] = future
            self._child.stdin.write(json.dumps(message).encode() + b"\n")
            await self._child.stdin.drain()
        if future is None:
            return None
        async with asyncio.timeout(60):
            return await future

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            lines = await _read_head(reader)
            if not lines:
                return
            method = lines[0].split(b" ", 1)[0]
            headers = dict(h.split(b":", 1) for h in lines[1:] if b":" in h)
            length = int(
                next((v for k, v in headers.items() if k.strip().lower() == b"content-length"), b"0")
            )
            body = await reader.readexactly(length) if length else b""
            if method != b"POST":
                writer.write(
                    b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                return
            answer = await self._send(json.loads(body))
            if answer is None:
                writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            else:
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(answer)}\r\nConnection: close\r\n\r\n".encode()
                    + answer
                )
            await writer.drain()
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[StdioBridge]:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0, limit=HEAD_LIMIT)
        self.port = server.sockets[0].getsockname()[1]
        try:
            async with server:
                yield self
        finally:
            await self._stop_child()
