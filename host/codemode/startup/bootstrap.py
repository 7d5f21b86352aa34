"""From settings to a running catalog: the one place that turns a :class:`~codemode.startup.config.Settings`
into packs, an authorizer, a runtime (with its warm pool) and a built :class:`~codemode.Server`.

Every front end (``serve --stdio``, ``serve --http``, ``quotas tune``, ``bench``) builds through
here, so a setting means the same thing everywhere. Every failure is a
:class:`~codemode.startup.config.ConfigError` naming the flag and the environment variable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import authz
from ..catalog.capability import Capability
from ..common.errors import InvalidRegistration
from ..common.extras import MissingExtra, require
from ..execution.builder import Builder, answer_bounds
from ..execution.observe import Observer
from ..execution.quota import QuotaStore
from ..execution.server import Server
from ..packs.lifecycle import LoadedPack, PackOpenError, close_now, load, load_spec
from ..packs.loading import PackError, PackSettings, resolve_spec, split_specs
from ..packs.upstream import UpstreamBuildError
from ..runtimes.base import OptionError, Runtime, RuntimeUnavailable
from ..runtimes.options import ProcessOptions
from ..runtimes.pool import WarmPool
from ..runtimes.reuse import ReusePool, SupervisingRuntime
from ..store import Store
from .config import ConfigError, Settings, leaves, names

__all__ = [
    "UPSTREAM_TABLES",
    "StartupProblem",
    "build_authorizer",
    "build_quota_store",
    "build_runtime",
    "build_server",
    "build_store",
    "check_runtime",
    "upstream_packs",
    "with_pool",
]

log = logging.getLogger("codemode.bootstrap")


def build_authorizer(settings: Settings) -> authz.Authorizer:
    """``allow_all()`` or the Rego authorizer the settings name.

    Args:
        settings: the settings.

    Returns:
        The authorizer.

    Raises:
        ConfigError: no authorizer is set, the decision names no rule, or the policy cannot be
            read or is invalid (one line naming the setting).
    """
    if settings.allow_all:
        return authz.allow_all()
    if not settings.rego_decision or not settings.rego_policy:
        raise ConfigError(
            f"no authorizer: set {names('allow_all')}, "
            f"or {names('rego_policy')} with {names('rego_decision')}"
        )
    from ..authz.rego import InvalidPolicy, UnknownDecision, from_files

    try:
        return from_files(
            settings.rego_decision,
            settings.rego_policy,
            evaluate_inline=settings.rego_evaluate_inline,
            bounded_inline=settings.rego_bounded_inline,
        )
    except UnknownDecision as exc:
        raise ConfigError(f"{names('rego_decision')}: {_one_line(str(exc))}") from None
    except InvalidPolicy as exc:
        raise ConfigError(f"{names('rego_policy')}: {_one_line(str(exc))}") from None
    except OSError as exc:
        raise ConfigError(f"{names('rego_policy')}: cannot read the policy: {exc}") from None


def build_runtime(
    settings: Settings, *, worker_command: Sequence[str] | None = None, **extra: Any
) -> Runtime:
    """The worker runtime the settings name, without a pool.

    Args:
        settings: the settings.
        worker_command: replaces the worker's command line (for operator tools that measure a
            worker, ``codemode quotas tune``; never for serving).
        extra: options replaced (the same use).

    Returns:
        The runtime (not started).

    Raises:
        ConfigError: the runtime is not installed, or its settings are refused (naming the
            runtime's flags and variables).
    """
    kind = settings.runtime
    try:
        if kind == "process":
            from ..runtimes.process import ProcessRuntime as cls
        elif kind == "docker":
            from ..runtimes.docker import DockerRuntime as cls  # type: ignore[assignment]
        else:
            from ..runtimes.kubernetes import KubernetesRuntime as cls  # type: ignore[assignment]
    except MissingExtra as exc:
        raise ConfigError(f"{names('runtime')}: {exc}") from None
    except ImportError as exc:
        raise ConfigError(f"{names('runtime')}: the {kind} runtime is not installed: {exc}") from None
    try:
        options = settings.runtime_options
        make: Callable[[Any], Runtime] = cls  # every runtime takes its options whole
        if isinstance(options, ProcessOptions):
            if worker_command is not None:
                options = options.with_command(worker_command)
            return make(dataclasses.replace(options, **extra))
        changes = dict(extra)
        if worker_command is not None:
            changes["entrypoint"] = list(worker_command)
        return make(dataclasses.replace(options, **changes))
    except OptionError as exc:  # naming the option's flag
        field = f"{kind}_{exc.option}"
        known = any(leaf.name == field for leaf in leaves())
        where = names(field) if known else f"--{kind}-* / CODEMODE_{kind.upper()}_*"
        raise ConfigError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"--{kind}-* / CODEMODE_{kind.upper()}_*: {exc}") from None


def build_quota_store(settings: Settings) -> QuotaStore | None:
    """Where the settings count ``subject_quota`` (docs/service.md, "Several replicas: a shared
    quota").

    Args:
        settings: the settings (``quota_store`` and its ``quota_*`` options).

    Returns:
        None for ``local`` (the server counts in its own process), else the shared store.

    Raises:
        ConfigError: ``kubernetes`` without the Kubernetes client (the ``kubernetes`` extra).
    """
    if settings.quota_store == "local":
        return None
    try:
        require("kubernetes", "kubernetes", "the Kubernetes quota store")
    except MissingExtra as exc:
        raise ConfigError(f"{names('quota_store')}: {exc}") from None
    from ..execution.quota_kubernetes import KubernetesQuota

    namespace = settings.effective_quota_namespace
    assert namespace is not None  # checked with the settings
    return KubernetesQuota(
        namespace,
        kubeconfig=settings.quota_kubeconfig,
        lease_seconds=settings.quota_lease_seconds,
        timeout=settings.quota_store_timeout,
    )


def build_store(settings: Settings) -> Store:
    """Where the settings keep suspended executes and state keys (``store``; docs/configuration.md,
    SECURITY.md "What the host stores").

    Args:
        settings: the settings (``store``, ``store_timeout``, ``data_dir``).

    Returns:
        The store, not connected yet: a SQLite file in the data dir, memory, or PostgreSQL.

    Raises:
        ConfigError: the PostgreSQL URI cannot be parsed (the message quotes none of it).
    """
    kind = settings.store_kind
    if kind == "memory":
        from ..store.memory import MemoryStore

        return MemoryStore()
    if kind == "sqlite":
        from ..store.sqlite import SqliteStore

        path = settings.store_path
        assert path is not None  # sqlite is chosen only with a data dir
        return SqliteStore(path)
    from ..store.postgres import PostgresStore

    assert settings.store is not None
    try:
        return PostgresStore(settings.store, timeout=settings.store_timeout)
    except ValueError as exc:
        raise ConfigError(f"{names('store')}: {exc}") from None


def with_pool(runtime: Runtime, settings: Settings) -> Runtime:
    """``runtime`` behind a :class:`WarmPool` of ``settings.pool`` workers, growing with demand up to
    ``settings.pool_max`` (unchanged when both are 0 or unset), or, in the reuse mode
    (``reuse_executes`` > 0), behind a :class:`ReusePool` keeping ``settings.pool`` sandboxes,
    growing with demand up to ``settings.pool_max``.

    Args:
        runtime: the runtime.
        settings: the settings (``pool``, ``pool_max``, ``pool_refill_concurrency``,
            ``pool_subject_share``, ``reuse_executes``, ``reuse_idle_seconds``).

    Returns:
        The pool, or ``runtime`` itself.

    Raises:
        ConfigError: the reuse mode is asked of a runtime that has none.
    """
    if settings.reuse_executes:
        if not isinstance(runtime, SupervisingRuntime):
            raise ConfigError(f"{names('reuse_executes')}: the {runtime.name} runtime has no reuse mode")
        return ReusePool(
            runtime,
            settings.pool,
            maximum=settings.pool_max,
            max_executes=settings.reuse_executes,
            idle_seconds=settings.reuse_idle_seconds,
            refill_concurrency=settings.pool_refill_concurrency,
            subject_share=settings.effective_pool_subject_share,
        )
    if settings.pool == 0 and not settings.pool_max:
        return runtime
    return WarmPool(
        runtime,
        settings.pool,
        maximum=settings.pool_max,
        refill_concurrency=settings.pool_refill_concurrency,
        subject_share=settings.effective_pool_subject_share,
    )


def _pack_settings(settings: Settings, environ: Mapping[str, str] | None) -> PackSettings:
    return PackSettings(
        environ=dict(os.environ if environ is None else environ),
        options=settings.pack_option_map,
        data_dir=settings.pack_data_dir,
        multi_tenant=settings.transport == "http",
        answer_bounds=answer_bounds(settings.limits),
    )


@dataclass(frozen=True)
class StartupProblem:
    """One pack or runtime that could not start: ``component`` names it (``pack <spec>``,
    ``upstream_mcp <name>``, ``openapi <name>``, ``runtime <kind>``); ``detail`` is one line naming
    the problem and the flag or environment variable to look at (host side only: never a client's)."""

    component: str
    detail: str


@dataclass(frozen=True)
class _Unit:
    """One thing that fails to start on its own: a ``--pack`` or one upstream table."""

    component: str
    setting: str
    load: Callable[[PackSettings], LoadedPack]


def _warn_if_empty(settings: Settings) -> None:
    if not settings.packs and not settings.upstream_mcp and not settings.openapi:
        log.warning("no capability packs configured (--pack / CODEMODE_PACKS): the catalog is empty")


#: Where the ``[[upstream_mcp]]`` and ``[[openapi]]`` tables load through: a pack spec, resolved by
#: the pack loader as any ``--pack`` is (the host imports no shipped pack by name). It names a
#: callable ``(upstream_mcp_tables, openapi_tables) -> [(kind, name, pack), ...]``.
UPSTREAM_TABLES = "codemode_capabilities.upstreams:table_packs"


def upstream_packs(settings: Settings) -> list[tuple[str, str, Any]]:
    """One pack per ``[[upstream_mcp]]`` and ``[[openapi]]`` table (none when there are none), so
    each upstream starts, or fails to, on its own; loaded through the pack loader
    (:data:`UPSTREAM_TABLES`).

    Args:
        settings: the settings (their TOML tables).

    Returns:
        ``(kind, name, pack)`` for each table, the packs not loaded yet.

    Raises:
        ConfigError: a table is invalid (naming ``--config``).
    """
    if not settings.upstream_mcp and not settings.openapi:
        return []
    try:
        build = resolve_spec(UPSTREAM_TABLES)
        return list(build(settings.upstream_mcp, settings.openapi))
    except PackError as exc:
        origin = settings.origin()
        where = origin if origin != "settings" else _CONFIG
        raise ConfigError(f"{where}: {_one_line(str(exc))}") from None


_CONFIG = "--config / CODEMODE_CONFIG"


def _units(settings: Settings) -> list[_Unit]:
    packs = names("packs")
    out = [
        _Unit(f"pack {spec}", packs, functools.partial(load_spec, spec, setting=packs))
        for spec in split_specs(settings.packs)
    ]
    for kind, name, pack in upstream_packs(settings):
        component = f"{kind} {name}"
        take = functools.partial(
            load, pack, label=f"{kind} {name!r}", component=component, setting=_CONFIG, wrap=False
        )
        out.append(_Unit(component, _CONFIG, take))
    return out


def _load_units(settings: Settings, problems: list[StartupProblem] | None) -> list[LoadedPack]:
    """Every unit, loaded; a unit that fails raises ``ConfigError`` (strict, ``problems`` None: the
    units loaded before it are closed) or is left out with its problem appended."""
    pack_settings = _pack_settings(settings, None)
    loaded: list[LoadedPack] = []
    for unit in _units(settings):
        try:
            loaded.append(unit.load(pack_settings))
        except Exception as exc:
            text = _one_line(str(exc)) or type(exc).__name__
            if not isinstance(exc, PackError | UpstreamBuildError):
                text = f"{type(exc).__name__}: {text}"
            detail = f"{unit.setting}: {text}"
            if problems is None:
                close_now(loaded)
                raise ConfigError(detail) from None
            log.error("start-up problem, %s left out (degraded start): %s", unit.component, detail)
            problems.append(StartupProblem(unit.component, detail))
    _warn_if_empty(settings)
    return loaded


def build_server(
    settings: Settings,
    *,
    runtime: Runtime | None = None,
    authorizer: authz.Authorizer | None = None,
    observer: Observer | None = None,
    capabilities: list[Capability] | None = None,
    problems: list[StartupProblem] | None = None,
) -> Server:
    """A built (not yet started) server: packs, authorizer, runtime + pool, limits and quota.

    ``runtime``, ``authorizer`` and ``capabilities`` replace what the settings would build (tests and
    operator tools measure with their own); the pool of ``settings.pool`` wraps ``runtime`` either way.

    The start-up rule (docs/service.md, "Start-up problems"): each ``--pack`` and each upstream
    table is a unit. A unit that cannot be loaded, connected or listed raises ``ConfigError`` (one
    line naming it and its setting), unless ``problems`` is a list: then the unit is left out, its
    :class:`StartupProblem` appended and logged (a degraded start). Configuration errors (settings,
    tables, the catalog's own rules) are a ``ConfigError`` either way.

    Args:
        settings: the settings.
        runtime: replaces the runtime the settings describe.
        authorizer: replaces the authorizer the settings describe.
        observer: told about executes and calls.
        capabilities: replace the packs' capabilities (no pack is loaded).
        problems: where a degraded start puts the units left out (None: any is a ``ConfigError``).

    Returns:
        The server.
    """
    auth = authorizer if authorizer is not None else build_authorizer(settings)
    packs = _load_units(settings, problems) if capabilities is None else []
    try:
        return _build(settings, runtime, auth, observer, capabilities, packs, problems)
    except BaseException:
        close_now(packs)
        raise


def _build(
    settings: Settings,
    runtime: Runtime | None,
    auth: authz.Authorizer,
    observer: Observer | None,
    capabilities: list[Capability] | None,
    packs: list[LoadedPack],
    problems: list[StartupProblem] | None,
) -> Server:
    caps = list(capabilities) if capabilities is not None else [c for p in packs for c in p.capabilities]
    disabled = list(settings.disable)
    if problems:
        # a disabled id of a capability that was left out is no problem of its own
        known = {c.id if c.id is not None else c.name for c in caps}
        ignored = [d for d in disabled if d not in known]
        if ignored:
            log.warning("degraded start: ignoring disabled ids of no loaded capability: %s", ignored)
        disabled = [d for d in disabled if d in known]
    base = runtime if runtime is not None else build_runtime(settings)
    tracing, export = None, None
    if settings.trace_endpoint is not None:
        from .trace_export import build_tracing  # the SDK and exporter only when tracing is on

        tracing, export = build_tracing(settings)
    builder = Builder(
        authorizer=auth,
        limits=settings.limits,
        disabled=disabled,
        runtime=with_pool(base, settings),
        observer=observer,
        subject_quota=settings.subject_quota,
        reserved_slots=settings.effective_reserved_slots,
        tracing=tracing,
        quota_store=build_quota_store(settings),
        store=build_store(settings),
    )
    builder.register(*caps)
    try:
        server = builder.build()
    except InvalidRegistration as exc:
        raise ConfigError(f"{names('packs')}: {_one_line(str(exc))}") from None
    for pack in packs:
        server.attach(pack)
    if export is not None:
        server.attach(export)
    return server


async def check_runtime(
    server: Server, settings: Settings, timeout: float | None = None
) -> StartupProblem | None:
    """Start ``server``'s runtime and run its check (the start-up rule's runtime half).

    Args:
        server: the built server.
        settings: the settings (which runtime, for the message).
        timeout: seconds the start and the check may take (None: no bound).

    Returns:
        None when it answers, else the problem: one line naming the runtime's settings (or the
        pack whose open failed).
    """
    kind = settings.runtime
    try:
        async with asyncio.timeout(timeout):
            await server.start()
            await server.runtime.check()
    except PackOpenError as exc:
        component = exc.component or "pack"
        return StartupProblem(component, f"{exc.setting}: {exc}" if exc.setting else str(exc))
    except TimeoutError:
        text = f"did not start and answer its check within {timeout:g} s"
    except Exception as exc:
        text = _one_line(str(exc)) or type(exc).__name__
        if not isinstance(exc, RuntimeUnavailable):
            text = f"{type(exc).__name__}: {text}"
    else:
        return None
    settings_hint = (
        names("runtime")
        if kind == "process"
        else f"{names('runtime')}, --{kind}-* / CODEMODE_{kind.upper()}_*"
    )
    return StartupProblem(f"runtime {kind}", f"{settings_hint}: the {kind} runtime is not usable: {text}")


def _one_line(text: str) -> str:
    return "; ".join(part.strip(" -").removesuffix(":") for part in text.splitlines() if part.strip(" -"))
