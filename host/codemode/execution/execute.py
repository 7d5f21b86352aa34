"""One execution: spawn a worker, send the program, serve its native calls, return main's value.

Everything the worker sends is hostile input. The host bounds each frame before reading it, accepts
only the frames the protocol allows at that point, rebinds every argument against its own compiled
shape, authorizes every call with the trusted subject, and checks every size itself. It alone
decides whether a failed call ends the program or (for a call made under ``attempt``) goes back to
it as a value, and what the error text is; it records every call for the audit log and the call
ledger in one place (``_Session.observe``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import importlib.metadata
import inspect
import json
import logging
import os
import re
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from codemode_worker import PROTOCOL_VERSION
from codemode_worker.protocol import ProtocolError, encode_frame, max_print_frames
from codemode_worker.shapes import BindError, bind_arguments
from codemode_worker.values import ValueLimitError, ValueTypeError, check_value

from ..authz import AskUser, AuthorizationInput, Denied, Subject, run_authorizer
from ..catalog.capability import CompiledCapability
from ..catalog.types import OutputError, constructor, to_plain, without_defaults
from ..common.errors import (
    AgentError,
    CapabilityFailure,
    CodeModeError,
    ExecutionTimeout,
    Internal,
    InvalidArguments,
    InvalidProgram,
    PermissionDenied,
    PolicyFailure,
    ResourceLimit,
    client_text,
    sanitize_disclosure,
)
from ..common.handoff import NOT_YET, HandOff
from ..common.outcomes import RECOVERABLE_OUTCOMES, ExecuteResult, ledger_outcome
from ..runtimes.base import ExitInfo, ReusableSandbox, Sandbox, SandboxClosed, Spawned, SubjectSpawner
from ..runtimes.exhaustion import exhaustion_kind
from ..store import Store, StoreFull, StoreUnavailable
from .admission import FairAdmission
from .approval import ApprovalRequest, Approver, render_arguments
from .causes import QUOTA_STORE, Waiting, deadline_passed_waiting
from .context import CallContext
from .frames import FrameTooCostly, HostFrameDecoder
from .observe import (
    ApprovalAnswer,
    CallDecision,
    CallEvent,
    CallOutcome,
    ExecuteEvent,
    ExecuteOutcome,
    Observer,
)
from .parallel import Exchange, SubjectThreads, run_batch
from .plan import Plan
from .quota import Hold, QuotaStore, QuotaUnavailable
from .replay import Entry, Journal, Pending, ReplayDiverged
from .report import PrintsRefused, Report
from .suspension import Resume, Suspended, Suspensions, UnknownSuspension, defers, fingerprint
from .tracing import NULL_TRACE, Trace, Tracer
from .worker_text import ArgumentGrammar, accepted_limit_kind, accepted_program_message

__all__ = [
    "DEADLINE_EXIT_WAIT",
    "FRAME_OVERHEAD",
    "READ_CHUNK",
    "SYNC_HANDLER_BUDGET",
    "Executor",
    "WorkerGone",
    "WorkerMisbehaved",
]

log = logging.getLogger("codemode.execute")

#: Bytes a worker frame may have beyond ``max_value_bytes`` (its envelope).
FRAME_OVERHEAD = 64 * 1024
#: Seconds the event loop's thread may wait for a sync handler before awaiting it (codemode.common.handoff).
SYNC_HANDLER_BUDGET = 0.001
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Bytes read from a worker at a time.
READ_CHUNK = 256 * 1024
#: Seconds a deadline's answer waits for the exit of a worker the runtime already knows is dead (the
#: host had not read the death yet, on a busy machine): one that died of its memory limit is
#: reported as memory, not time. A live worker's deadline is answered at once.
DEADLINE_EXIT_WAIT = 2.0


class WorkerMisbehaved(Exception):
    """The worker broke the protocol; host-log detail only."""


class WorkerGone(Exception):
    """The worker's output ended before it sent a final frame."""


try:
    _HOST_VERSION = importlib.metadata.version("codemode")
except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
    _HOST_VERSION = "unknown"

_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _json(value: Any) -> str:
    return _ENCODE(value)


def _trusted_frame(body: str) -> bytes:
    """Frame a body the host built from values it already checked (no re-validation on the hot
    path; the worker validates every frame it reads)."""
    data = body.encode("utf-8")
    return struct.pack(">I", len(data)) + data


@dataclass
class _CallRecord:
    """One call's audit record: ``decision`` stays ``undecided`` until the authorizer answers,
    ``outcome`` is ``interrupted`` while the handler runs (docs/reference/tools.md#the-call-ledger)."""

    started: int = 0  # the trace clock when the call frame arrived (0: not traced)
    decision: CallDecision = "undecided"
    outcome: CallOutcome = "not_run"
    authz: float = 0.0
    handler: float = 0.0
    approval: ApprovalAnswer = ""
    approval_seconds: float = 0.0


