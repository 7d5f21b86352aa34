"""One connection to an upstream MCP server: what to start (:class:`Launch`) and the live session
(:class:`UpstreamSession`), both on the pack's own event loop (``loop``).

A stdio server runs behind ``stdio_relay`` (bounded messages, valid UTF-8, resource limits on the
server process, its stderr cut and rate-limited). What the relay passes of the server's stderr the
session logs line by line as its subject (``codemode.authz.with_subject``), so the service's log
limiter keys each line by the subject whose server wrote it. The session watches its transport: when
the server ends the connection (it exited, or closed its output), or the pool finds it stuck
(``pool``), the host logs why and marks the session dead, so the next call starts the server again
instead of failing. Every death is reported once (``on_death``) with the subjects it is charged to:
the subject of the oldest call still unanswered then, else of the last call, else the session's own
subject; the pool bounds the restarts each subject may cause.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import itertools
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from codemode import authz
from codemode.packs import UpstreamBuildError

from . import stdio_relay

__all__ = [
    "MAX_LIST_PAGES",
    "DeathHook",
    "Launch",
    "UpstreamCallFailed",
    "UpstreamSession",
    "UpstreamUnavailable",
    "brief",
    "check_command",
    "transport_failure",
]

log = logging.getLogger("codemode.capabilities.mcp_upstream")

#: Pages of ``tools/list`` followed before the listing is refused.
MAX_LIST_PAGES = 100
#: The relay runs as a file in isolated mode: it imports only the standard library, so it needs no
#: PYTHONPATH (the MCP client gives it only a minimal environment plus the configured one).
_RELAY = ("-I", stdio_relay.__file__)


#: Bytes of one line read from a relay's stderr (the relay passes at most about 1 KiB of a line).
_STDERR_LINE_LIMIT = 8 * 1024
#: Seconds a closed session's stderr reader gets to log the relay's last lines.
_STDERR_GRACE = 5.0
#: Seconds a closing connection gets to end (the MCP client's stdio shutdown: close stdin, wait 2 s,
#: SIGTERM to the process group, SIGKILL 2 s later).
_CLOSE_TIMEOUT = 10.0


class UpstreamUnavailable(Exception):
    """The session will not be started now (restart bound); already logged."""


class UpstreamCallFailed(Exception):
    """A call failed for a reason the client must not see (already logged)."""


def transport_failure(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is gone (so the session must be started again).

    Args:
        exc: what a call raised.

    Returns:
        True for an MCP "connection closed" error or any error other than a timeout, a build error
        or the restart bound.
    """
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    if isinstance(exc, MCPError):
        return bool(exc.code == CONNECTION_CLOSED)
    return not isinstance(exc, TimeoutError | UpstreamBuildError | UpstreamUnavailable)


