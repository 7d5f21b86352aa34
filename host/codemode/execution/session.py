"""One execute's exchange with its sandbox: send the program, serve its native calls (each one
bounded, rebound, authorized, run and recorded), return main's value.

Everything the worker sends is hostile input. The host bounds each frame before reading it, accepts
only the frames the protocol allows at that point, rebinds every argument against its own compiled
shape, authorizes every call with the trusted subject, and checks every size itself. It alone
decides whether a failed call ends the program or (for a call made under ``attempt``) goes back to
it as a value, and what the error text is; it records every call for the audit log and the call
ledger in one place (``Session.observe``). The executor that owns runtime, slots and plan
(``codemode.execution.executor``) opens one session per worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any, Protocol

from codemode_worker import PROTOCOL_VERSION
from codemode_worker.protocol import ProtocolError
from codemode_worker.shapes import BindError, bind_arguments
from codemode_worker.values import ValueLimitError, ValueTypeError, check_value

from ..authz import AskUser, AuthorizationInput, Authorizer, Denied, Subject, run_authorizer
from ..catalog.capability import CompiledCapability
from ..catalog.types import OutputError, constructor, to_plain
from ..common.errors import (
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
)
from ..common.outcomes import RECOVERABLE_OUTCOMES, ledger_outcome
from ..runtimes.base import Sandbox, SandboxClosed
from ..store import StoreFull
from .approval import ApprovalRequest, Approver, render_arguments
from .context import CallContext
from .frames import FrameTooCostly, HostFrameDecoder
from .handlers import HandlerHost, run_handler
from .limits import Limits
from .observe import ApprovalAnswer, CallDecision, CallEvent, CallOutcome, Observer
from .parallel import Exchange, run_batch
from .replay import Entry, Journal, Pending, ReplayDiverged
from .report import PrintsRefused, Report
from .suspension import Resume, Suspensions, defers
from .tracing import Trace
from .worker_text import ArgumentGrammar, accepted_limit_kind, accepted_program_message

__all__ = [
    "FRAME_OVERHEAD",
    "READ_CHUNK",
    "Session",
    "SessionOwner",
    "WorkerGone",
    "WorkerMisbehaved",
    "limit_error",
    "trusted_frame",
]

log = logging.getLogger("codemode.execute")

#: Bytes a worker frame may have beyond ``max_value_bytes`` (its envelope).
FRAME_OVERHEAD = 64 * 1024
#: Bytes read from a worker at a time.
READ_CHUNK = 256 * 1024

_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _json(value: Any) -> str:
    return _ENCODE(value)


def trusted_frame(body: str) -> bytes:
    """Frame a body the host built from values it already checked (no re-validation on the hot
    path; the worker validates every frame it reads).

    Args:
        body: the frame's JSON text.

    Returns:
        The length-prefixed frame.
    """
    data = body.encode("utf-8")
    return struct.pack(">I", len(data)) + data


class SessionOwner(HandlerHost, Protocol):
    """What a session uses of the executor that opened it (``codemode.execution.executor``): the
    plan's catalog, limits, authorizer and observer, the manifest and limits as wire text, the
    suspensions, and the handlers' threads (:class:`~codemode.execution.handlers.HandlerHost`)."""

    by_name: dict[str, CompiledCapability]
    limits: Limits
    limits_json: str
    argument_grammar: ArgumentGrammar
    authorizer: Authorizer
    observer: Observer
    suspensions: Suspensions | None

    def manifest_for(self, source: str) -> str:
        """The manifest JSON the exec frame of ``source`` carries.

        Args:
            source: the program.

        Returns:
            The JSON array text.
        """
        ...

    def store_failed(self, exc: Exception) -> None:
        """Log a store that could not answer.

        Args:
            exc: what it raised.
        """
        ...


class WorkerMisbehaved(Exception):
    """The worker broke the protocol; host-log detail only."""


class WorkerGone(Exception):
    """The worker's output ended before it sent a final frame."""


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