class _Session:
    """The exchange with one sandbox."""

    def __init__(
        self,
        executor: Executor,
        sandbox: Sandbox,
        subject: Subject,
        ctx: CallContext,
        report: Report,
        trace: Trace,
        approver: Approver | None = None,
        clock: asyncio.Timeout | None = None,
        resume: Resume | None = None,
    ) -> None:
        self.ex = executor
        self.sandbox = sandbox
        self.subject = subject
        self.ctx = ctx
        self.report = report
        self.trace = trace
        self.approver = approver
        self.clock = clock  # the execute's deadline: paused while the user is asked
        #: The worker sent its last frame (``final`` or ``final_error``): it ends by itself now.
        self.worker_done = False
        limits = executor.limits
        # Bytes capped before buffering, decoded host memory capped before parsing (execution.frames).
        self.decoder = HostFrameDecoder(limits.max_value_bytes + FRAME_OVERHEAD)
        self.pending: list[dict[str, Any]] = []
        self.calls = 0
        self.intermediate = 0
        # The call log (codemode.execution.replay): kept only where a question can be asked; a
        # resumed run replays its recorded prefix first (execution.suspension).
        self.resume = resume
        self.journal = resume.journal if resume is not None else Journal()
        self.journaling = approver is not None and executor.suspensions is not None
        self.asking: Pending | None = None  # the call being decided, as a suspension records it
        self.batch: tuple[tuple[str, str], ...] | None = None  # the batch being served, journaled
        self.source = ""
        if resume is not None:  # nothing of the replayed prefix goes out as progress
            _set_replaying(report, True)

    async def next_frame(self) -> dict[str, Any]:
        while not self.pending:
            data = await self.sandbox.read(READ_CHUNK)
            if not data:
                raise WorkerGone()
            try:
                self.pending.extend(self.decoder.feed(data))
            except FrameTooCostly:
                raise ResourceLimit("value size") from None
            except ProtocolError as exc:
                raise WorkerMisbehaved(f"protocol error: {exc}") from None
        return self.pending.pop(0)

    async def run(self, source: str) -> Any:
        ex = self.ex
        self.source = source
        exec_frame = _trusted_frame(
            f'{{"k":"exec","v":{PROTOCOL_VERSION},"source":{_json(source)},'
            f'"manifest":{ex.manifest_for(source)},"limits":{ex.limits_json}}}'
        )
        try:
            await self.sandbox.write(exec_frame)
        except SandboxClosed:
            raise WorkerGone() from None
        while True:
            frame = await self.next_frame()
            kind = frame["k"]
            if kind in _CALL_KINDS:
                if self.pending:
                    # An honest worker waits for each result before it writes again.
                    raise WorkerMisbehaved("frames sent ahead of a native call's result")
                if kind == "native_invalid":
                    await self.native_invalid(frame)
                elif kind == "native_batch":
                    await run_batch(self, frame, _EXCHANGE)
                else:
                    await self.native_call(frame, attempt=kind == "native_attempt")
                # A worker whose next frame is already buffered (the runtimes' readers return buffered
                # bytes without suspending) must not keep the loop to itself from call to call.
                await asyncio.sleep(0)
            elif kind == "print":
                try:
                    self.report.add_print(frame["text"], frame["cut"])
                except PrintsRefused as exc:
                    raise WorkerMisbehaved(str(exc)) from None
            elif kind == "final":
                self.worker_done = True
                if self.resume is not None and self.journal.replaying:
                    # an honest resumed program reaches the pending call: one that ends first diverged
                    raise ReplayDiverged("the program ended before the pending call")
                return self.final_value(frame["value"])
            elif kind == "final_error":
                self.worker_done = True
                raise self.final_error(frame["error"], frame["message"], source)
            else:
                raise WorkerMisbehaved(f"unexpected frame kind {kind!r}")

    def final_error(self, error: Any, message: Any, source: str) -> CodeModeError:
        """The client-facing error for a ``final_error`` frame: the worker's text only in the exact
        form an honest worker writes (``worker_text``), otherwise the bare coarse text."""
        if error == "invalid_program":
            return InvalidProgram(accepted_program_message(message, source))
        if error == "invalid_arguments":
            return InvalidArguments(self.ex.argument_grammar.accepted(message))
        if error == "resource_limit":
            return _limit_error(accepted_limit_kind(message))
        if error == "internal":
            return Internal()
        raise WorkerMisbehaved(f"unknown final_error kind {error!r}")

    def final_value(self, value: Any) -> Any:
        limits = self.ex.limits
        try:
            check_value(value, limits.max_value_depth, limits.max_value_bytes)
        except ValueLimitError:
            raise ResourceLimit("value size") from None
        except ValueTypeError as exc:
            raise WorkerMisbehaved(f"final value: {exc}") from None
        return value

    def count_call(self, frame: dict[str, Any]) -> CompiledCapability:
        """Count one call frame against the limit (every kind: the limit counts attempts); the
        enabled capability it names."""
        self.calls += 1
        if frame["seq"] != self.calls:
            raise WorkerMisbehaved(f"{frame['k']} seq {frame['seq']!r}, expected {self.calls}")
        if self.calls > self.ex.limits.max_native_calls:
            raise ResourceLimit("native calls")
        cap = self.ex.by_name.get(frame["name"])
        if cap is None:
            raise WorkerMisbehaved(f"{frame['k']} for a capability that is not enabled")
        return cap

    async def native_invalid(self, frame: dict[str, Any]) -> None:
        """A call the worker's binding rejected: recorded, then the end of the program, or (asked
        under ``attempt``) the host's approved text back to it. The worker's diagnostic passes only
        in the binder's exact grammar (``worker_text``)."""
        started = self.trace.now()
        cap = self.count_call(frame)
        event = _CallRecord(started, decision="invalid_arguments")
        error = InvalidArguments(self.ex.argument_grammar.accepted(frame["message"]))
        self.report.progress.call_started(cap.name)
        if not frame["attempt"]:
            self.observe(cap, event)
            raise error
        await self.reply(frame["seq"], cap, event, error)

    async def native_call(self, frame: dict[str, Any], attempt: bool) -> None:
        limits = self.ex.limits
        started = self.trace.now()
        cap = self.count_call(frame)
        args = frame["args"]
        if not isinstance(args, dict):
            raise WorkerMisbehaved("native_call args is not an object")
        try:
            # Depth counts each argument value (the keyword map itself is not a value).
            check_value(args, limits.max_value_depth + 1, limits.max_value_bytes)
        except ValueLimitError:
            raise ResourceLimit("value size") from None
        except ValueTypeError as exc:
            raise WorkerMisbehaved(f"native_call args: {exc}") from None
        try:
            canonical = bind_arguments(cap.input_shape, args)
        except BindError as exc:
            # An honest worker binds first, so a failing rebind proves a misbehaving worker.
            raise WorkerMisbehaved(f"rebind failed: {exc}") from None
        event = _CallRecord(started)
        if self.journaling or self.resume is not None:
            text = _json(canonical)
            try:
                recorded = self.journal.replay(cap.id, text, attempt)
            except ReplayDiverged:
                self.observe(cap, _CallRecord(started, decision="diverged"))
                raise
            if recorded is not None:  # the recorded answer: nothing is dispatched
                self.intermediate += recorded.size
                record = _CallRecord(started, decision=recorded.decision, outcome=recorded.outcome)
                await self.reply(frame["seq"], cap, record, recorded)
                return
            if self.journal.at_pending:
                self.go_live()
            self.asking = Pending(cap.id, text, attempt)
        before = self.intermediate
        try:
            plain = await self.dispatch(cap, canonical, event)
        except CodeModeError as exc:
            if attempt and _recoverable(event):
                await self.reply(frame["seq"], cap, event, exc)
                self.log_call(cap, attempt, event, None, client_text(exc), 0)
                return
            self.observe(cap, event)
            raise
        except BaseException:
            self.observe(cap, event)
            raise
        value = await self.reply(frame["seq"], cap, event, plain)
        self.log_call(cap, attempt, event, value, None, self.intermediate - before)

    def log_call(
        self,
        cap: CompiledCapability,
        attempt: bool,
        event: _CallRecord,
        value: str | None,
        error: str | None,
        size: int,
    ) -> None:
        """Append a live call whose answer went back to the program to the call log."""
        if self.asking is not None:
            args, self.asking = self.asking.arguments, None
            entry = Entry(cap.id, args, attempt, value, error, size, cap.name, event.decision, event.outcome)
            self.journal.record(entry)

    async def batch_replayed(self, seq: int, calls: list[Any]) -> bool:
        """A ``parallel(...)`` batch (codemode.execution.parallel) against the call log: True when
        it was answered from the log (nothing authorized or dispatched); False when it runs live.
        Each call of a batch is a log entry, in list order (made as under ``attempt``)."""
        self.batch = None
        if not (self.journaling or self.resume is not None):
            return False
        bound = [c for c in calls if c.canonical is not None]
        self.batch = tuple((c.cap.id, _json(c.canonical)) for c in bound)
        try:
            recorded = self.journal.replay_batch(list(self.batch))
        except ReplayDiverged:
            for c in bound:
                c.event.decision = "diverged"
            raise
        if recorded is None:
            if self.journal.at_pending:
                self.journal.at_pending = False
                self.go_live()
            return False
        answers = iter(recorded)
        parts = []
        for c in calls:
            if c.canonical is None:  # the worker's binding refused it: the host's text again
                parts.append(f'{{"ok":false,"error":{_json(client_text(c.answer))}}}')
                continue
            entry = next(answers)
            c.event.decision, c.event.outcome = entry.decision, entry.outcome
            self.intermediate += entry.size
            if entry.value is None:
                parts.append(f'{{"ok":false,"error":{_json(entry.error)}}}')
            else:
                parts.append(f'{{"ok":true,"value":{entry.value}}}')
        body = f'{{"k":"native_batch_result","seq":{seq},"results":[{",".join(parts)}]}}'
        try:
            await self.sandbox.write(_trusted_frame(body))
        except SandboxClosed:
            raise WorkerGone() from None
        return True

    def batch_asking(self, index: int) -> None:
        """The ``index``-th bound call of the current batch is being authorized (what a suspension
        records as its pending call)."""
        if self.batch is not None:
            cap, args = self.batch[index]
            answers: dict[int, str] = dict(self.journal.batch_answers)
            self.asking = Pending(cap, args, True, self.batch, index, answers)

    def batch_log(self, calls: list[Any]) -> None:
        """Append a batch whose results went back to the program to the call log."""
        self.asking = None
        if self.batch is None:
            return
        for c in calls:
            if c.canonical is None:
                continue
            cap, event = c.cap, c.event
            if isinstance(c.answer, CodeModeError):
                value, error, size = None, client_text(c.answer), 0
            else:
                value = _json(c.answer)
                error, size = None, len(value.encode("utf-8"))
            args = _json(c.canonical)
            entry = Entry(cap.id, args, True, value, error, size, cap.name, event.decision, event.outcome)
            self.journal.record(entry)
        self.batch = None

    def go_live(self) -> None:
        """The replayed prefix is over (the pending call has come): the program's clock runs on with
        the time it had left when it was suspended."""
        assert self.resume is not None
        _set_replaying(self.report, False)
        remaining = max(0.0, self.ex.limits.max_execution_time - self.resume.spent)
        self.ctx.deadline = time.monotonic() + remaining
        if self.clock is not None:
            self.clock.reschedule(asyncio.get_running_loop().time() + remaining)

    async def reply(self, seq: int, cap: CompiledCapability, event: _CallRecord, answer: Any) -> str | None:
        """Write the call's ``native_result`` (or, for a recoverable error, ``native_error`` with its
        client text; or a replayed :class:`Entry`'s recorded answer), then record the call: the
        worker need not wait for the audit. The result's JSON text (None for an error)."""
        value: str | None = None
        if isinstance(answer, Entry):
            value = answer.value
            if value is None:
                body = f'{{"k":"native_error","seq":{seq},"error":{_json(answer.error)}}}'
            else:
                body = f'{{"k":"native_result","seq":{seq},"value":{value}}}'
        elif isinstance(answer, CodeModeError):
            body = f'{{"k":"native_error","seq":{seq},"error":{_json(client_text(answer))}}}'
        else:
            value = _json(answer)
            body = f'{{"k":"native_result","seq":{seq},"value":{value}}}'
        try:
            await self.sandbox.write(_trusted_frame(body))
        except SandboxClosed:
            raise WorkerGone() from None
        finally:
            self.observe(cap, event)
        return value

    async def dispatch(self, cap: CompiledCapability, canonical: dict[str, Any], event: _CallRecord) -> Any:
        """Authorize, run and bound one call; its plain result. ``event`` records how far it got."""
        typed_args = await self.authorize(cap, canonical, event)
        return await self.handle(cap, typed_args, event)

    async def authorize(self, cap: CompiledCapability, canonical: dict[str, Any], event: _CallRecord) -> Any:
        """Authorize one call (asking the user when the policy says so); its typed arguments.
        Raises the call's error when it may not run."""
        self.report.progress.call_started(cap.name)  # the ledger will hold it, whatever happens now
        t0 = time.perf_counter()
        typed_args = constructor(cap.input_type)(canonical) if cap.input_type is not None else None
        asked = False
        try:
            await run_authorizer(
                self.ex.authorizer,
                self.ctx,
                AuthorizationInput(self.subject, cap.id, cap.name, canonical),
            )
        except AskUser:
            asked = True
        except Denied:
            event.decision = "deny"
            raise PermissionDenied() from None
        except PermissionDenied:
            event.decision = "deny"
            raise
        except PolicyFailure:
            event.decision = "policy_failure"
            raise
        except (asyncio.CancelledError, CodeModeError):
            raise
        except Exception as exc:
            event.decision = "policy_failure"
            log.warning("authorizer failed for %s: %s", cap.id, type(exc).__name__)
            raise PolicyFailure() from None
        finally:
            event.authz = time.perf_counter() - t0
        if asked or self.journal.has_answer(self.asking):  # resumed: the user's answer decides
            event.decision = "ask"
            event.approval = await self.ask(cap, canonical, event)
            if event.approval != "accept":
                event.decision = "declined"
                raise PermissionDenied()
            event.decision = "approved"
        else:
            event.decision = "allow"
        return typed_args

    async def handle(self, cap: CompiledCapability, typed_args: Any, event: _CallRecord) -> Any:
        """Run one authorized call's handler and bound its result; its plain result."""
        limits = self.ex.limits
        event.outcome = "interrupted"  # until the handler has returned or failed
        t1 = time.perf_counter()
        try:
            result = await self.run_handler(cap, typed_args)
        except CapabilityFailure:
            event.outcome = "capability_failed"
            raise
        except ResourceLimit:  # the handler's own budget (_handler_failed): it ran, a limit stopped it
            event.outcome = "resource_limit"
            raise
        except InvalidArguments:  # the handler refused an argument's value (approved form only)
            event.outcome = "invalid_arguments"
            raise
        finally:
            event.handler = time.perf_counter() - t1
        try:
            plain = to_plain(cap.output_shape, result)
        except OutputError as exc:
            event.outcome = "capability_failed"
            log.warning("handler %s returned an unusable value: %s", cap.id, exc)
            raise CapabilityFailure() from None
        # The handler has returned: whatever happens now, it ran (a limit is not an interruption).
        event.outcome = "resource_limit"
        try:
            size = check_value(plain, limits.max_value_depth, limits.max_value_bytes)
        except ValueLimitError:
            raise ResourceLimit("value size") from None
        self.intermediate += size
        if self.intermediate > limits.max_intermediate_value_bytes:
            raise ResourceLimit("intermediate bytes")
        event.outcome = "ok"
        return plain

    async def ask(
        self, cap: CompiledCapability, canonical: dict[str, Any], event: _CallRecord
    ) -> ApprovalAnswer:
        """The user's answer about one call the policy left to them.

        Nothing waits here (codemode.execution.suspension): the first time, the execute writes its
        suspension record and ends (:class:`Suspended`: the worker, the sandbox and the slot go);
        resumed by the answer, the replayed program reaches the same call again and gets that
        answer. A refusal word without asking when nobody can be asked (``unavailable``: no
        approver, or the store cannot answer) or the subject has ``max_pending_approvals``
        suspensions (``busy``)."""
        started, t0 = self.trace.now(), time.perf_counter()
        answer = self.journal.answer_for(self.asking)
        resume = self.resume
        if answer is not None and resume is not None and resume.waited >= self.ex.limits.max_approval_wait:
            event.approval = "unanswered"
            raise ResourceLimit("approval wait")  # the call stays "ask": the wait ended the execute
        if answer is None:
            try:
                answer = await self.suspend(cap, canonical)
            except ResourceLimit:  # max_approval_wait or the store's bytes end the execute here
                event.approval = "unanswered"
                raise
        event.approval = answer
        event.approval_seconds = time.perf_counter() - t0
        self.trace.approval(started, answer)
        return answer

    async def suspend(self, cap: CompiledCapability, canonical: dict[str, Any]) -> ApprovalAnswer:
        """Write this execute's suspension and raise :class:`Suspended`; or the refusal word when
        it cannot be suspended."""
        suspensions = self.ex.suspensions
        if self.approver is None or suspensions is None or self.asking is None:
            return "unavailable"
        if not getattr(self.approver, "available", True):  # a client that cannot be asked at all
            return "unavailable"
        shown = render_arguments(canonical)
        request = ApprovalRequest(cap.name, cap.summary, shown.text, shown.hidden)
        limits = self.ex.limits
        spent = limits.max_execution_time - max(0.0, self.ctx.deadline - time.monotonic())
        waited = self.resume.waited if self.resume is not None else 0.0
        try:
            suspended = await suspensions.suspend(
                self.subject.id,
                self.source,
                self.journal,
                self.asking,
                request,
                spent,
                waited,
                in_place=not defers(self.approver),
            )
        except StoreFull:
            return "busy"
        except (ResourceLimit, asyncio.CancelledError):
            raise
        except Exception as exc:  # StoreUnavailable, or a store that failed otherwise: fail closed
            self.ex.store_failed(exc)
            return "unavailable"
        raise suspended

    def observe(self, cap: CompiledCapability, event: _CallRecord) -> None:
        """Record one call: its ledger entry, its audit event and its span, from the same record."""
        self.report.record(cap.name, event.decision, event.outcome)
        self.trace.native_call(
            event.started, cap.id, cap.name, event.decision, event.outcome, event.authz, event.handler
        )
        self.ex.observer.native_call(
            CallEvent(
                subject_id=self.subject.id,
                capability_id=cap.id,
                decision=event.decision,
                outcome=event.outcome,
                authz_seconds=event.authz,
                handler_seconds=event.handler,
                worker_id=self.sandbox.worker_id,
                capability=cap.name,
                approval=event.approval,
                approval_seconds=event.approval_seconds,
            )
        )

    async def run_handler(self, cap: CompiledCapability, typed_args: Any) -> Any:
        handler = cap.handler
        call_args: tuple[Any, ...] = (self.ctx, self.subject)
        if cap.input_type is not None:
            call_args += (typed_args,)
        if self.ex.is_async(cap):
            # Its own task, always: task-bound constructs inside the handler (asyncio.timeout, anyio
            # cancel scopes such as an MCP client's read timeout) must stay with the task they were
            # entered in. The execute waits on its own future, which the handler's task settles as
            # its last step (one loop pass, no asyncio.wait): so a handler that swallows the
            # execute's cancellation cannot hold the call past its deadline.
            loop = asyncio.get_running_loop()
            outcome: asyncio.Future[Any] = loop.create_future()
            task = loop.create_task(_settle(handler(*call_args), outcome))
            try:
                return await outcome
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if not outcome.cancelled() and not (current is not None and current.cancelling()):
                    raise CapabilityFailure() from None  # the handler raised it itself
                if outcome.done() and not outcome.cancelled():
                    outcome.exception()  # settled just before the cancellation: seen, dropped
                task.cancel()
                _DETACHED.add(task)
                task.add_done_callback(_detached_done)
                raise
            except Exception as exc:
                _handler_failed(cap, exc)
        # A sync handler runs on the handlers' pool, in a copy of the context. Its result is first
        # waited for on the loop's thread, briefly (codemode.common.handoff: no trip through the loop for a
        # short handler), then awaited: cancelling the call cancels it (a handler already running in
        # its thread finishes there, unobserved).
        call = functools.partial(contextvars.copy_context().run, handler, *call_args)
        try:
            # The subject's share of the threads, held until the handler has finished in its thread.
            release = await self.ex.thread_shares.take(self.subject.id)
            try:
                job, handoff = self.ex.run_sync(cap, call)
            except BaseException:
                release()
                raise
            job.add_done_callback(_on_loop(asyncio.get_running_loop(), release))
            result = handoff.block(job, self.ctx.deadline)
            if result is NOT_YET:
                result = await asyncio.wrap_future(job)
            return result
        except asyncio.CancelledError:
            _reraise_if_cancelled()
            raise CapabilityFailure() from None
        except concurrent.futures.CancelledError:
            raise CapabilityFailure() from None  # the handlers' pool shut down (server closing)
        except Exception as exc:
            _handler_failed(cap, exc)


