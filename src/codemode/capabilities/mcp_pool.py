"""The sessions of one upstream MCP server: one for every subject, or one per subject.

``shared``: the host's own session (the one that listed the tools) serves every call.

``per_subject``: each subject gets a session of its own (for stdio a server process of its own,
started with the configuration derived from that subject), created on its first call and never
used for another subject. At most ``max_sessions`` live at once: a new subject takes the place of
the least recently used idle one; when every one is in a call the new subject's call fails with
``resource limit exceeded: concurrency``. A session unused for ``idle_timeout`` seconds is closed,
and one older than ``max_session_seconds`` is closed as soon as it is idle (the next call starts a
fresh one). The host's discovery session is closed after discovery, unless the configuration has
nothing subject-specific (then the first subject takes it over: it has served nobody yet, and with
a single subject, as ``serve --stdio`` has, per-subject and shared are the same one process).

Everything here runs on the pack's own event loop (``upstream_loop``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Literal

from codemode import ResourceLimit

from .mcp_session import Launch, UpstreamCallFailed, UpstreamSession, brief, transport_failure

__all__ = ["SessionPool"]

log = logging.getLogger("codemode.capabilities.mcp_upstream")


class SessionPool:
    """The sessions of one upstream (see the module text)."""

    def __init__(
        self,
        upstream: str,
        tenancy: Literal["per_subject", "shared"],
        launcher: Callable[[str | None], Launch],
        *,
        adoptable: bool,
        max_sessions: int = 16,
        idle_timeout: float = 300.0,
        max_session_seconds: float = 3600.0,
        max_restarts: int = 6,
        timeout: float = 30.0,
    ) -> None:
        self.upstream = upstream
        self.tenancy = tenancy
        self._launcher = launcher
        self.adoptable = adoptable
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.max_session_seconds = max_session_seconds
        self.max_restarts = max_restarts
        self.timeout = timeout
        self.host: UpstreamSession | None = None
        self.subjects: OrderedDict[str, UpstreamSession] = OrderedDict()
        self._janitor: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self.retired = 0  # starts of sessions already closed

    @property
    def starts(self) -> int:
        """Sessions started so far (stdio: server processes)."""
        live = [self.host] if self.host is not None else []
        return self.retired + sum(s.connects for s in [*live, *self.subjects.values()])

    def host_session(self) -> UpstreamSession:
        if self.host is None:
            self.host = UpstreamSession(self._launcher(None), self.max_restarts)
        return self.host

    async def discover(self, *, keep_open: bool) -> list[Any]:
        """The tool list, from the host's session (started now if needed)."""
        session = self.host_session()
        try:
            return await session.list_tools()
        finally:
            if not keep_open or (self.tenancy == "per_subject" and not self.adoptable):
                self._retire(session)
                self.host = None
                await session.aclose()
            elif self.tenancy == "per_subject":
                self._start_janitor()  # the spare is closed if no subject takes it over in time

    async def connect(self) -> None:
        """Shared: make sure the one session is up (a no-op when discovery left it open)."""
        if self.tenancy == "shared":
            await self.host_session().client()

    def acquire(self, subject_id: str) -> UpstreamSession:
        """The session that serves ``subject_id`` (made now if needed, never another's)."""
        if self.tenancy == "shared":
            return self.host_session()
        now = time.monotonic()
        session = self.subjects.get(subject_id)
        if session is not None and session.busy == 0 and self._expired(session, now):
            self._close_later(self.subjects.pop(subject_id), "reached max_session_seconds")
            session = None
        if session is not None:
            self.subjects.move_to_end(subject_id)
            return session
        if len(self.subjects) >= self.max_sessions:
            idle = next((k for k, s in self.subjects.items() if s.busy == 0), None)
            if idle is None:
                log.warning(
                    "upstream %r: every one of its %d per-subject sessions is in a call (max_sessions)",
                    self.upstream,
                    self.max_sessions,
                )
                raise ResourceLimit("concurrency")
            self._close_later(self.subjects.pop(idle), "evicted for a new subject (max_sessions)")
        if self.adoptable and self.host is not None:
            session, self.host = self.host, None
        else:
            session = UpstreamSession(self._launcher(subject_id), self.max_restarts)
        self.subjects[subject_id] = session
        self._start_janitor()
        return session

    def _start_janitor(self) -> None:
        if self._janitor is None or self._janitor.done():
            self._janitor = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def call(
        self, subject_id: str, tool: str, arguments: Mapping[str, Any], deadline: float, cap_id: str
    ) -> Any:
        """``tools/call`` on the subject's session, bounded by ``timeout`` and ``deadline``
        (monotonic); a transport failure marks the session dead (the next call starts it again)."""
        try:
            session = self.acquire(subject_id)
        except ResourceLimit:
            raise
        except Exception as exc:  # the subject's configuration: a directory, a header file
            log.warning("upstream %r: %s: cannot prepare the session: %s", self.upstream, cap_id, brief(exc))
            raise UpstreamCallFailed(cap_id) from None
        session.busy += 1
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no time left before the execute deadline")
            async with asyncio.timeout(min(session.launch.connect_timeout, remaining)):
                client = await session.client()
            budget = min(self.timeout, deadline - time.monotonic())
            # The client's own read timeout fires first and sends notifications/cancelled; the
            # outer bound (a grace second later) is the backstop.
            async with asyncio.timeout(budget + 1.0):
                return await client.call_tool(tool, dict(arguments), read_timeout_seconds=budget)
        except (asyncio.CancelledError, ResourceLimit):
            raise
        except Exception as exc:
            if transport_failure(exc):
                session.mark_dead()
                log.warning("%s: %s failed (will reconnect): %s", session.label, cap_id, brief(exc))
            else:
                log.warning("%s: %s failed: %s", session.label, cap_id, brief(exc))
            raise UpstreamCallFailed(cap_id) from None
        finally:
            session.busy -= 1
            session.last_used = time.monotonic()

    def _expired(self, session: UpstreamSession, now: float) -> bool:
        return session.started is not None and now - session.started > self.max_session_seconds

    def _retire(self, session: UpstreamSession) -> None:
        self.retired += session.connects
        session.connects = 0

    def _close_later(self, session: UpstreamSession, why: str) -> None:
        log.info("%s: closed: %s", session.label, why)
        self._retire(session)
        task = asyncio.get_running_loop().create_task(session.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def sweep(self) -> None:
        """Close the sessions idle too long or too old (only those not in a call)."""
        now = time.monotonic()
        for key, session in list(self.subjects.items()):
            if session.busy:
                continue
            if now - session.last_used > self.idle_timeout:
                self._close_later(self.subjects.pop(key), f"idle for {self.idle_timeout:g} s (idle_timeout)")
            elif self._expired(session, now):
                self._close_later(self.subjects.pop(key), "reached max_session_seconds")
        host = self.host
        if host is not None and self.tenancy == "per_subject" and now - host.last_used > self.idle_timeout:
            self.host = None
            self._close_later(host, "discovery session not taken over (idle_timeout)")

    async def _sweep_forever(self) -> None:
        period = max(0.05, min(self.idle_timeout, self.max_session_seconds) / 4)
        while self.subjects or self.host is not None:
            await asyncio.sleep(period)
            try:
                self.sweep()
            except Exception as exc:  # never let the janitor die silently
                log.warning("upstream %r: sweeping sessions failed: %s", self.upstream, brief(exc))

    async def aclose(self) -> None:
        if self._janitor is not None:
            self._janitor.cancel()
            self._janitor = None
        sessions = [*([self.host] if self.host is not None else []), *self.subjects.values()]
        self.host = None
        self.subjects.clear()
        for session in sessions:
            self._retire(session)
        await asyncio.gather(*(s.aclose() for s in sessions), *self._closing, return_exceptions=True)