class Session:
    """The exchange with one sandbox: one execute's program, its frames and its native calls.

    Args:
        executor: the executor that opened it (its catalog, limits, authorizer, observer).
        sandbox: the started sandbox the program runs in.
        subject: the trusted subject the execute runs for.
        ctx: the execute's call context (deadline, store, limits).
        report: the execute's ledger and prints.
        trace: the execute's span.
        approver: asks the user about calls the policy leaves to them (None: nobody to ask).
        clock: the execute's deadline, moved on when a resumed run goes live.
        resume: a claimed suspension to replay, or None for a first run.
    """

    def __init__(
        self,
        executor: SessionOwner,
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

    async def _next_frame(self) -> dict[str, Any]:
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
        """Send the program and serve its frames until it ends.

        Args:
            source: the program.

        Returns:
            ``main()``'s plain value, checked against the value limits.

        Raises:
            WorkerGone: the worker's stream ended (or closed) before its final frame.
            WorkerMisbehaved: a frame the protocol does not allow here.
            ReplayDiverged: a resumed program ended before the pending call.
            CodeModeError: the program's error, or a call's that ended it.
        """
        ex = self.ex
        self.source = source
        exec_frame = trusted_frame(
            f'{{"k":"exec","v":{PROTOCOL_VERSION},"source":{_json(source)},'
            f'"manifest":{ex.manifest_for(source)},"limits":{ex.limits_json}}}'
        )
        try:
            await self.sandbox.write(exec_frame)
        except SandboxClosed:
            raise WorkerGone() from None
        while True:
            frame = await self._next_frame()
            kind = frame["k"]
            if kind in _CALL_KINDS:
                if self.pending:
                    # An honest worker waits for each result before it writes again.
                    raise WorkerMisbehaved("frames sent ahead of a native call's result")
                if kind == "native_invalid":
                    await self._native_invalid(frame)
                elif kind == "native_batch":
                    await run_batch(self, frame, _EXCHANGE)
                else:
                    await self._native_call(frame, attempt=kind == "native_attempt")
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
                return self._final_value(frame["value"])
            elif kind == "final_error":
                self.worker_done = True
                raise self._final_error(frame["error"], frame["message"], source)
            else:
                raise WorkerMisbehaved(f"unexpected frame kind {kind!r}")

    def _final_error(self, error: Any, message: Any, source: str) -> CodeModeError:
        """The client-facing error for a ``final_error`` frame: the worker's text only in the exact
        form an honest worker writes (``worker_text``), otherwise the bare coarse text."""
        if error == "invalid_program":
            return InvalidProgram(accepted_program_message(message, source))
        if error == "invalid_arguments":
            return InvalidArguments(self.ex.argument_grammar.accepted(message))
        if error == "resource_limit":
            return limit_error(accepted_limit_kind(message))
        if error == "internal":
            return Internal()
        raise WorkerMisbehaved(f"unknown final_error kind {error!r}")

    def _final_value(self, value: Any) -> Any:
        limits = self.ex.limits
        try:
            check_value(value, limits.max_value_depth, limits.max_value_bytes)
        except ValueLimitError:
            raise ResourceLimit("value size") from None
        except ValueTypeError as exc:
            raise WorkerMisbehaved(f"final value: {exc}") from None
        return value

    def _count_call(self, frame: dict[str, Any]) -> CompiledCapability:
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

    async def _native_invalid(self, frame: dict[str, Any]) -> None:
        """A call the worker's binding rejected: recorded, then the end of the program, or (asked
        under ``attempt``) the host's approved text back to it. The worker's diagnostic passes only
        in the binder's exact grammar (``worker_text``)."""
        started = self.trace.now()
        cap = self._count_call(frame)
        event = _CallRecord(started, decision="invalid_arguments")
        error = InvalidArguments(self.ex.argument_grammar.accepted(frame["message"]))
        self.report.progress.call_started(cap.name)
        if not frame["attempt"]:
            self.observe(cap, event)
            raise error
        await self._reply(frame["seq"], cap, event, error)

    async def _native_call(self, frame: dict[str, Any], attempt: bool) -> None:
        limits = self.ex.limits
        started = self.trace.now()
        cap = self._count_call(frame)
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
                await self._reply(frame["seq"], cap, record, recorded)
                return
            if self.journal.at_pending:
                self._go_live()
            self.asking = Pending(cap.id, text, attempt)
        before = self.intermediate
        try:
            plain = await self._dispatch(cap, canonical, event)
        except CodeModeError as exc:
            if attempt and _recoverable(event):
                await self._reply(frame["seq"], cap, event, exc)
                self._log_call(cap, attempt, event, None, client_text(exc), 0)
                return
            self.observe(cap, event)
            raise
        except BaseException:
            self.observe(cap, event)
            raise
        value = await self._reply(frame["seq"], cap, event, plain)
        self._log_call(cap, attempt, event, value, None, self.intermediate - before)

    def _log_call(
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
        """A ``parallel(...)`` batch (codemode.execution.parallel) against the call log. Each call
        of a batch is a log entry, in list order (made as under ``attempt``).

        Args:
            seq: the batch frame's ``seq``.
            calls: the batch's checked calls.

        Returns:
            True when it was answered from the log (nothing authorized or dispatched); False when
            it runs live.

        Raises:
            WorkerGone: the worker's stream closed before the answer went.
        """
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
                self._go_live()
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
            await self.sandbox.write(trusted_frame(body))
        except SandboxClosed:
            raise WorkerGone() from None
        return True

    def batch_asking(self, index: int) -> None:
        """Note which bound call of the current batch is being authorized (what a suspension
        records as its pending call).

        Args:
            index: the call's place among the batch's bound calls.
        """
        if self.batch is not None:
            cap, args = self.batch[index]
            answers: dict[int, str] = dict(self.journal.batch_answers)
            self.asking = Pending(cap, args, True, self.batch, index, answers)

    def batch_log(self, calls: list[Any]) -> None:
        """Append a batch whose results went back to the program to the call log.

        Args:
            calls: the batch's calls, answered.
        """
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

    def _go_live(self) -> None:
        """The replayed prefix is over (the pending call has come): the program's clock runs on with
        the time it had left when it was suspended."""
        assert self.resume is not None
        _set_replaying(self.report, False)
        remaining = max(0.0, self.ex.limits.max_execution_time - self.resume.spent)
        self.ctx.deadline = time.monotonic() + remaining
        if self.clock is not None:
            self.clock.reschedule(asyncio.get_running_loop().time() + remaining)

    async def _reply(self, seq: int, cap: CompiledCapability, event: _CallRecord, answer: Any) -> str | None:
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
            await self.sandbox.write(trusted_frame(body))
        except SandboxClosed:
            raise WorkerGone() from None
        finally:
            self.observe(cap, event)
        return value

    async def _dispatch(self, cap: CompiledCapability, canonical: dict[str, Any], event: _CallRecord) -> Any:
        """Authorize, run and bound one call; its plain result. ``event`` records how far it got."""
        typed_args = await self.authorize(cap, canonical, event)
        return await self.handle(cap, typed_args, event)

    async def authorize(self, cap: CompiledCapability, canonical: dict[str, Any], event: _CallRecord) -> Any:
        """Authorize one call (asking the user when the policy says so).

        Args:
            cap: the capability called.
            canonical: its arguments, rebound by the host.
            event: the call's record (its decision is set here).

        Returns:
            The typed arguments for the handler.

        Raises:
            PermissionDenied: the policy denied the call, or the user did not accept it.
            PolicyFailure: the authorizer could not decide.
        """
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
            event.approval = await self._ask(cap, canonical, event)
            if event.approval != "accept":
                event.decision = "declined"
                raise PermissionDenied()
            event.decision = "approved"
        else:
            event.decision = "allow"
        return typed_args

    async def handle(self, cap: CompiledCapability, typed_args: Any, event: _CallRecord) -> Any:
        """Run one authorized call's handler and bound its result.

        Args:
            cap: the capability called.
            typed_args: its typed arguments (from :meth:`authorize`).
            event: the call's record (its outcome is set here).

        Returns:
            The handler's result as a plain value.

        Raises:
            CapabilityFailure: the handler failed, or returned a value its type does not allow.
            ResourceLimit: the result is over a value limit.
        """
        limits = self.ex.limits
        event.outcome = "interrupted"  # until the handler has returned or failed
        t1 = time.perf_counter()
        try:
            result = await run_handler(self.ex, cap, self.ctx, self.subject, typed_args)
        except (CapabilityFailure, ResourceLimit, InvalidArguments) as exc:
            # It ran and failed, a budget of its own stopped it, or it refused an argument's value
            # (execution.handlers: only these come out of it): the error's word is the call's outcome.
            event.outcome = exc.outcome
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

    async def _ask(
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
                answer = await self._suspend(cap, canonical)
            except ResourceLimit:  # max_approval_wait or the store's bytes end the execute here
                event.approval = "unanswered"
                raise
        event.approval = answer
        event.approval_seconds = time.perf_counter() - t0
        self.trace.approval(started, answer)
        return answer

    async def _suspend(self, cap: CompiledCapability, canonical: dict[str, Any]) -> ApprovalAnswer:
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
        """Record one call: its ledger entry, its audit event and its span, from the same record.

        Args:
            cap: the capability called.
            event: the call's record.
        """
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


_CALL_KINDS = frozenset({"native_call", "native_attempt", "native_invalid", "native_batch"})


#: What a ``native_batch`` (codemode.execution.parallel) uses of this module.
_EXCHANGE = Exchange(_CallRecord, WorkerMisbehaved, WorkerGone)


def _recoverable(event: _CallRecord) -> bool:
    """Whether a failed call goes back to a program that asked to recover (``attempt``): decided
    by the host's own record of the call, never by the worker."""
    return ledger_outcome(event.decision, event.outcome) in RECOVERABLE_OUTCOMES


def _set_replaying(report: Report, replaying: bool) -> None:
    """Hold back (or let out again) the execute's progress while its recorded prefix replays."""
    progress = getattr(report, "progress", None)
    if progress is not None:
        progress.replaying = replaying


def limit_error(kind: str | None) -> ResourceLimit:
    """The error for a limit the worker or its exit reports: a ``time`` limit (the worker's own
    CPU-seconds limit) is the same ``ExecutionTimeout`` as the host's deadline, whichever fires first.

    Args:
        kind: the limit kind (None: unnamed).

    Returns:
        The error to raise.
    """
    return ExecutionTimeout("time") if kind == "time" else ResourceLimit(kind)