def _on_loop(loop: asyncio.AbstractEventLoop, release: Callable[[], None]) -> Callable[[Any], None]:
    """A pool job's done callback that calls ``release`` on ``loop``'s thread (not at all once the
    loop is closed: its semaphores went with it)."""

    def done(_job: Any) -> None:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(release)

    return done


async def _settle(handler: Awaitable[Any], outcome: asyncio.Future[Any]) -> None:
    """Run an async handler in its own task and settle ``outcome`` with its result or exception
    (unless the caller has given up on it). A handler that raises ``CancelledError`` by itself
    settles ``outcome`` with it; the task then ends normally."""
    try:
        value = await handler
    except asyncio.CancelledError as exc:
        if outcome.done():  # the caller cancelled: this task is being cancelled too
            raise
        outcome.set_exception(exc)
        return
    except Exception as exc:
        if not outcome.done():
            outcome.set_exception(exc)
        return
    except BaseException as exc:  # not an Exception: the call fails with it all the same
        if not outcome.done():
            outcome.set_exception(exc)
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return
    if not outcome.done():
        outcome.set_result(value)


_CALL_KINDS = frozenset({"native_call", "native_attempt", "native_invalid", "native_batch"})


#: What a ``native_batch`` (codemode.execution.parallel) uses of this module.
_EXCHANGE = Exchange(_CallRecord, WorkerMisbehaved, WorkerGone)