@dataclass(frozen=True)
class Launch:
    """Everything needed to open one session, resolved by the host (secrets included: never shown).

    Attributes:
        upstream: the upstream's name.
        owner: ``host`` or the subject key: for logs.
        max_message_bytes: the largest message read from the upstream.
        connect_timeout: seconds to connect and initialize.
        command: stdio: the program (None for HTTP).
        args: stdio: its arguments.
        env: stdio: its extra environment.
        cwd: stdio: its working directory (with ``view``: a path of the view; default its root).
        memory_bytes: stdio: RLIMIT_DATA of the server process (0: none).
        file_bytes: stdio: RLIMIT_FSIZE (0: none).
        cpu_seconds: stdio: RLIMIT_CPU (0: none).
        tree_memory_bytes: stdio: resident memory of the server's process tree (0: no bound).
        view: stdio: the host directory the server sees at ``stdio_relay.VIEW_DIR`` in a mount view
            of its own (None: no view; it sees the host's filesystem as it is).
        url: HTTP: the MCP endpoint.
        headers: HTTP: the headers sent, secrets resolved.
        secrets: the credential values this session sends (redacted from the upstream's text).
    """

    upstream: str
    owner: str
    max_message_bytes: int
    connect_timeout: float
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = field(default=None, repr=False)
    cwd: str | None = None
    memory_bytes: int = 0
    file_bytes: int = 0
    cpu_seconds: int = 0
    tree_memory_bytes: int = 0
    view: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: The configured credential values this session sends (redacted from the upstream's text).
    secrets: tuple[str, ...] = field(default=(), repr=False)

    @property
    def host_cwd(self) -> str | None:
        """The server's working directory as a host path (None: the host's own)."""
        if self.view is None:
            return self.cwd
        inside = os.path.normpath(os.path.join(stdio_relay.VIEW_DIR, self.cwd or ""))
        if inside == stdio_relay.VIEW_DIR or inside.startswith(stdio_relay.VIEW_DIR + "/"):
            return self.view + inside.removeprefix(stdio_relay.VIEW_DIR)
        return inside

    def relay_argv(self) -> list[str]:
        """The relay's arguments (``python`` + these).

        Returns:
            The relay file, the message limit, its flags, ``--`` and the server's argv.
        """
        assert self.command is not None
        # Python's locale coercion may add or change LC_CTYPE in the relay's own environment.
        lc_ctype = (self.env or {}).get("LC_CTYPE")
        flags = ["--unset-lc-ctype"] if lc_ctype is None else [f"--lc-ctype={lc_ctype}"]
        if self.memory_bytes:
            flags.append(f"--rlimit-data={self.memory_bytes}")
        if self.file_bytes:
            flags.append(f"--rlimit-fsize={self.file_bytes}")
        if self.cpu_seconds:
            flags.append(f"--rlimit-cpu={self.cpu_seconds}")
        if self.tree_memory_bytes:
            flags.append(f"--tree-memory={self.tree_memory_bytes}")
        if self.view is not None:
            flags.append(f"--view={self.view}")
            if self.cwd is not None:
                flags.append(f"--cwd={self.cwd}")
        return [*_RELAY, str(self.max_message_bytes), *flags, "--", self.command, *self.args]


#: ``on_death(subjects, why)``: the subjects a death of the session is charged to (None: nobody's).
DeathHook = Callable[[list[str | None], str], None]


class UpstreamSession:
    """One live connection, owned by a task on the loop that uses it; opened on first use.

    ``busy`` counts calls in flight, ``last_used`` and ``started`` (monotonic seconds) let a pool
    evict it; ``connects`` counts starts that got through ``initialize``, ``attempts`` every
    start; ``generation`` names the connection now up (it grows with every connect). ``subject``
    is the subject it serves (None: the host's own, or a shared one).

    Args:
        launch: what to start.
        subject: the subject it serves (None: the host's own, or a shared one).
        on_death: called once per death of a connection with the subjects it is charged to.
    """

    def __init__(self, launch: Launch, subject: str | None = None, on_death: DeathHook | None = None) -> None:
        self.launch = launch
        self.subject = subject
        self.on_death = on_death
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._owner: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
        self._ids = itertools.count()
        self._pending: dict[int, tuple[float, str]] = {}  # calls not answered yet: (sent, subject)
        self._reported = 0  # the last generation whose death was reported
        self.generation = 0
        self.last_caller: str | None = None
        self.connects = 0
        self.attempts = 0
        self.starter: asyncio.Task[Any] | None = None  # the task that tried the last start
        self.busy = 0
        self.last_used = time.monotonic()
        self.started: float | None = None

    @property
    def label(self) -> str:
        """``upstream '<name>' (<owner>)``, for logs."""
        return f"upstream {self.launch.upstream!r} ({self.launch.owner})"

    def sent(self, subject: str) -> int:
        """A call of ``subject`` is being sent.

        Args:
            subject: the caller.

        Returns:
            The call's token for :meth:`settled` and :meth:`sent_at`.
        """
        token = next(self._ids)
        self._pending[token] = (time.monotonic(), subject)
        self.last_caller = subject
        return token

    def sent_at(self, token: int) -> float:
        """When a call was sent.

        Args:
            token: the call's token from :meth:`sent`.

        Returns:
            Its monotonic send time (now, when it is settled already).
        """
        pending = self._pending.get(token)
        return pending[0] if pending is not None else time.monotonic()

    def settled(self, token: int) -> None:
        """The call is answered, or no longer watched.

        Args:
            token: the call's token from :meth:`sent`.
        """
        self._pending.pop(token, None)

    def blamed(self) -> list[str | None]:
        """Whom a death now is charged to (see the module text).

        Returns:
            The subject of the oldest unanswered call, else of the last call, else the session's.
        """
        if self._pending:
            return [min(self._pending.values())[1]]
        return [self.last_caller if self.last_caller is not None else self.subject]

    def _died(self, why: str) -> None:
        """Report the death of the current connection, once."""
        if self.generation == self._reported or (self._client is None and self._owner is None):
            return
        self._reported = self.generation
        if self.on_death is not None:
            self.on_death(self.blamed(), why)

    def alive(self) -> bool:
        """Whether a connection is up.

        Returns:
            True while the client is connected and its owner task runs.
        """
        return self._client is not None and self._owner is not None and not self._owner.done()

    def _transport(self, stack: AsyncExitStack) -> Any:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        launch = self.launch
        if launch.command is not None:
            env = dict(launch.env) if launch.env else None
            # A command that cannot be started fails here, as it would unrelayed. The child's PATH
            # is the configured one if set (even empty), else the host's.
            path = env["PATH"] if env is not None and "PATH" in env else os.environ.get("PATH")
            check_command(launch.command, path, launch.host_cwd)
            params = StdioServerParameters(
                command=sys.executable,
                args=launch.relay_argv(),
                env=env,
                cwd=launch.cwd if launch.view is None else None,  # with a view: the relay's --cwd
                encoding_error_handler="replace",  # the relay already made every line valid UTF-8
            )
            # The relay's stderr (the server's, gated by the relay) becomes log records of this
            # session's subject; read in a context of its own, so no caller's subject is borrowed.
            read_end, write_end = os.pipe()
            errlog = os.fdopen(write_end, "w")
            reader = asyncio.get_running_loop().create_task(
                self._log_stderr(read_end), context=contextvars.Context()
            )
            stack.push_async_callback(_finish_reading, reader)  # after the client has closed

            async def stdio() -> Any:
                try:
                    transport = stdio_client(params, errlog=errlog)
                    return await stack.enter_async_context(Client(self._watched(transport), mode="legacy"))
                finally:
                    errlog.close()  # the relay holds its own copy: its exit ends the reader

            return stdio()

        async def http() -> Any:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            from .bounded_http import ACCEPT_IDENTITY, BoundedBodies

            assert launch.url is not None
            http_client = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers={**ACCEPT_IDENTITY, **launch.headers},
                    timeout=httpx2.Timeout(launch.connect_timeout, read=None),
                    transport=BoundedBodies(launch.max_message_bytes),
                )
            )
            transport = streamable_http_client(
                launch.url, http_client=http_client, max_sse_event_size=launch.max_message_bytes
            )
            return await stack.enter_async_context(Client(transport, mode="legacy"))

        return http()

    async def _log_stderr(self, read_end: int) -> None:
        """Log each line of the relay's stderr as this session's subject (the relay bounds lines and
        their rate; a longer line than it ever passes is dropped here), until the relay exits."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_STDERR_LINE_LIMIT, loop=loop)
        pipe = os.fdopen(read_end, "rb", buffering=0)
        try:
            transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        except BaseException:
            pipe.close()
            raise
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # over the limit: dropped
                    continue
                if not line:
                    return
                text = line.rstrip(b"\n").decode("utf-8", "replace")
                if self.subject is None:  # the host's own session, or a shared one
                    log.info("%s stderr: %r", self.label, text)
                    continue
                with authz.with_subject(authz.Subject(self.subject)):  # the limiter's key
                    log.info("%s stderr: %r", self.label, text)
        finally:
            transport.close()

    @asynccontextmanager
    async def _watched(self, inner: Any) -> AsyncIterator[Any]:
        """``inner``'s streams, with the end of the server's output noticed as it happens."""
        import anyio

        async with inner as (read, write):
            send, receive = anyio.create_memory_object_stream[Any](0)
            closing = False

            async def pump() -> None:
                try:
                    async with send:
                        async for item in read:
                            await send.send(item)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return  # our side went away first: a normal close
                if not closing:
                    log.warning(
                        "%s: the server ended the connection (exited or closed its output); "
                        "the next call starts it again",
                        self.label,
                    )
                    self.mark_dead("the server ended the connection")

            async with anyio.create_task_group() as tg:
                tg.start_soon(pump)
                try:
                    yield receive, write
                finally:
                    closing = True
                    tg.cancel_scope.cancel()
                    await receive.aclose()

    async def _run_owner(self, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        try:
            async with AsyncExitStack() as stack:
                client = await self._transport(stack)
                ready.set_result(client)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError("cancelled"))
            elif not isinstance(exc, asyncio.CancelledError):
                log.info("%s: connection ended: %s", self.label, brief(exc))

    async def client(self) -> Any:
        """The connected MCP client (connecting now if needed, within ``connect_timeout``).

        Returns:
            The MCP client session.
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.alive():
                return self._client
            if self._client is not None:  # the connection ended without a word from the transport
                self._died("the connection ended")
            await self._close_owner()
            self.attempts += 1
            self.starter = asyncio.current_task()
            loop = asyncio.get_running_loop()
            stop = asyncio.Event()
            ready: asyncio.Future[Any] = loop.create_future()
            ready.add_done_callback(_retrieve)
            owner = loop.create_task(
                self._run_owner(ready, stop), name=f"mcp-upstream-{self.launch.upstream}-{self.launch.owner}"
            )
            try:
                async with asyncio.timeout(self.launch.connect_timeout):
                    client = await asyncio.shield(ready)
            except BaseException:
                stop.set()
                owner.cancel()
                raise
            self._client, self._owner, self._stop = client, owner, stop
            self.generation += 1
            self.connects += 1
            if self.started is None:
                self.started = time.monotonic()
            return client

    def mark_dead(self, why: str = "the connection failed") -> None:
        """The connection is gone or unusable: report it (once) and let the next call start again.

        Args:
            why: the reason, for the log and ``on_death``.
        """
        self._died(why)
        self._client = None
        if self._stop is not None:
            self._stop.set()

    async def stop_if(self, generation: int, why: str) -> bool:
        """Stop a connection (a stuck one: for stdio the server process is terminated) and wait
        until it has ended.

        Args:
            generation: the connection to stop.
            why: the reason, for the log and ``on_death``.

        Returns:
            True when it was stopped; False when another one is up by now, or none.
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if generation != self.generation or not self.alive():
                return False
            self.mark_dead(why)
            await self._close_owner()
            return True

    async def _close_owner(self) -> None:
        owner, stop = self._owner, self._stop
        self._client, self._owner, self._stop = None, None, None
        if stop is not None:
            stop.set()
        if owner is not None and not owner.done():
            try:
                async with asyncio.timeout(_CLOSE_TIMEOUT):
                    await asyncio.shield(owner)
            except (TimeoutError, Exception):
                owner.cancel()

    async def aclose(self) -> None:
        """Close the connection (waiting for it to end, at most 10 s); a later call starts again."""
        await self._close_owner()

    async def list_tools(self) -> list[Any]:
        """Every tool, following ``nextCursor``.

        Returns:
            The MCP ``Tool`` objects of every page.

        Raises:
            UpstreamBuildError: the listing did not end within :data:`MAX_LIST_PAGES` pages.
        """
        client = await self.client()
        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools
        raise UpstreamBuildError(
            f"upstream {self.launch.upstream!r}: tools/list did not end after {MAX_LIST_PAGES} pages"
        )


def check_command(command: str, path: str | None, cwd: str | None) -> None:
    """Fail as starting ``command`` would.

    Args:
        command: the program name or path.
        path: the ``PATH`` the process gets (None: ``os.defpath``); relative entries are taken
            from ``cwd`` like the process's own lookup.
        cwd: its working directory (None: the host's).

    Raises:
        FileNotFoundError: no file of that name is found (on ``path``, or at ``cwd``/``command``
            when it names a path).
        PermissionError: none found can run.
    """
    base = cwd or os.getcwd()
    if os.sep in command:
        candidates = [os.path.join(base, command)]
    else:
        entries = (path if path is not None else os.defpath).split(os.pathsep)
        candidates = [os.path.join(base, entry, command) for entry in entries]
    if any(os.path.isfile(c) and os.access(c, os.X_OK) for c in candidates):
        return
    if any(os.path.exists(c) for c in candidates):  # a directory, or a file that cannot run
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), command)
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)


async def _finish_reading(reader: asyncio.Task[None]) -> None:
    """Let a session's stderr reader log the relay's last lines (it ends when the relay exits)."""
    try:
        async with asyncio.timeout(_STDERR_GRACE):
            await asyncio.shield(reader)
    except TimeoutError:
        reader.cancel()
    except Exception as exc:
        log.warning("upstream stderr reader failed: %s", brief(exc))


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # the waiter may be gone (cancelled): mark the exception retrieved


def brief(exc: BaseException) -> str:
    """One line for a host log about an error (the first of an exception group's).

    Args:
        exc: the error.

    Returns:
        ``<type>: <text>``, newlines made spaces and the text cut to 300 characters.
    """
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]  # the task group's wrapper says nothing: name what failed
    text = str(exc).replace("\n", " ")
    return f"{type(exc).__name__}: {text[:300]}"
