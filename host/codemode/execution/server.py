"""``Server``: a built catalog and its executor (docs/reference/python-api.md): the three tools
(search, describe, execute), its runtime's start and the close of everything attached to it, in
reverse order. ``Builder.build()`` (codemode.execution.builder) makes it from a checked plan.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..authz import Subject
from ..catalog.answers import describe_document, search_entry
from ..catalog.capability import CompiledCapability
from ..catalog.search import SearchIndex, SearchLimitError, SearchResponse
from ..catalog.suggest import Suggester
from ..common.errors import Internal, NotFound, ResourceLimit, Unauthenticated
from ..common.outcomes import ExecuteResult
from ..packs.lifecycle import Lifecycle, close_reversed
from .admission import FairAdmission
from .approval import Approver
from .executor import Executor
from .observe import ApprovalAnswer
from .plan import Plan
from .suspension import Suspended, UnknownSuspension

__all__ = ["Description", "Server"]

log = logging.getLogger("codemode.server")


@dataclass(frozen=True)
class Description:
    """``describe_api``'s answer: ``name``, ``signature``, ``summary``, ``description`` and the
    ``input`` and ``output`` fields, and ``returns``, the result's type when it is not an object
    (docs/reference/describe.md). The capability id is deliberately absent."""

    name: str
    signature: str
    summary: str
    description: str
    input: list[dict[str, Any]]
    output: list[dict[str, Any]]
    #: The result's type when it is not an object (a function returning ``str``): ``output`` is
    #: then empty. None for an object result.
    returns: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``describe_api`` answers with (docs/reference/describe.md).

        Returns:
            ``{name, signature, summary, description, input, output}``; ``input`` and ``output``
            are lists of ``{name, type, required}`` (and ``default`` for an input with one); plus
            ``returns`` when the result is not an object.
        """
        out = {
            "name": self.name,
            "signature": self.signature,
            "summary": self.summary,
            "description": self.description,
            "input": [dict(i) for i in self.input],
            "output": [dict(o) for o in self.output],
        }
        if self.returns is not None:
            out["returns"] = self.returns
        return out


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a task's failure as seen (whoever awaited it got it; it may have been nobody)."""
    if not task.cancelled():
        task.exception()