def _recoverable(event: _CallRecord) -> bool:
    """Whether a failed call goes back to a program that asked to recover (``attempt``): decided
    by the host's own record of the call, never by the worker."""
    return ledger_outcome(event.decision, event.outcome) in RECOVERABLE_OUTCOMES


def _reraise_if_cancelled() -> None:
    """Re-raise the CancelledError being handled if this task is being cancelled (deadline, client):
    otherwise the handler raised it itself, which is a failure of the handler."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise


#: A handler's refusal of an argument's value names that argument first (docs/reference/errors.md).
_REFUSED_ARGUMENT = re.compile(r'argument "([A-Za-z_][A-Za-z0-9_]{0,63})" \S')


def _refused_argument(cap: CompiledCapability, exc: InvalidArguments) -> InvalidArguments:
    """``invalid capability arguments: <diagnostic>`` for a handler that refused a value its type
    cannot rule out (``argument "<name>" ...``, ``<name>`` one of the capability's arguments);
    any other detail gives the bare text."""
    detail = sanitize_disclosure(exc.detail) if isinstance(exc.detail, str) else ""
    match = _REFUSED_ARGUMENT.match(detail)
    names = {f["name"] for f in cap.input_shape.get("fields", ())}
    if match is None or match[1] not in names:
        log.warning("handler %s refused its arguments with a diagnostic of another form", cap.id)
        return InvalidArguments()
    return InvalidArguments(detail)


def _handler_failed(cap: CompiledCapability, exc: Exception) -> NoReturn:
    if isinstance(exc, ResourceLimit):  # a budget of the handler's own, named by a fixed kind
        raise ResourceLimit(exc.kind) from None
    if isinstance(exc, StoreFull):  # a per-subject bound of the store (the state pack's keys, bytes)
        raise ResourceLimit(exc.kind) from None
    if isinstance(exc, StoreUnavailable):  # the host's own failure: the why is for its log only
        log.error("handler %s: the store could not answer: %s", cap.id, exc)
        raise Internal() from None
    if isinstance(exc, AgentError):
        raise CapabilityFailure(sanitize_disclosure(str(exc.message))) from None
    if isinstance(exc, InvalidArguments):
        raise _refused_argument(cap, exc) from None
    log.warning("handler %s raised %s", cap.id, type(exc).__name__)
    raise CapabilityFailure() from None


#: Handlers still running after their execute gave up on them (strong references: the event loop
#: keeps only weak ones).
_DETACHED: set[asyncio.Task[Any]] = set()


def _detached_done(task: asyncio.Task[Any]) -> None:
    _DETACHED.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: the execute that called it has ended


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
            self.observer.execute(ExecuteEvent(subject_id, "internal", 0.0, 0, "", cause=QUOTA_STORE))
            trace.finish("internal", None, 0, "")
            raise Internal() from None
        if self._quota_down:
            self._quota_down = False
            log.warning("quota store %r answers again", self.quota.name)
        if hold is None:
            self.observer.execute(ExecuteEvent(subject_id, "resource_limit", 0.0, 0, "", cause="quota"))
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
        start = time.monotonic()
        # A resumed run's replay (a fresh worker's start and the recorded prefix) has its own bound,
        # twice max_execution_time; the program's own clock goes on at the pending call (go_live).
        deadline = start + self.limits.max_execution_time * (2 if resume is not None else 1)
        ctx = CallContext(deadline=deadline, store=self.store, limits=self.limits)
        outcome: ExecuteOutcome = "internal"
        limit: str | None = None
        cause = ""  # for the operator (ExecuteEvent.cause): which wait a deadline passed in
        waiting: Waiting = "slot"
        calls = 0
        worker_id = ""
        oom = False
        try:
            if not isinstance(source, str) or _LONE_SURROGATE.search(source):
                raise InvalidProgram()
            if len(source.encode("utf-8")) > self.limits.max_source_bytes:
                raise ResourceLimit("source size")
            loop = asyncio.get_running_loop()
            sandbox: Sandbox | None = None
            session: _Session | None = None
            reusable = False
            try:
                async with asyncio.timeout_at(loop.time() + (deadline - time.monotonic())) as clock:
                    await self._admit(subject.id, trace, hold.elsewhere if hold is not None else 0)
                    waiting = "worker"
                    sandbox = await self._acquire(subject.id, trace)
                    worker_id = ctx.worker_id = sandbox.worker_id
                    session = _Session(self, sandbox, subject, ctx, report, trace, approver, clock, resume)
                    value = await session.run(source)
                    reusable = True
            except TimeoutError:
                if sandbox is None:
                    # Still waiting for a slot, or for its worker to start: the log says which.
                    cause = deadline_passed_waiting(waiting, self.limits.max_execution_time, self.slots)
                    raise ExecutionTimeout("concurrency") from None
                late, sandbox = sandbox, None  # from here on the reap alone owns worker and slot
                if await self._limit_at_deadline(late, subject.id, trace) == "memory":
                    raise ResourceLimit("memory") from None
                raise ExecutionTimeout("time") from None
            except WorkerGone:
                gone, sandbox = sandbox, None  # from here on _reap_now alone owns worker and slot
                info = await self._reap_now(gone, subject.id, trace)
                oom = info.oom_killed
                kind = exhaustion_kind(info, self.runtime)
                if kind is not None:
                    if kind == "memory" and not oom:
                        log.info("worker %s ran out of memory: %s", worker_id, info)
                    raise _limit_error(kind) from None
                if info.lost:
                    log.warning(
                        "worker %s lost mid-execute: its stream broke while it was still running"
                        " (its node lost or unreachable); how it ended is unknown (the runtime's"
                        " log says what it found)",
                        worker_id,
                    )
                else:
                    log.warning("worker %s ended without a result: %s", worker_id, info)
                raise Internal() from None
            except WorkerMisbehaved as exc:
                log.warning("worker %s misbehaved: %s", worker_id, exc)
                raise Internal() from None
            except ReplayDiverged as exc:
                log.warning("replay diverged in worker %s (%s): the execute fails closed", worker_id, exc)
                raise Internal() from None
            except Suspended:
                raise
            except CodeModeError as exc:
                # The program's own outcome (not a limit, not the host's fault): the worker ended
                # or waits at a frame boundary, so a reusable sandbox may serve this subject again.
                reusable = isinstance(exc, _PROGRAM_OUTCOMES)
                raise
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("execute failed in the host: %s", type(exc).__name__)
                raise Internal() from None
            finally:
                ctx.cancelled.set()
                if session is not None:
                    calls = session.calls
                if sandbox is not None:
                    if reusable:
                        _mark_reusable(sandbox, session is not None and session.worker_done)
                    self._reap_later(sandbox, subject.id, trace)
            outcome = "ok"
            return value
        except CodeModeError as exc:
            outcome = _outcome_name(exc)
            if isinstance(exc, ResourceLimit):
                limit = exc.kind
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Suspended:
            outcome = "suspended"
            raise
        finally:
            self.observer.execute(
                ExecuteEvent(
                    subject_id=subject.id,
                    outcome=outcome,
                    seconds=time.monotonic() - start,
                    native_calls=calls,
                    worker_id=worker_id,
                    oom_killed=oom,
                    cause=cause or (limit or ""),
                )
            )
            trace.finish(outcome, limit, calls, worker_id)

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


def _set_replaying(report: Report, replaying: bool) -> None:
    """Hold back (or let out again) the execute's progress while its recorded prefix replays."""
    progress = getattr(report, "progress", None)
    if progress is not None:
        progress.replaying = replaying


def _store_of(plan: Plan) -> Store:
    """The plan's store of suspensions, or one in this process's memory."""
    store: Store | None = getattr(plan, "store", None)
    if store is None:
        from ..store.memory import MemoryStore

        store = MemoryStore()
    return store


#: Outcomes after which a reusable sandbox may serve the same subject again (see ``_execute``).
_PROGRAM_OUTCOMES = (InvalidProgram, InvalidArguments, PermissionDenied, PolicyFailure, CapabilityFailure)


def _limit_error(kind: str | None) -> ResourceLimit:
    """The error for a limit the worker or its exit reports: a ``time`` limit (the worker's own
    CPU-seconds limit) is the same ``ExecutionTimeout`` as the host's deadline, whichever fires first.

    Args:
        kind: the limit kind (None: unnamed).

    Returns:
        The error to raise.
    """
    return ExecutionTimeout("time") if kind == "time" else ResourceLimit(kind)


def _mark_reusable(sandbox: Sandbox, worker_done: bool) -> None:
    """Tell a reusable sandbox (``codemode.runtimes.supervised.Lease``) that its execute ended
    cleanly (``worker_done``: with the worker's own last frame, after which it ends by itself; not
    when the host ended it, such as a denied call, while the worker waits for an answer); any other
    sandbox has no such method and is single-use anyway."""
    if isinstance(sandbox, ReusableSandbox):
        sandbox.reusable(worker_done=worker_done)


def _outcome_name(exc: CodeModeError) -> ExecuteOutcome:
    names: dict[str, ExecuteOutcome] = {
        "unauthenticated": "unauthenticated",
        "capability not found": "not_found",
        "invalid program": "invalid_program",
        "invalid capability arguments": "invalid_arguments",
        "permission denied": "permission_denied",
        "authorization policy failure": "policy_failure",
        "resource limit exceeded": "resource_limit",
        "capability failed": "capability_failed",
    }
    return names.get(exc.text, "internal")
