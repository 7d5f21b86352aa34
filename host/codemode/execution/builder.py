"""``Builder``: the library's front door (docs/reference/python-api.md). It gathers capabilities,
packs, the authorizer, limits, runtime, observer, tracing and stores, checks everything once in
:meth:`Builder.build` (every problem listed at once) and hands the :class:`~codemode.execution.server.Server`
one frozen :class:`~codemode.execution.plan.Plan`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..authz import Authorizer
from ..catalog.answers import AnswerBounds
from ..catalog.capability import Capability, validate_catalog
from ..common.errors import InvalidRegistration
from ..packs.lifecycle import LoadedPack, close_now, load, load_spec
from ..packs.loading import PackSettings
from ..runtimes.base import Runtime
from ..store import Store
from .admission import Admission
from .limits import Limits
from .observe import NullObserver, Observer
from .plan import Plan
from .quota import LocalQuota, QuotaStore
from .server import Server
from .tracing import Tracing

__all__ = ["Builder", "answer_bounds"]


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
