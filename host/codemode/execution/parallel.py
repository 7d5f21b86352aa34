"""The host's side of ``parallel(...)``: one ``native_batch`` frame, its calls run at once
(docs/reference/program.md#parallel-calls).

Each call of a batch passes the pipeline of a single call, on its own, in three phases:

1. **Check** the whole frame as hostile input before anything is authorized: its ``seq`` is the
   next call's; its calls fit what is left of ``max_native_calls``; each names an enabled
   capability; each argument map is within ``max_value_depth``, and all of them together within
   ``max_value_bytes`` (as the worker checks); each binds again against the host's own shape. A
   failure here ends the execute and nothing is authorized, run or recorded (as for one call).
2. **Authorize** every call, in list order, before any of them runs; a call the policy leaves to the
   user is asked about on its own, in that order. A denied or declined call becomes its element's
   error; a policy failure or a limit (``approval wait``) ends the execute before any call runs.
3. **Run** the authorized calls at once: at most ``max_parallel_calls`` at a time, and the sync
   handlers of one subject (all its executes and calls together, single or batched, and those its
   deadline gave up on until they finish in their threads: :class:`SubjectThreads`) on at most half
   the host's handler threads (at least one), the last free one kept for a subject holding none, so
   no tenant (nor two) can hold every thread while other tenants wait. A call
   whose failure ``attempt`` would catch (capability failed, a handler's refusal of an argument)
   stays in its element. Every other failure
   (a limit, an internal failure, the deadline) ends the execute: the calls still running are
   cancelled (a sync handler already in its thread finishes there, unobserved) and no result goes
   back to the program.

The results go back in one ``native_batch_result`` frame, one ``{ok, value}`` or ``{ok, error}`` per
call, the whole list bounded by ``max_value_bytes`` like one result. Every call of the batch is then
recorded, in list order, whatever happened (``session.Session.observe``): the ledger and the audit log list
the batch as its calls, a call the execute never reached as ``not run``.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from codemode_worker.shapes import BindError, bind_arguments
from codemode_worker.values import ValueLimitError, ValueTypeError, check_value

from ..catalog.capability import CompiledCapability
from ..common.errors import CodeModeError, InvalidArguments, ResourceLimit, client_text
from ..common.outcomes import RECOVERABLE_OUTCOMES, ledger_outcome
from ..runtimes.base import SandboxClosed

__all__ = ["Exchange", "SubjectThreads", "handler_share", "run_batch"]

_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


class _Session(Protocol):
    """What a batch needs of the exchange with one worker (``session.Session``): its executor
    (``by_name``, ``limits``, ``argument_grammar``, ``is_async``, ``handler_threads``), the subject,
    the call count,
    the trace, the sandbox, and the single call's pipeline split in two (authorize, then handle)."""

    ex: Any
    subject: Any
    calls: int
    trace: Any
    sandbox: Any

    async def authorize(self, cap: CompiledCapability, canonical: dict[str, Any], event: Any) -> Any: ...

    async def handle(self, cap: CompiledCapability, typed_args: Any, event: Any) -> Any: ...

    def observe(self, cap: CompiledCapability, event: Any) -> None: ...

    async def batch_replayed(self, seq: int, calls: list[Any]) -> bool: ...

    def batch_asking(self, index: int) -> None: ...

    def batch_log(self, calls: list[Any]) -> None: ...


@dataclass(frozen=True)
class Exchange:
    """The pipeline's own types a batch uses (passed in: this module builds on ``session``, which
    imports it).

    Args:
        record: makes one call's audit record (``started``, ``decision=``).
        misbehaved: the exception for a protocol violation by the worker.
        gone: the exception for a worker whose stream closed.
    """

    record: Callable[..., Any]
    misbehaved: type[Exception]
    gone: type[Exception]


def _recoverable(event: Any) -> bool:
    """Whether a failed call's error stays in its element (what ``attempt`` recovers from)."""
    return ledger_outcome(event.decision, event.outcome) in RECOVERABLE_OUTCOMES


