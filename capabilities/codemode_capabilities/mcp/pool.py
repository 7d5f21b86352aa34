"""The sessions of one upstream MCP server: one for every subject (``shared``), or one per subject.

The rules are docs/packs.md: "Tenancy" (which session serves a call, the bounds on per-subject
sessions, when the discovery session is taken over) and "Stuck and crashing servers" (the ping
watch, and restarts charged to subjects). For the code reader: :class:`SessionPool` keeps the
host's own session (discovery's; shared mode's only one) and an LRU table of per-subject ones, a
janitor task that sweeps idle and old sessions, one watch task per unanswered call, and the
restart charges per subject within :data:`RESTART_WINDOW` (a shared server's own failed starts are
charged to ``None``). Everything here runs on the pack's own event loop (``loop``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any, Literal

from codemode import ResourceLimit
from codemode.packs import upstream_restarted

from .session import (
    Launch,
    UpstreamCallFailed,
    UpstreamSession,
    UpstreamUnavailable,
    brief,
    transport_failure,
)
from .tenancy import subject_key

__all__ = ["DEFAULT_STUCK_GRACE", "RESTART_WINDOW", "SessionPool"]

log = logging.getLogger("codemode.capabilities.mcp_upstream")

#: Seconds past a call's ``timeout`` a session gets to answer a ping before it counts as stuck.
DEFAULT_STUCK_GRACE = 5.0
#: Seconds within which restarts charged to one subject count against ``max_restarts``.
RESTART_WINDOW = 60.0
#: Seconds before the execute deadline a call waits for the verdict on its stuck session at most
#: (the failure still has to reach the program before its deadline).
_ANSWER_MARGIN = 0.5
#: The charge key of a shared server's own failed starts (nobody's in particular).
_NOBODY: None = None


class SessionPool:
    """The sessions of one upstream (see the module text).

    Args:
        upstream: the upstream's name.
        tenancy: ``per_subject`` or ``shared``.
        launcher: what to start for a subject (None: the host's own session).
        adoptable: whether the first subject may take over the host's discovery session (nothing
            in the configuration is subject-specific).
        max_sessions: per-subject sessions at once.
        idle_timeout: seconds before an idle per-subject session closes.
        max_session_seconds: a session older than this closes once idle.
        max_restarts: restarts charged to one subject within :data:`RESTART_WINDOW` before its
            calls fail.
        timeout: seconds per call.
        stuck_grace: seconds past ``timeout`` an unanswered session gets to answer a ping.
    """

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
        stuck_grace: float = DEFAULT_STUCK_GRACE,
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
        self.stuck_grace = stuck_grace
        self.host: UpstreamSession | None = None
        self.subjects: OrderedDict[str, UpstreamSession] = OrderedDict()
        self._janitor: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._watches: set[asyncio.Task[None]] = set()
        #: Restarts (and failed starts) charged to each subject within the last minute.
        self.charges: dict[str | None, deque[float]] = {}
        self.retired = 0  # starts of sessions already closed
        self.retired_attempts = 0

    def _live(self) -> list[UpstreamSession]:
        return [*([self.host] if self.host is not None else []), *self.subjects.values()]

    @property
    def starts(self) -> int:
        """Sessions started so far (stdio: server processes that got through ``initialize``)."""
        return self.retired + sum(s.connects for s in self._live())

    @property
    def attempts(self) -> int:
        """Starts tried so far, failed ones included (stdio: server processes started)."""
        return self.retired_attempts + sum(s.attempts for s in self._live())

    def _session(self, subject_id: str | None) -> UpstreamSession:
        owner = subject_id if self.tenancy == "per_subject" else None
        return UpstreamSession(self._launcher(subject_id), owner, self._died)

    def host_session(self) -> UpstreamSession:
        """The host's own session (made now if needed): discovery's, and shared mode's only one.

        Returns:
            The session.
        """
        if self.host is None:
            self.host = self._session(None)
        return self.host

    # --- restarts charged to subjects ---------------------------------------------------------

    def _recent(self, key: str | None) -> int:
        times = self.charges.get(key)
        if times is None:
            return 0
        now = time.monotonic()
        while times and now - times[0] > RESTART_WINDOW:
            times.popleft()
        if not times:
            del self.charges[key]
            return 0
        return len(times)

    def charge(self, key: str | None, why: str) -> None:
        """Charge a restart (or a failed start) to a subject, and log it.

        Args:
            key: the subject id (None: nobody in particular, a shared server's own failed start).
            why: the reason, for the log.
        """
        self.charges.setdefault(key, deque()).append(time.monotonic())
        who = "a start of its own" if key is None else f"subject {_subject_label(key)}"
        log.info("upstream %r: a restart charged to %s: %s", self.upstream, who, why)

    def _died(self, subjects: list[str | None], why: str) -> None:
        upstream_restarted(self.upstream)  # one session ended: codemode_upstream_restarts_total
        for subject in subjects:
            if subject is not None or self.tenancy == "shared":
                self.charge(subject, why)

    def _check_allowance(self, subject_id: str, cap_id: str) -> None:
        """Refuse the call of a subject that caused too many restarts within the last minute."""
        for key in (subject_id, _NOBODY) if self.tenancy == "shared" else (subject_id,):
            recent = self._recent(key)
            if recent > self.max_restarts:
                who = "its own failed starts" if key is None else f"subject {_subject_label(key)}"
                log.warning(
                    "upstream %r: %s refused: %d restarts in the last minute charged to %s "
                    "(max_restarts_per_minute = %d)",
                    self.upstream,
                    cap_id,
                    recent,
                    who,
                    self.max_restarts,
                )
                raise UpstreamUnavailable(self.upstream)

    async def discover(self, *, keep_open: bool) -> list[Any]:
        """The tool list, from the host's session (started now if needed).

        Args:
            keep_open: keep the host's session for the calls (per_subject: only when adoptable;
                it is closed if no subject takes it over in time).

        Returns:
            The upstream's tools.
        """
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
        """The session that serves ``subject_id`` (made now if needed, never another's).

        Args:
            subject_id: the caller.

        Returns:
            Its session (shared: the one session).

        Raises:
            ResourceLimit: ``concurrency``: every one of ``max_sessions`` per-subject sessions is
                in a call.
        """
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
            session.subject = subject_id
        else:
            session = self._session(subject_id)
        self.subjects[subject_id] = session
        self._start_janitor()
        return session

    def _start_janitor(self) -> None:
        if self._janitor is None or self._janitor.done():
            self._janitor = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def call(
        self, subject_id: str, tool: str, arguments: Mapping[str, Any], deadline: float, cap_id: str
    ) -> tuple[Any, tuple[str, ...]]:
        """``tools/call`` on the subject's session, bounded by ``timeout`` and ``deadline``. A
        transport failure marks the session dead (the next call starts it again); an unanswered
        call puts it under watch.

        Args:
            subject_id: the caller.
            tool: the upstream tool name.
            arguments: the arguments as the upstream names them.
            deadline: the execute deadline (monotonic seconds).
            cap_id: the capability id, for logs.

        Returns:
            The MCP call result and the session's credential values (to redact from its text).

        Raises:
            ResourceLimit: ``concurrency`` (see :meth:`acquire`).
            UpstreamCallFailed: any other failure: over the restart bound, the subject's session
                cannot be prepared, transport, protocol or timeout (logged).
        """
        try:
            self._check_allowance(subject_id, cap_id)
            session = self.acquire(subject_id)
        except ResourceLimit:
            raise
        except UpstreamUnavailable:
            raise UpstreamCallFailed(cap_id) from None
        except Exception as exc:  # the subject's configuration: a directory, a header file
            log.warning("upstream %r: %s: cannot prepare the session: %s", self.upstream, cap_id, brief(exc))
            raise UpstreamCallFailed(cap_id) from None
        session.busy += 1
        token: int | None = None
        try:
            client = await self._connect(session, subject_id, deadline, cap_id)
            budget = min(self.timeout, deadline - time.monotonic())
            token, generation = session.sent(subject_id), session.generation
            try:
                # The client's own read timeout fires first and sends notifications/cancelled;
                # the outer bound (a grace second later) is the backstop.
                async with asyncio.timeout(budget + 1.0):
                    result = await client.call_tool(tool, dict(arguments), read_timeout_seconds=budget)
                return result, session.launch.secrets
            except BaseException as exc:
                if _unanswered(exc):
                    watch = self._watch(session, client, generation, token)
                    token = None  # the watch settles it
                    if not isinstance(exc, asyncio.CancelledError):
                        await _wait_until(watch, deadline - _ANSWER_MARGIN)
                raise
        except (asyncio.CancelledError, ResourceLimit, UpstreamCallFailed):
            raise
        except Exception as exc:
            if transport_failure(exc):
                session.mark_dead(f"{cap_id} failed: {brief(exc)}")
                log.warning("%s: %s failed (will reconnect): %s", session.label, cap_id, brief(exc))
            else:
                log.warning("%s: %s failed: %s", session.label, cap_id, brief(exc))
            raise UpstreamCallFailed(cap_id) from None
        finally:
            if token is not None:
                session.settled(token)
            session.busy -= 1
            session.last_used = time.monotonic()

    async def _connect(self, session: UpstreamSession, subject_id: str, deadline: float, cap_id: str) -> Any:
        """The session's client, started now if needed; a start that fails is charged."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no time left before the execute deadline")
        attempts = session.attempts
        limit = min(session.launch.connect_timeout, remaining)
        try:
            async with asyncio.timeout(limit):
                return await session.client()
        except BaseException as exc:
            if session.attempts == attempts or session.starter is not asyncio.current_task():
                raise  # no start was tried by this call
            upstream_restarted(self.upstream)  # a failed start: counted as one
            self.charge(subject_id, f"a start failed for {cap_id}: {brief(exc)}")
            # The caller left (its execute ended or was cancelled) or its deadline cut the start
            # short: that is its own doing, never a failed start of the server's.
            caller_left = isinstance(exc, asyncio.CancelledError) or (
                isinstance(exc, TimeoutError) and limit < session.launch.connect_timeout
            )
            if self.tenancy == "shared" and not caller_left:
                self.charge(_NOBODY, f"a start failed: {brief(exc)}")
            if isinstance(exc, Exception):
                log.warning("%s: %s: the server did not start: %s", session.label, cap_id, brief(exc))
                raise UpstreamCallFailed(cap_id) from None
            raise

    def _watch(
        self, session: UpstreamSession, client: Any, generation: int, token: int
    ) -> asyncio.Task[None]:
        """Ping a session whose call went unanswered; stop it when it does not answer by the
        call's ``timeout + stuck_grace`` (see the module text)."""
        sent = session.sent_at(token)

        async def watch() -> None:
            try:
                wait = max(sent + self.timeout + self.stuck_grace - time.monotonic(), self.stuck_grace)
                try:
                    async with asyncio.timeout(wait):
                        # The session's own ping (Client.send_ping warns that the 2026-07-28
                        # protocol dropped it; legacy-mode sessions, ours, still have it).
                        await client.session.send_ping()
                    return
                except Exception as exc:
                    if not _unanswered(exc) and not transport_failure(exc):
                        return  # an answer, even an error, is a sign of life
                why = (
                    f"stuck: a call got no answer within timeout ({self.timeout:g} s) and a ping none "
                    f"within stuck_grace ({self.stuck_grace:g} s) more"
                )
                if await session.stop_if(generation, why):
                    log.warning(
                        "%s: %s; the server is stopped, the next call starts it again", session.label, why
                    )
            finally:
                session.settled(token)

        task = asyncio.get_running_loop().create_task(watch(), name=f"mcp-watch-{session.label}")
        self._watches.add(task)
        task.add_done_callback(self._watches.discard)
        return task

    def _expired(self, session: UpstreamSession, now: float) -> bool:
        return session.started is not None and now - session.started > self.max_session_seconds

    def _retire(self, session: UpstreamSession) -> None:
        self.retired += session.connects
        self.retired_attempts += session.attempts
        session.connects = session.attempts = 0

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
        """Close every session and stop the sweeping and watching tasks."""
        if self._janitor is not None:
            self._janitor.cancel()
            self._janitor = None
        for watch in list(self._watches):
            watch.cancel()
        sessions = self._live()
        self.host = None
        self.subjects.clear()
        for session in sessions:
            self._retire(session)
        await asyncio.gather(
            *(s.aclose() for s in sessions), *self._closing, *self._watches, return_exceptions=True
        )


def _subject_label(subject_id: str) -> str:
    """How logs name a subject: its key (ids may hold anything)."""
    return subject_key(subject_id)


def _unanswered(exc: BaseException) -> bool:
    """Whether ``exc`` means the request got no answer (a timeout, or its caller left)."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import REQUEST_TIMEOUT

    if isinstance(exc, MCPError):
        return bool(exc.code == REQUEST_TIMEOUT)
    return isinstance(exc, TimeoutError | asyncio.CancelledError)


async def _wait_until(task: asyncio.Task[None], deadline: float) -> None:
    """Wait for ``task`` (shielded) until ``deadline`` at most."""
    remaining = deadline - time.monotonic()
    if remaining > 0:
        done, _ = await asyncio.wait([task], timeout=remaining)
        del done