class Server:
    """A built catalog with its authorizer, limits and runtime (made by :meth:`Builder.build`).

    Use it as ``async with server:`` (starts the runtime, closes everything on exit), or call
    :meth:`start` and :meth:`aclose` yourself. :meth:`search`, :meth:`describe` and :meth:`execute`
    are the three tools of docs/reference/tools.md.

    Args (of the constructor, which :meth:`Builder.build` calls after checking everything):
        plan: the frozen :class:`~codemode.execution.plan.Plan` (capabilities, authorizer, limits,
            admission, runtime, observer, tracing); the server keeps it as ``server.plan``.
    """

    def __init__(self, plan: Plan) -> None:
        """Use :meth:`Builder.build`, which checks everything and makes the plan."""
        self.plan = plan
        self.limits = plan.limits
        self.runtime = plan.runtime
        self._by_name = {c.name: c for c in plan.capabilities}
        self._index = SearchIndex(
            [search_entry(c) for c in plan.capabilities],
            max_results=plan.limits.max_search_results,
            max_response_bytes=plan.limits.max_search_response_bytes,
        )
        self._suggester = Suggester(list(self._by_name))  # from the catalog search_api shows everyone
        self._executor = Executor(plan)
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._resources: list[Lifecycle] = []
        self._open_failure: Exception | None = None
        self._opening: asyncio.Task[None] | None = None

    def attach(self, resource: Lifecycle) -> None:
        """Tie a pack (or another resource) to this server's lifecycle (docs/packs.md, "A pack's
        lifecycle"): :meth:`start` awaits ``resource.open()`` after the runtime started, in the order
        attached; :meth:`aclose` awaits ``resource.aclose()`` after the workers are reaped, in
        reverse order, once, whether or not it was opened.

        Args:
            resource: a :class:`~codemode.packs.lifecycle.Lifecycle` (``Builder.add_pack`` attaches
                each pack it was given).
        """
        self._resources.append(resource)

    @property
    def capabilities(self) -> list[CompiledCapability]:
        """The enabled capabilities, compiled (name, id, shapes, signature), in registration order."""
        return list(self._by_name.values())

    def pending_suspensions(self) -> int | None:
        """Suspended executes waiting for an answer in the whole store (every host sharing it), as
        counted after this server's last expiry sweep, suspend or resume.

        Returns:
            The count, or None before the first count or when no execute can ask.
        """
        suspensions = self._executor.suspensions
        return suspensions.pending if suspensions is not None else None

    @property
    def slots(self) -> FairAdmission:
        """The worker slots (``max_concurrent_executions``): how many are free and how many executes
        wait, for metrics. Read it; taking or giving back a slot is the server's own business."""
        return self._executor.slots

    def search(self, query: str) -> SearchResponse:
        """``search_api``: capabilities ranked for a task description (docs/reference/search.md).

        Args:
            query: words describing the task.

        Returns:
            A :class:`~codemode.SearchResponse` (``to_dict()`` is the tool's answer).

        Raises:
            ResourceLimit: kind ``query``, for a query over its byte or word bound (or not a str).
        """
        if not isinstance(query, str):
            raise ResourceLimit("query")
        try:
            return self._index.search(query, max_query_bytes=self.limits.max_search_query_bytes)
        except SearchLimitError:
            raise ResourceLimit("query") from None

    def describe(self, name: str) -> Description:
        """``describe_api``: one capability's exact signature and shapes (docs/reference/describe.md).

        Args:
            name: the capability's dotted name, e.g. ``records.get``.

        Returns:
            Its :class:`Description`.

        Raises:
            NotFound: no enabled capability has that name (its detail ``did you mean <name>?``
                names the closest enabled one, when one is close).
        """
        cap = self._by_name.get(name) if isinstance(name, str) else None
        if cap is None:
            close = self._suggester.closest(name) if isinstance(name, str) else None
            raise NotFound(f"did you mean {close}?" if close is not None else None)
        return Description(**describe_document(cap))

    async def start(self) -> None:
        """Start the runtime (orphan clean-up, pool warm-up), then open every attached pack in order.
        ``execute`` calls it on first use; a runtime that failed to start is tried again next time.

        Raises:
            PackOpenError: a pack's ``open()`` failed (one line naming it). Every attached pack is
                closed then (the opened ones too, in reverse order) and the server cannot start again.
            Exception: whatever the runtime's start raised.
        """
        if self._started:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._open_failure is not None:
                raise self._open_failure
            if not self._started:
                await self.runtime.start()
                await self._open_resources()
                self._started = True

    async def _open_resources(self) -> None:
        """Open the packs in a task of their own: a start cut short (a readiness probe's timeout)
        leaves the opens running, and the next start waits for the same task."""
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_task(self._open_all())
            self._opening.add_done_callback(_retrieve)
        await asyncio.shield(self._opening)

    async def _open_all(self) -> None:
        for resource in list(self._resources):
            try:
                await resource.open()
            except Exception as exc:
                self._open_failure = exc
                resources, self._resources = self._resources, []
                await close_reversed(resources)
                raise

    async def execute(
        self,
        source: str,
        *,
        subject: Subject,
        trace_context: Mapping[str, Any] | None = None,
        approver: Approver | None = None,
    ) -> Any:
        """``execute``: run one program in a fresh worker (docs/reference/program.md).

        Args:
            source: the Starlark program; it defines ``def main():``.
            subject: the trusted caller every native call is authorized for.
            trace_context: W3C trace context (``{"traceparent": ...}``) whose span the execute's
                span links, when tracing is on: never its parent (the execute starts a trace of the
                host's), and neither its flags nor a ``tracestate`` are used (ignored when invalid).
            approver: asks the user about each call the policy answers "ask" for
                (:class:`~codemode.Approver`; None: nobody can be asked, such calls are declined).

        Returns:
            ``main()``'s plain value (None, bool, int, float, str, list, str-keyed dict).

        Raises:
            CodeModeError: a subclass per outcome (docs/reference/errors.md); it carries the call
                ledger (``err.calls``) and the prints (``err.prints``).
        """
        run = await self.run(source, subject=subject, trace_context=trace_context, approver=approver)
        return run.value

    async def run(
        self,
        source: str,
        *,
        subject: Subject,
        trace_context: Mapping[str, Any] | None = None,
        approver: Approver | None = None,
    ) -> ExecuteResult:
        """Like :meth:`execute`, with the call ledger and the prints.

        Args:
            source: the Starlark program.
            subject: the trusted caller.
            trace_context: as for :meth:`execute`.
            approver: as for :meth:`execute`.

        Returns:
            An :class:`~codemode.ExecuteResult` (``value``, ``calls``, ``prints``).

        Raises:
            Unauthenticated: ``subject`` is not a Subject with a non-empty id.
            Internal: the runtime or a pack could not start (the detail is in the host log).
            Suspended: the approver defers (its ``defers`` is true): the execute waits for the user's
                answer as a record; :meth:`request_state` names it, :meth:`resume` goes on with it.
            CodeModeError: as :meth:`execute`.
        """
        if not isinstance(subject, Subject) or not isinstance(subject.id, str) or not subject.id:
            raise Unauthenticated()
        try:
            await self.start()
        except Exception as exc:
            # e.g. a dead Docker daemon: precise reason for the operator, coarse text for the client.
            log.error("runtime %s could not start: %s", self.runtime.name, exc)
            raise Internal() from None
        return await self._executor.execute(source, subject, trace_context, approver)

    async def resume(
        self,
        state: object,
        *,
        subject: Subject,
        source: str,
        answer: ApprovalAnswer,
        trace_context: Mapping[str, Any] | None = None,
        approver: Approver | None = None,
    ) -> ExecuteResult:
        """Resume an execute that :meth:`run` left suspended (its approver ``defers``), with the
        user's answer, by replaying it in a fresh worker (docs/reference/authorization.md#asking-the-user);
        on any server sharing this one's store.

        Args:
            state: the :meth:`request_state` of the suspension.
            subject: the trusted caller (only the suspension's own).
            source: the program (only the suspension's own).
            answer: the user's answer (``"accept"`` runs the pending call).
            trace_context: as for :meth:`execute`.
            approver: as for :meth:`run` (a later question suspends again).

        Returns:
            As :meth:`run`.

        Raises:
            Unauthenticated: ``subject`` is not a Subject with a non-empty id.
            Internal: the runtime could not start, or the store could not answer.
            UnknownSuspension: the state is forged, used, expired, or another subject's or program's.
            Suspended: the execute asks again.
            CodeModeError: as :meth:`execute`.
        """
        if not isinstance(subject, Subject) or not isinstance(subject.id, str) or not subject.id:
            raise Unauthenticated()
        if not isinstance(source, str):
            raise UnknownSuspension()
        try:
            await self.start()
        except Exception as exc:
            log.error("runtime %s could not start: %s", self.runtime.name, exc)
            raise Internal() from None
        return await self._executor.resume(state, subject, source, answer, trace_context, approver)

    async def request_state(self, suspended: Suspended) -> str:
        """The ``request_state`` that names a suspension: signed with the store's key, bound to its
        subject and program.

        Args:
            suspended: what :meth:`run` raised.

        Returns:
            The state text.

        Raises:
            StoreUnavailable: the store could not answer.
        """
        assert self._executor.suspensions is not None
        return await self._executor.suspensions.state_for(suspended)

    async def aclose(self) -> None:
        """Stop pools, reap every worker, then close every attached pack (last attached first, each
        once; a failure is logged and the rest still close)."""
        await self._executor.drain()
        opening, self._opening = self._opening, None
        if opening is not None and not opening.done():
            opening.cancel()  # a pack still opening is closed like the others, once
            await asyncio.gather(opening, return_exceptions=True)
        try:
            await self.runtime.aclose()
        finally:
            resources, self._resources = self._resources, []
            await close_reversed(resources)

    async def __aenter__(self) -> Server:
        """``async with server:`` starts the runtime and the packs, and closes everything on exit
        (also when the start fails)."""
        try:
            await self.start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close everything (:meth:`aclose`), whatever ended the block."""
        await self.aclose()
