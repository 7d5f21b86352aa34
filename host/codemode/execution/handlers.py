"""Running one authorized call's handler (docs/reference/errors.md for what its failures become).

An async handler runs in a task of its own, a sync one on the host's handler threads within its
subject's share (``codemode.execution.parallel.SubjectThreads``), first waited for briefly on the
loop's thread (``codemode.common.handoff``). Cancelling the call (the deadline, the client) cancels
the handler; one that outlives its execute is kept referenced until it ends, unobserved. What a
handler raises becomes a client error here, in the approved forms only: its own budget a limit, an
``AgentError`` a disclosed ``capability failed``, a refused argument named, anything else the bare
``capability failed``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, Protocol

from ..authz import Subject
from ..catalog.capability import CompiledCapability
from ..common.errors import (
    AgentError,
    CapabilityFailure,
    Internal,
    InvalidArguments,
    ResourceLimit,
    sanitize_disclosure,
)
from ..common.handoff import NOT_YET, HandOff
from ..store import StoreFull, StoreUnavailable
from .context import CallContext
from .parallel import SubjectThreads

__all__ = ["HandlerHost", "run_handler"]

log = logging.getLogger("codemode.execute")


class HandlerHost(Protocol):
    """What running a handler uses of the executor: whether a handler is async, the subjects'
    shares of the handler threads, and the threads themselves."""

    thread_shares: SubjectThreads

    def is_async(self, cap: CompiledCapability) -> bool:
        """Whether ``cap``'s handler is a coroutine function.

        Args:
            cap: the capability.

        Returns:
            True for an async handler.
        """
        ...

    def run_sync(
        self, cap: CompiledCapability, call: Callable[[], Any]
    ) -> tuple[concurrent.futures.Future[Any], HandOff]:
        """Start a sync handler call on the handlers' pool.

        Args:
            cap: the capability.
            call: the handler call, bound to its arguments.

        Returns:
            The call's future, and the hand-off to wait for it with.
        """
        ...


async def run_handler(
    host: HandlerHost, cap: CompiledCapability, ctx: CallContext, subject: Subject, typed_args: Any
) -> Any:
    """Run one authorized call's handler.

    Args:
        host: the executor (its handler threads).
        cap: the capability called.
        ctx: the execute's call context.
        subject: the trusted subject.
        typed_args: the call's typed arguments (unused for a capability without input).

    Returns:
        What the handler returned.

    Raises:
        CapabilityFailure: the handler failed (an ``AgentError``'s message disclosed).
        ResourceLimit: a budget of the handler's own, or of the store, ran out.
        InvalidArguments: the handler refused an argument's value (named, in the approved form).
        Internal: the store could not answer.
    """
    call_args: tuple[Any, ...] = (ctx, subject)
    if cap.input_type is not None:
        call_args += (typed_args,)
    if host.is_async(cap):
        return await _run_async(cap, call_args)
    return await _run_sync(host, cap, ctx, subject, call_args)


async def _run_async(cap: CompiledCapability, call_args: tuple[Any, ...]) -> Any:
    # Its own task, always: task-bound constructs inside the handler (asyncio.timeout, anyio
    # cancel scopes such as an MCP client's read timeout) must stay with the task they were
    # entered in. The execute waits on its own future, which the handler's task settles as
    # its last step (one loop pass, no asyncio.wait): so a handler that swallows the
    # execute's cancellation cannot hold the call past its deadline.
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[Any] = loop.create_future()
    task = loop.create_task(_settle(cap.handler(*call_args), outcome))
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


async def _run_sync(
    host: HandlerHost, cap: CompiledCapability, ctx: CallContext, subject: Subject, call_args: tuple[Any, ...]
) -> Any:
    # A sync handler runs on the handlers' pool, in a copy of the context. Its result is first
    # waited for on the loop's thread, briefly (codemode.common.handoff: no trip through the loop for a
    # short handler), then awaited: cancelling the call cancels it (a handler already running in
    # its thread finishes there, unobserved).
    call = functools.partial(contextvars.copy_context().run, cap.handler, *call_args)
    try:
        # The subject's share of the threads, held until the handler has finished in its thread.
        release = await host.thread_shares.take(subject.id)
        try:
            job, handoff = host.run_sync(cap, call)
        except BaseException:
            release()
            raise
        job.add_done_callback(_on_loop(asyncio.get_running_loop(), release))
        result = handoff.block(job, ctx.deadline)
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
