"""Builder and Server: the library's front door (docs/reference/python-api.md)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..authz import Authorizer, Subject
from ..catalog.answers import AnswerBounds, describe_document, search_entry
from ..catalog.capability import Capability, CompiledCapability, validate_catalog
from ..catalog.search import SearchIndex, SearchLimitError, SearchResponse
from ..catalog.suggest import Suggester
from ..common.errors import Internal, InvalidRegistration, NotFound, ResourceLimit, Unauthenticated
from ..common.outcomes import ExecuteResult
from ..packs.lifecycle import Lifecycle, LoadedPack, close_now, close_reversed, load, load_spec
from ..packs.loading import PackSettings
from ..runtimes.base import Runtime
from ..store import Store
from .admission import Admission, FairAdmission
from .approval import Approver
from .executor import Executor
from .limits import Limits
from .observe import ApprovalAnswer, NullObserver, Observer
from .plan import Plan
from .quota import LocalQuota, QuotaStore
from .suspension import Suspended, UnknownSuspension
from .tracing import Tracing

__all__ = ["Builder", "Description", "Server", "answer_bounds"]

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


class Builder:
    """Collects capabilities and settings, validates everything at :meth:`build`; one-shot.

    Args (of the constructor):
        authorizer: decides every native call (required: ``authz.allow_all()`` allows explicitly).
        limits: the execution limits (:class:`~codemode.Limits`; fields left out take their defaults).
        disabled: capability ids removed at build time.
        runtime: where workers run (default: a :class:`~codemode.ProcessRuntime`).
        observer: hooks for metrics and audit (:class:`~codemode.Observer`).
        subject_quota: concurrent executes per subject (0: none), see below.
        reserved_slots: worker slots kept for subjects with nothing in flight (None: derived).
        tracing: OpenTelemetry traces of every execute (:class:`~codemode.Tracing`; None: off, and
            OpenTelemetry is never imported).
        quota_store: where ``subject_quota`` is counted (None: in this process alone; a
            :class:`~codemode.KubernetesQuota` shares it between replicas, docs/service.md).
        store: where suspended executes and the state pack's keys are kept (a
            :class:`codemode.store.Store`; None: in this process's memory, gone with it). The server
            closes it when it closes.
    """

    def __init__(
        self,
        authorizer: Authorizer | None = None,
        limits: Limits | None = None,
        disabled: Sequence[str] = (),
        runtime: Runtime | None = None,
        observer: Observer | None = None,
        subject_quota: int = 0,
        reserved_slots: int | None = None,
        tracing: Tracing | None = None,
        quota_store: QuotaStore | None = None,
        store: Store | None = None,
    ) -> None:
        """``subject_quota`` and ``reserved_slots`` protect tenants from each other: set them (the
        HTTP service uses ``subject_quota=4`` and a derived reserve) when subjects come from requests.
        By default one subject may use every slot; a reserve is derived only with a quota. The quota
        may be at most the slots minus the reserve (``codemode.execution.admission.Admission``)."""
        self._authorizer = authorizer
        self._subject_quota = subject_quota
        self._reserved_slots = reserved_slots
        self._limits = limits if limits is not None else Limits()
        self._disabled = list(disabled)
        self._runtime = runtime
        self._observer = observer
        self._tracing = tracing
        self._quota_store = quota_store
        self._store = store
        self._caps: list[Capability] = []
        self._packs: list[LoadedPack] = []
        self._built = False

    def add_pack(
        self, pack: Any, settings: PackSettings | None = None, *, name: str | None = None
    ) -> Builder:
        """Add a pack's capabilities now and its lifecycle to the server (docs/packs.md, "A pack's
        lifecycle"): the server awaits its ``open()`` at start and its ``aclose()`` when it closes;
        a failed :meth:`build` closes it at once.

        Args:
            pack: a pack object (``codemode.packs``: a Pack, a list of capabilities, a factory) or a
                spec string, ``module:object`` or ``path/to/file.py:object``.
            settings: what the pack is given (default: the process environment, no options).
            name: how messages name it (default: the spec, else the pack's ``name`` attribute or type).

        Returns:
            This builder, so calls chain.

        Raises:
            PackError: the pack cannot be imported or did not produce capabilities (it is closed).
            InvalidRegistration: after :meth:`build`.
        """
        if self._built:
            raise InvalidRegistration(["builder: add_pack() after build()"])
        if isinstance(pack, str):
            loaded = load_spec(pack, settings)
            if name is not None:
                loaded.label = f"pack {name!r}"
        else:
            loaded = load(pack, settings, label=None if name is None else f"pack {name!r}")
        self._packs.append(loaded)
        self._caps.extend(loaded.capabilities)
        return self

    def register(self, *capabilities: Capability) -> Builder:
        """Add capabilities to the catalog being built (checked at :meth:`build`).

        Args:
            capabilities: :class:`~codemode.Capability` objects (a pack's ``capabilities()``).

        Returns:
            This builder, so calls chain: ``Builder(...).register(*caps).build()``.

        Raises:
            InvalidRegistration: after :meth:`build`.
        """
        if self._built:
            raise InvalidRegistration(["builder: register() after build()"])
        self._caps.extend(capabilities)
        return self

    def build(self) -> Server:
        """Validate everything and build the server (once).

        Returns:
            The :class:`Server` (not started: ``async with server:`` or the first execute starts it).

        Raises:
            InvalidRegistration: listing every problem at once: the authorizer, the limits, the quota
                and reserve, each capability (names, texts, types, answers over the bounds).
        """
        if self._built:
            raise InvalidRegistration(["builder: build() may be called only once"])
        self._built = True
        problems: list[str] = []
        if self._authorizer is None:
            problems.append("authorizer: none given (use authz.allow_all() to allow explicitly)")
        elif not callable(getattr(self._authorizer, "authorize", None)):
            problems.append("authorizer: has no authorize(ctx, input) method")
        if not isinstance(self._limits, Limits):
            problems.append("limits: must be codemode.Limits")
            limits = Limits()
        else:
            limits_problems = self._limits.problems()
            problems += limits_problems
            limits = Limits() if limits_problems else self._limits
        slots = limits.max_concurrent_executions
        problems += Admission.problems_of(slots, self._subject_quota, self._reserved_slots)
        if self._tracing is not None and not isinstance(self._tracing, Tracing):
            problems.append("tracing: must be codemode.Tracing (or None: no traces)")
        elif self._tracing is not None and self._tracing.subject not in ("hash", "omit"):
            problems.append('tracing: subject must be "hash" or "omit"')
        elif self._tracing is not None and not callable(getattr(self._tracing.provider, "get_tracer", None)):
            problems.append("tracing: provider must be an OpenTelemetry TracerProvider")
        if self._observer is not None and not isinstance(self._observer, Observer):
            hooks = "native_call, execute_outcome, execute_started and execute_finished"
            problems.append(f"observer: must have {hooks}")
        if self._quota_store is not None and not isinstance(self._quota_store, QuotaStore):
            problems.append("quota_store: must have acquire(subject_id, quota) and release(hold)")
        if self._store is not None and not isinstance(self._store, Store):
            problems.append("store: must be a codemode.store.Store (MemoryStore, SqliteStore, PostgresStore)")
        if isinstance(self._disabled, str):
            problems.append("disabled: must be a list of ids")
            self._disabled = []
        enabled, cap_problems = validate_catalog(self._caps, self._disabled)
        problems += cap_problems
        bounds = answer_bounds(limits)
        for c in enabled:
            problems += bounds.problems(c)
        if problems:
            close_now(self._packs)
            raise InvalidRegistration(problems)
        assert self._authorizer is not None
        runtime = self._runtime
        if runtime is None:
            from ..runtimes.process import ProcessRuntime

            runtime = ProcessRuntime()
        store = self._store
        if store is None:
            from ..store.memory import MemoryStore

            store = MemoryStore()
        plan = Plan(
            capabilities=tuple(enabled),
            authorizer=self._authorizer,
            limits=limits,
            admission=Admission.derive(slots, self._subject_quota, self._reserved_slots),
            runtime=runtime,
            observer=self._observer if self._observer is not None else NullObserver(),
            tracing=self._tracing,
            quota_store=self._quota_store if self._quota_store is not None else LocalQuota(),
            store=store,
        )
        server = Server(plan)
        if callable(getattr(plan.quota_store, "aclose", None)):
            server.attach(plan.quota_store)  # type: ignore[arg-type]  # open()/aclose(): a Lifecycle
        for pack in self._packs:
            server.attach(pack)
        server.attach(_Closing(store))  # last attached, closed first: after the packs it may serve
        return server


class _Closing:
    """A store as a :class:`~codemode.packs.lifecycle.Lifecycle`: nothing to open (it connects on
    first use), closed with the server."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def open(self) -> None:
        """Nothing: a store connects on first use (and ``/readyz`` checks it)."""

    async def aclose(self) -> None:
        """Close the store."""
        await self.store.aclose()


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a task's failure as seen (whoever awaited it got it; it may have been nobody)."""
    if not task.cancelled():
        task.exception()


def answer_bounds(limits: Limits) -> AnswerBounds:
    """The response bounds of ``limits`` (what packs check their capabilities against).

    Args:
        limits: the limits.

    Returns:
        Their search and describe response bounds.
    """
    return AnswerBounds(
        max_search_response_bytes=limits.max_search_response_bytes,
        max_describe_response_bytes=limits.max_describe_response_bytes,
    )


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
