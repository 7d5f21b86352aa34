"""From settings to a running catalog: the one place that turns a :class:`~codemode.startup.config.Settings`
into packs, an authorizer, a runtime (with its warm pool) and a built :class:`~codemode.Server`.

Every front end (``serve --stdio``, ``serve --http``, ``quotas tune``, ``bench``) builds through
here, so a setting means the same thing everywhere. Every failure is a
:class:`~codemode.startup.config.ConfigError` naming the flag and the environment variable.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .. import authz
from ..catalog.capability import Capability
from ..common.errors import InvalidRegistration
from ..execution.observe import Observer
from ..execution.server import Builder, Server, answer_bounds
from ..packs.loading import PackError, PackSettings, load_packs
from ..runtimes.base import Runtime
from ..runtimes.pool import WarmPool
from .config import SIZE_SETTINGS, ConfigError, Settings, names, parse_size

__all__ = [
    "build_authorizer",
    "build_runtime",
    "build_server",
    "load_capabilities",
    "upstream_packs",
    "with_pool",
]

log = logging.getLogger("codemode.bootstrap")


def build_authorizer(settings: Settings) -> authz.Authorizer:
    """``allow_all()`` or the Rego authorizer the settings name."""
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
            settings.rego_decision, settings.rego_policy, evaluate_inline=settings.rego_evaluate_inline
        )
    except UnknownDecision as exc:
        raise ConfigError(f"{names('rego_decision')}: {_one_line(str(exc))}") from None
    except InvalidPolicy as exc:
        raise ConfigError(f"{names('rego_policy')}: {_one_line(str(exc))}") from None
    except OSError as exc:
        raise ConfigError(f"{names('rego_policy')}: cannot read the policy: {exc}") from None


def _runtime_kwargs(settings: Settings) -> dict[str, Any]:
    """Constructor arguments of the chosen runtime: each ``<runtime>_<name>`` setting that is set,
    under the runtime's own parameter name (a size such as ``256m`` in bytes)."""
    renames = {
        "process": {"memory": "address_space_bytes"},
        "docker": {"memory": "memory_bytes", "pids": "pids_limit", "cpus": "cpus", "oci_runtime": "runtime"},
        "kubernetes": {},
    }[settings.runtime]
    prefix = settings.runtime + "_"
    out: dict[str, Any] = {}
    for field in type(settings).model_fields:
        value = getattr(settings, field)
        if field.startswith(prefix) and value is not None:
            name = field.removeprefix(prefix)
            if field in SIZE_SETTINGS:
                value = parse_size(value)
            out[renames.get(name, name)] = value
    return out


#: The constructor parameter of each runtime that replaces the worker's command line.
_COMMAND_PARAMETER = {"process": "argv", "docker": "entrypoint", "kubernetes": "entrypoint"}


def build_runtime(
    settings: Settings, *, worker_command: Sequence[str] | None = None, **extra: Any
) -> Runtime:
    """The worker runtime the settings name, without a pool.

    ``worker_command`` replaces the worker's command line and ``extra`` adds constructor arguments:
    for operator tools that measure a worker (``codemode quotas tune``), never for serving.
    """
    kind = settings.runtime
    try:
        if kind == "process":
            from ..runtimes.process import ProcessRuntime as cls
        elif kind == "docker":
            from ..runtimes.docker import DockerRuntime as cls  # type: ignore[assignment]
        else:
            from ..runtimes.kubernetes import KubernetesRuntime as cls  # type: ignore[assignment]
    except ImportError as exc:
        raise ConfigError(f"{names('runtime')}: the {kind} runtime is not installed: {exc}") from None
    try:
        kwargs = {**_runtime_kwargs(settings), **extra}
        if worker_command is not None:
            kwargs[_COMMAND_PARAMETER[kind]] = list(worker_command)
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"--{kind}-* / CODEMODE_{kind.upper()}_*: {exc}") from None


def with_pool(runtime: Runtime, settings: Settings) -> Runtime:
    """``runtime`` behind a :class:`WarmPool` of ``settings.pool`` workers (unchanged when 0)."""
    return WarmPool(runtime, settings.pool) if settings.pool > 0 else runtime


def _pack_settings(settings: Settings, environ: Mapping[str, str] | None) -> PackSettings:
    return PackSettings(
        environ=dict(os.environ if environ is None else environ),
        options=settings.pack_option_map,
        data_dir=settings.pack_data_dir,
        answer_bounds=answer_bounds(settings.limits.resolved()),
    )


def load_capabilities(settings: Settings, environ: Mapping[str, str] | None = None) -> list[Capability]:
    """The capabilities of every ``--pack`` (upstream tables: :func:`upstream_packs`)."""
    try:
        caps = load_packs(settings.packs, _pack_settings(settings, environ))
    except PackError as exc:
        raise ConfigError(f"{names('packs')}: {_one_line(str(exc))}") from None
    if not settings.packs and not settings.upstream_mcp and not settings.openapi:
        log.warning("no capability packs configured (--pack / CODEMODE_PACKS): the catalog is empty")
    return caps


def upstream_packs(settings: Settings) -> list[Any]:
    """The packs of the ``[[upstream_mcp]]`` and ``[[openapi]]`` tables (none when there are none)."""
    if not settings.upstream_mcp and not settings.openapi:
        return []
    from ..capabilities.upstreams import upstream_packs as build

    try:
        return list(build(settings.upstream_mcp, settings.openapi))
    except PackError as exc:
        raise ConfigError(f"--config / CODEMODE_CONFIG: {_one_line(str(exc))}") from None


def build_server(
    settings: Settings,
    *,
    runtime: Runtime | None = None,
    authorizer: authz.Authorizer | None = None,
    observer: Observer | None = None,
    capabilities: list[Capability] | None = None,
) -> Server:
    """A built (not yet started) server: packs, authorizer, runtime + pool, limits and quota.

    ``runtime``, ``authorizer`` and ``capabilities`` replace what the settings would build (tests and
    operator tools measure with their own); the pool of ``settings.pool`` wraps ``runtime`` either way.
    """
    auth = authorizer if authorizer is not None else build_authorizer(settings)
    caps = capabilities if capabilities is not None else load_capabilities(settings)
    upstreams = upstream_packs(settings) if capabilities is None else []
    for pack in upstreams:
        try:
            caps = [*caps, *pack.capabilities(_pack_settings(settings, None))]
        except PackError as exc:
            raise ConfigError(f"--config / CODEMODE_CONFIG: {_one_line(str(exc))}") from None
    base = runtime if runtime is not None else build_runtime(settings)
    builder = Builder(
        authorizer=auth,
        limits=settings.limits,
        disabled=settings.disable,
        runtime=with_pool(base, settings),
        observer=observer,
        subject_quota=settings.subject_quota,
        reserved_slots=settings.effective_reserved_slots,
    )
    builder.register(*caps)
    try:
        server = builder.build()
    except InvalidRegistration as exc:
        raise ConfigError(f"{names('packs')}: {_one_line(str(exc))}") from None
    for pack in upstreams:
        server.attach(pack)
    return server


def _one_line(text: str) -> str:
    return "; ".join(part.strip(" -").removesuffix(":") for part in text.splitlines() if part.strip(" -"))