def handler_share(handler_threads: int, max_parallel_calls: int) -> int:
    """The sync handlers one ``parallel(...)`` batch may run at once: its subject's share of the
    handler threads (:class:`SubjectThreads`: half the pool, at least 1, all the subject's executes
    and calls together), and never more than ``max_parallel_calls``.

    Args:
        handler_threads: threads of the host's handler pool.
        max_parallel_calls: the bound on one batch's calls running at once.

    Returns:
        Half the pool (at least 1), and never more than ``max_parallel_calls``.
    """
    return max(1, min(max_parallel_calls, handler_threads // 2))


class SubjectThreads:
    """Who may hand a sync handler to the host's handler threads now: each subject at most its share
    (:func:`handler_share`: half the pool, at least 1), all its executes and calls together (single
    calls and the calls of its batches alike), and a subject that already holds one never the last
    free thread, which is kept for a subject holding none (else two tenants' shares fill the pool).

    A thread is counted from before the handler is handed to the pool until the handler has finished
    in it, not until the execute gives up on it: a thread cannot be stopped, so a handler the
    deadline abandoned still counts against its subject while it runs (else a tenant could fill the
    pool with abandoned handlers, an execute at a time).

    Args:
        threads: the host's handler threads.
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.share = max(1, threads // 2)
        self.total = 0
        self._held: dict[str, int] = {}
        self._waiters: list[asyncio.Future[None]] = []

    def _may_take(self, subject: str) -> bool:
        held = self._held.get(subject, 0)
        if held >= self.share:
            return False
        return self.total < (self.threads if held == 0 else self.threads - 1)

    async def take(self, subject: str) -> Callable[[], None]:
        """Wait until ``subject`` may start a sync handler, and count it.

        Args:
            subject: the trusted subject's id.

        Returns:
            The thread's release, to be called once on the event loop's thread when the handler
            has finished.
        """
        while not self._may_take(subject):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                self._waiters.remove(waiter)
        self._held[subject] = self._held.get(subject, 0) + 1
        self.total += 1

        def release() -> None:
            self.total -= 1
            left = self._held[subject] - 1
            if left:
                self._held[subject] = left
            else:
                del self._held[subject]
            for waiter in self._waiters:  # each checks again whether it may take one now
                if not waiter.done():
                    waiter.set_result(None)

        return release


@dataclass
class _Call:
    """One call of a batch: what it is and what became of it."""

    cap: CompiledCapability
    event: Any  # the call's audit record
    canonical: dict[str, Any] | None  # None: the worker's binding rejected it
    answer: Any = None  # the plain result, or the CodeModeError that goes back as its element
    typed_args: Any = None
    runs: bool = False  # authorized: its handler is to run


async def run_batch(session: _Session, frame: dict[str, Any], exchange: Exchange) -> None:
    """Serve one ``native_batch`` frame: check, authorize and run its calls, answer with one
    ``native_batch_result``, and record every call in list order.

    Args:
        session: the exchange with the worker.
        frame: the validated ``native_batch`` frame (hostile).
        exchange: the pipeline's record and exception types.

    Raises:
        Exception: ``exchange.misbehaved`` when the frame breaks the protocol (nothing authorized or
            run), ``exchange.gone`` when the worker's stream closed before the results were written.
        CodeModeError: a failure that ends the execute.
    """
    calls = _checked(session, frame, exchange)
    try:
        # A resumed execute answers a batch of its replayed prefix from its call log (execution.replay).
        if await session.batch_replayed(frame["seq"], calls):
            return
        await _authorize(session, calls)
        await _run(session, calls)
        body = _results(session, frame["seq"], calls)
        try:
            data = body.encode("utf-8")
            await session.sandbox.write(struct.pack(">I", len(data)) + data)
        except SandboxClosed:
            raise exchange.gone() from None
        session.batch_log(calls)  # each call a log entry, in list order
    finally:
        for call in calls:
            session.observe(call.cap, call.event)


def _checked(session: _Session, frame: dict[str, Any], exchange: Exchange) -> list[_Call]:
    """Phase 1: the frame as hostile input; counts its calls. Nothing is authorized here."""
    ex, limits = session.ex, session.ex.limits
    items = frame["calls"]
    if frame["seq"] != session.calls + 1:
        raise exchange.misbehaved(f"native_batch seq {frame['seq']!r}, expected {session.calls + 1}")
    if session.calls + len(items) > limits.max_native_calls:
        raise ResourceLimit("native calls")
    started = session.trace.now()
    calls: list[_Call] = []
    total = 0
    for item in items:
        cap = ex.by_name.get(item["name"])
        if cap is None:
            raise exchange.misbehaved("native_batch call for a capability that is not enabled")
        if "invalid" in item:
            error = InvalidArguments(ex.argument_grammar.accepted(item["invalid"]))
            calls.append(_Call(cap, exchange.record(started, decision="invalid_arguments"), None, error))
            continue
        args = item["args"]
        try:
            total += check_value(args, limits.max_value_depth + 1, limits.max_value_bytes)
        except ValueLimitError:
            raise ResourceLimit("value size") from None
        except ValueTypeError as exc:
            raise exchange.misbehaved(f"native_batch args: {exc}") from None
        if total > limits.max_value_bytes:
            raise ResourceLimit("value size")  # the batch's arguments together, as the worker checks
        try:
            canonical = bind_arguments(cap.input_shape, args)
        except BindError as exc:
            raise exchange.misbehaved(f"native_batch rebind failed: {exc}") from None
        calls.append(_Call(cap, exchange.record(started), canonical))
    session.calls += len(calls)
    return calls


async def _authorize(session: _Session, calls: list[_Call]) -> None:
    """Phase 2: every call authorized (or asked about) in list order, before any of them runs."""
    bound = 0
    for call in calls:
        if call.canonical is None:
            continue
        session.batch_asking(bound)  # what a suspension records as its pending call
        bound += 1
        try:
            call.typed_args = await session.authorize(call.cap, call.canonical, call.event)
        except CodeModeError as exc:
            if not _recoverable(call.event):
                raise
            call.answer = exc
            continue
        call.runs = True


async def _run(session: _Session, calls: list[_Call]) -> None:
    """Phase 3: the authorized calls at once, within ``max_parallel_calls`` and the subject's share
    of the handler threads."""
    running = asyncio.Semaphore(session.ex.limits.max_parallel_calls)
    runnable = [call for call in calls if call.runs]
    if not runnable:
        return

    async def one(call: _Call) -> None:
        async with running:  # a sync handler also waits for its subject's share (SubjectThreads)
            await _handle(session, call)

    tasks = [asyncio.ensure_future(one(call)) for call in runnable]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        # One call ended the execute (or the execute was cancelled): the others are cancelled,
        # and waited for so that each record says how far its call got.
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        raise


async def _handle(session: _Session, call: _Call) -> None:
    """One call's handler; a failure ``attempt`` would catch stays in its element."""
    try:
        call.answer = await session.handle(call.cap, call.typed_args, call.event)
    except CodeModeError as exc:
        if not _recoverable(call.event):
            raise
        call.answer = exc


def _results(session: _Session, seq: int, calls: list[_Call]) -> str:
    """The ``native_batch_result`` body; the whole list is bounded like one result."""
    limits = session.ex.limits
    parts = []
    for call in calls:
        if isinstance(call.answer, CodeModeError):
            parts.append(f'{{"ok":false,"error":{_json(client_text(call.answer))}}}')
        else:
            parts.append(f'{{"ok":true,"value":{_json(call.answer)}}}')
    results = "[" + ",".join(parts) + "]"
    if len(results.encode("utf-8")) > limits.max_value_bytes:
        for call in calls:
            if call.event.outcome == "ok":
                call.event.outcome = "resource_limit"  # it ran; its result did not reach the program
        raise ResourceLimit("value size")
    return f'{{"k":"native_batch_result","seq":{seq},"results":{results}}}'
