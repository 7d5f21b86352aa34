"""The executor of one built server: it owns the plan, the runtime, the worker slots and the
per-subject quota, and runs each execute around a session (``codemode.execution.session``).

One execute: count it against its subject's quota, wait for a fair slot, take a sandbox from the
runtime, let a :class:`~codemode.execution.session.Session` exchange the program with it under the
deadline, then reap the worker (in the background unless its exit decides the answer) and release
the slot exactly once. Whatever ended the execute, one ``ExecuteEvent`` and one trace span record
it. A call the policy leaves to the user suspends the execute (codemode.execution.suspension).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib.metadata
import inspect
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from codemode_worker import PROTOCOL_VERSION
from codemode_worker.protocol import encode_frame, max_print_frames

from ..authz import Subject
from ..catalog.capability import CompiledCapability
from ..catalog.types import without_defaults
from ..common.errors import (
    CodeModeError,
    ExecutionTimeout,
    Internal,
    InvalidProgram,
    ResourceLimit,
)
from ..common.handoff import HandOff
from ..common.outcomes import ExecuteResult
from ..runtimes.base import ExitInfo, ReusableSandbox, Sandbox, Spawned, SubjectSpawner
from ..runtimes.exhaustion import exhaustion_kind
from ..store import Store
from .admission import FairAdmission
from .approval import Approver
from .causes import QUOTA_STORE, Waiting, deadline_passed_waiting
from .context import CallContext
from .observe import ApprovalAnswer, ExecuteEvent, ExecuteOutcome, Observer
from .parallel import SubjectThreads
from .plan import Plan
from .quota import Hold, QuotaStore, QuotaUnavailable
from .replay import ReplayDiverged
from .report import Report
from .session import Session, WorkerGone, WorkerMisbehaved, limit_error
from .suspension import Resume, Suspended, Suspensions, UnknownSuspension, defers, fingerprint
from .tracing import NULL_TRACE, Trace, Tracer
from .worker_text import ArgumentGrammar

__all__ = ["DEADLINE_EXIT_WAIT", "SYNC_HANDLER_BUDGET", "Executor"]

log = logging.getLogger("codemode.execute")

#: Seconds the event loop's thread may wait for a sync handler before awaiting it (codemode.common.handoff).
SYNC_HANDLER_BUDGET = 0.001
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Seconds a deadline's answer waits for the exit of a worker the runtime already knows is dead (the
#: host had not read the death yet, on a busy machine): one that died of its memory limit is
#: reported as memory, not time. A live worker's deadline is answered at once.
DEADLINE_EXIT_WAIT = 2.0

try:
    _HOST_VERSION = importlib.metadata.version("codemode")
except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
    _HOST_VERSION = "unknown"

_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


@dataclass
class _Run:
    """One run of an execute as its event records it: who and since when, how far it got (the
    wait it is in, its sandbox and session), and how it ended (``outcome``, the limit ``kind``, the
    operator's ``cause``)."""

    subject: Subject
    trace: Trace
    start: float
    outcome: ExecuteOutcome = "internal"
    limit: str | None = None
    cause: str = ""  # for the operator (ExecuteEvent.cause): which wait a deadline passed in
    waiting: Waiting = "slot"
    calls: int = 0
    worker_id: str = ""
    oom: bool = False
    sandbox: Sandbox | None = None
    session: Session | None = None


class Executor:
    """Runs programs for one built server.

    Args:
        plan: the checked server (capabilities, authorizer, limits, admission, runtime, observer,
            tracing), taken whole.
    """

    def __init__(self, plan: Plan) -> None:
        self.by_name = {c.name: c for c in plan.capabilities}
        self.subject_quota = plan.admission.subject_quota
        self.quota: QuotaStore = plan.quota_store
        self._quota_down = False  # the store failed last time (logged once per outage)
        self.authorizer = plan.authorizer
        self.limits = plan.limits
        self.runtime = plan.runtime
        self.observer: Observer = plan.observer
        # Imports OpenTelemetry only when tracing is on (codemode.execution.tracing).
        self.tracer = Tracer(plan.tracing, plan.runtime.name) if plan.tracing is not None else None
        manifest: list[dict[str, Any]] = [
            {"name": c.name, "input": without_defaults(c.input_shape)} for c in self.by_name.values()
        ]
        # Checked once with the strict encoder, then reused as text for every exec frame.
        encode_frame(
            {
                "k": "exec",
                "v": PROTOCOL_VERSION,
                "source": "",
                "manifest": manifest,
                "limits": self._wire_limits(),
            }
        )
        # Manifest entries grouped by namespace root, as JSON text. A program can reach a namespace
        # only through its root name (Starlark has no globals(), eval or load here), so each exec
        # frame carries just the roots its source mentions: with thousands of capabilities this
        # keeps the frame small and the worker from building namespaces the program cannot use.
        by_root: dict[str, list[str]] = {}
        for cap, entry in zip(self.by_name.values(), manifest, strict=True):
            by_root.setdefault(cap.name.split(".", 1)[0], []).append(_json(entry))
        self.manifest_by_root = {root: ",".join(parts) for root, parts in by_root.items()}
        self.limits_json = _json(self._wire_limits())
        self.argument_grammar = ArgumentGrammar({c.name: c.input_shape for c in self.by_name.values()})
        # Worker slots, shared fairly between subjects (codemode.execution.admission).
        self.slots = FairAdmission(plan.admission.slots, plan.admission.reserved_slots)
        self._async_handlers: dict[str, bool] = {}
        # Sync handlers run on a pool of their own (not the loop's default executor, which the
        # runtimes use too), each capability with its own cheap hand-off (codemode.common.handoff).
        self._sync_pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: Threads of that pool (one execute's parallel calls take at most half: codemode.execution.parallel).
        self.handler_threads = min(32, (os.cpu_count() or 1) + 4)
        #: Who may start a sync handler on them: per-subject shares (execution.parallel.SubjectThreads).
        self.thread_shares = SubjectThreads(self.handler_threads)
        self._handoffs: dict[str, HandOff] = {}
        self.reaping: set[asyncio.Task[None]] = set()
        #: Suspended executes (codemode.execution.suspension): kept in the plan's store.
        store = _store_of(plan)
        self.suspensions: Suspensions | None = Suspensions(store, plan.limits, self._pin())
        #: Where the state pack keeps its keys: handed to handlers as ``CallContext.store``.
        self.store = store
        self._store_down = False
        #: A runtime that hands out sandboxes per subject (the warm and reuse pools: ``SubjectSpawner``).
        self._spawn_for: Callable[[str], Awaitable[Spawned]] | None = (
            plan.runtime.spawn_for if isinstance(plan.runtime, SubjectSpawner) else None
        )

    def is_async(self, cap: CompiledCapability) -> bool:
        """Whether ``cap``'s handler is a coroutine function (asked once per capability).

        Args:
            cap: the capability.

        Returns:
            True for an async handler.
        """
        known = self._async_handlers.get(cap.name)
        if known is None:
            handler = cap.handler
            known = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
                getattr(handler, "__call__", None)  # noqa: B004
            )
            self._async_handlers[cap.name] = known
        return known

    def manifest_for(self, source: str) -> str:
        """The manifest JSON for one program: the namespaces whose root names its source mentions
        (a superset: names in strings or comments count too).

        Args:
            source: the program.

        Returns:
            The JSON array text of the manifest entries it may reach.
        """
        roots = self.manifest_by_root
        parts = [roots[name] for name in sorted(set(_IDENTIFIER.findall(source))) if name in roots]
        return "[" + ",".join(parts) + "]"

    def _wire_limits(self) -> dict[str, int]:
        limits = self.limits
        wire = {
            "max_steps": limits.max_execution_steps,
            "max_value_depth": limits.max_value_depth,
            "max_value_bytes": limits.max_value_bytes,
            "max_native_calls": limits.max_native_calls,
            "max_callstack": limits.max_callstack,
        }
        if limits.max_print_bytes > 0:  # optional: a worker without it discards prints
            wire["max_print_bytes"] = limits.max_print_bytes
        return wire

    async def execute(
        self,
        source: str,
        subject: Subject,
        trace_context: Mapping[str, Any] | None = None,
        approver: Approver | None = None,
        resume: Resume | None = None,
    ) -> ExecuteResult:
        """Run one program; enforces the per-subject quota around each of its runs. A
        ``CodeModeError`` it raises carries the ledger and prints so far (``Report.attach``).

        A call the policy leaves to the user suspends the execute (its worker and slot go; only a
        record stays: codemode.execution.suspension). An approver that answers in this process is
        then asked, and the answer resumes the execute by replay; one that ``defers`` (the
        2026-07-28 retry) gets the :class:`Suspended` raised instead.

        Args:
            source: the program.
            subject: the trusted subject it runs for.
            trace_context: W3C ``traceparent`` the execute's span links (never its parent).
            approver: asks the user about calls the policy leaves to them (None: nobody to ask).
            resume: a claimed suspension to replay (:meth:`resume`), or None for a first run.

        Returns:
            The program's result, call ledger and prints.

        Raises:
            ResourceLimit: ``quota``, when the subject already runs its quota of executes (any
                other ``CodeModeError`` of the run passes through).
            Suspended: the approver defers, and the execute waits for its answer.
        """
        try:
            return await self._run_once(source, subject, trace_context, approver, resume)
        except Suspended as suspended:
            if approver is None or defers(approver) or self.suspensions is None:
                raise
            run = functools.partial(self._run_once, source, subject, trace_context, approver)
            return await self.suspensions.answer_in_place(suspended, approver, run)

    async def resume(
        self,
        state: object,
        subject: Subject,
        source: str,
        answer: ApprovalAnswer,
        trace_context: Mapping[str, Any] | None = None,
        approver: Approver | None = None,
    ) -> ExecuteResult:
        """Resume a suspended execute with the user's answer (the 2026-07-28 retry), on any host
        sharing the store.

        Args:
            state: the ``request_state`` the suspension was returned with.
            subject: the trusted subject (only the one it ran for can resume it).
            source: the retry's program (must be the suspended one).
            answer: the user's answer to the pending call.
            trace_context: as for :meth:`execute`.
            approver: asks about the execute's later questions (as for :meth:`execute`).

        Returns:
            As :meth:`execute`.

        Raises:
            UnknownSuspension: the state is forged, used, expired, or another subject's or program's.
            Suspended: the resumed execute asks again.
            Internal: the store could not answer.
            CodeModeError: as :meth:`execute`.
        """
        if self.suspensions is None:
            raise UnknownSuspension()
        try:
            record_id = await self.suspensions.record_of(state, subject.id, source)
            claimed = await self.suspensions.claim(record_id, subject.id, answer)
        except (UnknownSuspension, CodeModeError):
            raise
        except Exception as exc:
            self.store_failed(exc)
            raise Internal() from None
        return await self.execute(claimed.record.source, subject, trace_context, approver, claimed)

    def store_failed(self, exc: Exception) -> None:
        """Log a store that could not answer (an "ask" then declines: fail closed).

        Args:
            exc: what it raised.
        """
        name = self.suspensions.store.name if self.suspensions is not None else "?"
        log.error(
            "store %r could not keep a suspension (%s: %s); asks decline until it answers "
            "(--store / CODEMODE_STORE)",
            name,
            type(exc).__name__,
            exc,
        )

    def _pin(self) -> str:
        """What a suspension recorded here may be replayed against (execution.suspension)."""
        catalog = [(c.id, c.name, c.input_shape) for c in self.by_name.values()]
        return fingerprint(catalog, self.limits_json, f"protocol {PROTOCOL_VERSION}; host {_HOST_VERSION}")

    async def _run_once(
        self,
        source: str,
        subject: Subject,
        trace_context: Mapping[str, Any] | None,
        approver: Approver | None,
        resume: Resume | None,
    ) -> ExecuteResult:
        if self.suspensions is not None:  # expired records go on time, this host's or a stopped one's
            self.suspensions.sweep_on_time()
        trace: Trace = self.tracer.start(subject.id, trace_context) if self.tracer is not None else NULL_TRACE
        hold = await self._hold(subject.id, trace) if self.subject_quota else None
        self.observer.execute_started(subject.id)
        try:
            return await self._execute(source, subject, trace, approver, hold, resume)
        finally:
            if hold is not None:
                self.quota.release(hold)
            self.observer.execute_finished(subject.id)

    async def _hold(self, subject_id: str, trace: Trace) -> Hold:
        """Count the execute against its subject's quota (``quota`` when it is at it; ``internal
        failure`` when the store cannot answer: fail closed, logged once per outage)."""
        try:
            hold = await self.quota.acquire(subject_id, self.subject_quota)
        except QuotaUnavailable as exc:
            if not self._quota_down:
                log.error(
                    "quota store %r unavailable (%s); executes fail closed with internal failure until it "
                    "answers (--quota-store / CODEMODE_QUOTA_STORE, --quota-store-timeout / "
                    "CODEMODE_QUOTA_STORE_TIMEOUT)",
                    self.quota.name,
                    exc,
                )
            self._quota_down = True
            self.observer.execute_outcome(ExecuteEvent(subject_id, "internal", 0.0, 0, "", cause=QUOTA_STORE))
            trace.finish("internal", None, 0, "")
            raise Internal() from None
        if self._quota_down:
            self._quota_down = False
            log.warning("quota store %r answers again", self.quota.name)
        if hold is None:
            self.observer.execute_outcome(
                ExecuteEvent(subject_id, "resource_limit", 0.0, 0, "", cause="quota")
            )
            trace.finish("resource_limit", "quota", 0, "")
            raise ResourceLimit("quota")
        return hold

    async def _execute(
        self,
        source: str,
        subject: Subject,
        trace: Trace,
        approver: Approver | None,
        hold: Hold | None,
        resume: Resume | None = None,
    ) -> ExecuteResult:
        limits = self.limits
        frames = max_print_frames(limits.max_native_calls, limits.max_execution_steps, limits.max_print_bytes)
        report = Report(limits.max_print_bytes, frames)
        try:
            return report.result(await self._run(source, subject, report, trace, approver, hold, resume))
        except CodeModeError as exc:
            report.attach(exc)
            raise

    async def _run(
        self,
        source: str,
        subject: Subject,
        report: Report,
        trace: Trace,
        approver: Approver | None,
        hold: Hold | None,
        resume: Resume | None = None,
    ) -> Any:
        """One run of the program, recorded whatever ends it (one ``ExecuteEvent``, one span)."""
        run = _Run(subject, trace, time.monotonic())
        try:
            if not isinstance(source, str) or _LONE_SURROGATE.search(source):
                raise InvalidProgram()
            if len(source.encode("utf-8")) > self.limits.max_source_bytes:
                raise ResourceLimit("source size")
            value = await self._serve(run, source, report, approver, hold, resume)
            run.outcome = "ok"
            return value
        except (CodeModeError, Suspended) as exc:
            run.outcome = exc.outcome
            if isinstance(exc, ResourceLimit):
                run.limit = exc.kind
            raise
        except asyncio.CancelledError:
            run.outcome = "cancelled"
            raise
        finally:
            self._record(run)

    async def _serve(
        self,
        run: _Run,
        source: str,
        report: Report,
        approver: Approver | None,
        hold: Hold | None,
        resume: Resume | None,
    ) -> Any:
        """The program in a worker under the deadline; any failure as the client's error. The
        sandbox goes (and its slot with it) exactly once, whatever happened."""
        # A resumed run's replay (a fresh worker's start and the recorded prefix) has its own bound,
        # twice max_execution_time; the program's own clock goes on at the pending call (go_live).
        deadline = run.start + self.limits.max_execution_time * (2 if resume is not None else 1)
        ctx = CallContext(deadline=deadline, store=self.store, limits=self.limits)
        reusable = False
        try:
            loop = asyncio.get_running_loop()
            async with asyncio.timeout_at(loop.time() + (deadline - time.monotonic())) as clock:
                await self._admit(run.subject.id, run.trace, hold.elsewhere if hold is not None else 0)
                run.waiting = "worker"
                run.sandbox = await self._acquire(run.subject.id, run.trace)
                run.worker_id = ctx.worker_id = run.sandbox.worker_id
                run.session = Session(
                    self, run.sandbox, run.subject, ctx, report, run.trace, approver, clock, resume
                )
                value = await run.session.run(source)
                reusable = True
            return value
        except TimeoutError:
            raise await self._deadline_passed(run) from None
        except WorkerGone:
            raise await self._worker_ended(run) from None
        except WorkerMisbehaved as exc:
            log.warning("worker %s misbehaved: %s", run.worker_id, exc)
            raise Internal() from None
        except ReplayDiverged as exc:
            log.warning("replay diverged in worker %s (%s): the execute fails closed", run.worker_id, exc)
            raise Internal() from None
        except Suspended:
            raise
        except CodeModeError as exc:
            # The program's own outcome (not a limit, not the host's fault): the worker ended
            # or waits at a frame boundary, so a reusable sandbox may serve this subject again.
            reusable = exc.outcome in _PROGRAM_OUTCOMES
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("execute failed in the host: %s", type(exc).__name__)
            raise Internal() from None
        finally:
            ctx.cancelled.set()
            self._let_go(run, reusable)

    async def _deadline_passed(self, run: _Run) -> ResourceLimit:
        """The error for a deadline: ``concurrency`` before the program began (the log says which
        wait), ``memory`` for a worker whose exit shows its memory limit, else ``time``."""
        late, run.sandbox = run.sandbox, None  # from here on the reap alone owns worker and slot
        if late is None:
            run.cause = deadline_passed_waiting(run.waiting, self.limits.max_execution_time, self.slots)
            return ExecutionTimeout("concurrency")
        if await self._limit_at_deadline(late, run.subject.id, run.trace) == "memory":
            return ResourceLimit("memory")
        return ExecutionTimeout("time")

    async def _worker_ended(self, run: _Run) -> CodeModeError:
        """The error for a worker whose stream ended without a final frame: the limit its exit
        shows, else an internal failure (logged with what the runtime knows)."""
        gone, run.sandbox = run.sandbox, None  # from here on _reap_now alone owns worker and slot
        info = await self._reap_now(gone, run.subject.id, run.trace)
        run.oom = info.oom_killed
        kind = exhaustion_kind(info, self.runtime)
        if kind is not None:
            if kind == "memory" and not run.oom:
                log.info("worker %s ran out of memory: %s", run.worker_id, info)
            return limit_error(kind)
        if info.lost:
            log.warning(
                "worker %s lost mid-execute: its stream broke while it was still running"
                " (its node lost or unreachable); how it ended is unknown (the runtime's"
                " log says what it found)",
                run.worker_id,
            )
        else:
            log.warning("worker %s ended without a result: %s", run.worker_id, info)
        return Internal()

    def _let_go(self, run: _Run, reusable: bool) -> None:
        """The run is over: count its calls and reap the sandbox it still holds in the background
        (a reusable one told first whether its execute ended cleanly)."""
        session, sandbox = run.session, run.sandbox
        if session is not None:
            run.calls = session.calls
        if sandbox is not None:
            if reusable:
                _mark_reusable(sandbox, session is not None and session.worker_done)
            self._reap_later(sandbox, run.subject.id, run.trace)

    def _record(self, run: _Run) -> None:
        """The execute's event for the observer and the end of its span."""
        self.observer.execute_outcome(
            ExecuteEvent(
                subject_id=run.subject.id,
                outcome=run.outcome,
                seconds=time.monotonic() - run.start,
                native_calls=run.calls,
                worker_id=run.worker_id,
                oom_killed=run.oom,
                cause=run.cause or (run.limit or ""),
            )
        )
        run.trace.finish(run.outcome, run.limit, run.calls, run.worker_id)

    async def _admit(self, subject_id: str, trace: Trace, elsewhere: int) -> None:
        """Wait for a worker slot (fair admission; ``elsewhere``: the subject's executes on other
        replicas), traced."""
        started = trace.now()
        granted = False
        try:
            await self.slots.acquire(subject_id, elsewhere)
            granted = True
        finally:
            trace.admission(started, granted)

    async def _acquire(self, subject_id: str, trace: Trace) -> Sandbox:
        """A started sandbox from the runtime (warm from a pool, or cold), traced; the slot goes
        back when there is none."""
        started = trace.now()
        spawned: Spawned | None = None
        try:
            if self._spawn_for is not None:
                spawned = await self._spawn_for(subject_id)
            else:
                spawned = Spawned(await self.runtime.spawn())
            return spawned.sandbox
        except BaseException:
            self.slots.release(subject_id)
            raise
        finally:
            trace.acquire(started, spawned is not None, spawned is not None and spawned.warm)

    async def _limit_at_deadline(self, sandbox: Sandbox, subject_id: str, trace: Trace) -> str | None:
        """For a worker already dead at the deadline, the limit its exit shows (``memory``) when it
        is read within ``DEADLINE_EXIT_WAIT``; None for a live one (reaped in the background)."""
        if sandbox.alive():
            self._reap_later(sandbox, subject_id, trace)
            return None
        try:
            info = await asyncio.wait_for(self._reap_now(sandbox, subject_id, trace), DEADLINE_EXIT_WAIT)
        except TimeoutError:
            return None
        except Exception:
            log.exception("destroying worker %s failed", sandbox.worker_id)
            return None
        return exhaustion_kind(info, self.runtime)

    async def _reap_now(self, sandbox: Sandbox | None, subject_id: str, trace: Trace) -> ExitInfo:
        """Destroy and wait (the exit info decides the client text). Cancelled while waiting, the
        reap goes on in the background, which then releases the slot: exactly one release, and only
        once the worker is reaped."""
        assert sandbox is not None
        started = trace.now()
        destroying = asyncio.ensure_future(sandbox.destroy())
        try:
            info = await asyncio.shield(destroying)
        except asyncio.CancelledError:
            self._reap_later(sandbox, subject_id, trace, destroying, started)
            raise
        except Exception:
            self.slots.release(subject_id)
            trace.teardown(started)
            raise
        self.slots.release(subject_id)
        trace.teardown(started)
        return info

    def _reap_later(
        self,
        sandbox: Sandbox,
        subject_id: str,
        trace: Trace,
        destroying: Awaitable[ExitInfo] | None = None,
        started: int | None = None,
    ) -> None:
        """Destroy (or finish ``destroying``) in the background; the slot is released only once the
        worker is reaped, so live workers never exceed ``max_concurrent_executions``."""
        begun = trace.now() if started is None else started

        async def reap() -> None:
            try:
                info = await (destroying if destroying is not None else sandbox.destroy())
                if info.oom_killed:
                    log.info("worker %s was OOM-killed", sandbox.worker_id)
            except Exception:
                log.exception("destroying worker %s failed", sandbox.worker_id)
            finally:
                self.slots.release(subject_id)
                trace.teardown(begun)

        task = asyncio.get_running_loop().create_task(reap())
        self.reaping.add(task)
        task.add_done_callback(self.reaping.discard)

    def run_sync(
        self, cap: CompiledCapability, call: Callable[[], Any]
    ) -> tuple[concurrent.futures.Future[Any], HandOff]:
        """Start a sync handler call on the handlers' pool.

        Args:
            cap: the capability (each has its own hand-off).
            call: the handler call, bound to its arguments.

        Returns:
            The call's future, and the hand-off to wait for it with.
        """
        if self._sync_pool is None:
            self._sync_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.handler_threads, thread_name_prefix="codemode-handler"
            )
        handoff = self._handoffs.get(cap.name)
        if handoff is None:
            handoff = self._handoffs[cap.name] = HandOff(SYNC_HANDLER_BUDGET)
        return self._sync_pool.submit(call), handoff

    async def drain(self) -> None:
        """Wait for every background reap to finish; let the handlers' pool go (a handler still
        running finishes in its thread, unobserved)."""
        while self.reaping:
            await asyncio.gather(*list(self.reaping), return_exceptions=True)
        pool, self._sync_pool = self._sync_pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if self.suspensions is not None:
            await self.suspensions.aclose()  # its expiry sweep


def _store_of(plan: Plan) -> Store:
    """The plan's store of suspensions, or one in this process's memory."""
    store: Store | None = getattr(plan, "store", None)
    if store is None:
        from ..store.memory import MemoryStore

        store = MemoryStore()
    return store


#: Outcomes after which a reusable sandbox may serve the same subject again (see ``Executor._serve``).
_PROGRAM_OUTCOMES: frozenset[ExecuteOutcome] = frozenset(
    {"invalid_program", "invalid_arguments", "permission_denied", "policy_failure", "capability_failed"}
)


def _mark_reusable(sandbox: Sandbox, worker_done: bool) -> None:
    """Tell a reusable sandbox (``codemode.runtimes.reuse.supervised.Lease``) that its execute ended
    cleanly (``worker_done``: with the worker's own last frame, after which it ends by itself; not
    when the host ended it, such as a denied call, while the worker waits for an answer); any other
    sandbox has no such method and is single-use anyway."""
    if isinstance(sandbox, ReusableSandbox):
        sandbox.reusable(worker_done=worker_done)
