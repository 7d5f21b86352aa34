"""The ``codemode`` command line (SPEC §9, §10).

``codemode serve --stdio`` serves MCP on stdin/stdout for one local user (a static subject);
``codemode serve --http`` runs the FastAPI service of ``codemode.service``. Every ``serve`` flag also
reads a ``CODEMODE_*`` environment variable (the flag name upper-cased, ``-`` → ``_``); a flag given
on the command line wins, and the repeatable flags (``--pack``, ``--pack-option``, ``--disable``,
``--rego-policy``) add to the comma-separated environment lists. See ``docs/mcp.md``.

Exit codes: 0 clean shutdown, 1 the server failed at run time (e.g. the runtime could not start),
2 configuration or usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import getpass
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .limits import Limits
from .packs import split_specs

__all__ = [
    "ConfigError",
    "ServeConfig",
    "build_parser",
    "build_server",
    "http_overrides",
    "main",
    "make_authorizer",
    "make_runtime",
    "serve_config",
]

log = logging.getLogger("codemode.cli")

ENV_PREFIX = "CODEMODE_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_LIMIT_HELP = {
    "max_source_bytes": "bytes of program source",
    "max_execution_steps": "interpreter work units per execute",
    "max_execution_time": "seconds of wall time per execute (float)",
    "max_native_calls": "attempted capability calls per execute",
    "max_value_depth": "nesting depth of any crossing value",
    "max_value_bytes": "encoded bytes of any one crossing value",
    "max_intermediate_value_bytes": "sum of capability-result bytes per execute",
    "max_search_query_bytes": "bytes of a search query",
    "max_search_results": "results per search",
    "max_concurrent_executions": "concurrent spawns and live workers",
    "max_search_response_bytes": "bytes of a search response",
    "max_callstack": "Starlark call stack depth",
}
_SIZE = re.compile(r"^(\d+)\s*([kmg]?)(?:i?b)?$")
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


class ConfigError(Exception):
    """A configuration problem the operator must fix (exit code 2)."""


@dataclass
class ServeConfig:
    """Everything ``serve --stdio`` needs, after merging flags and ``CODEMODE_*`` variables."""

    transport: str = "stdio"
    packs: list[str] = field(default_factory=list)
    pack_options: dict[str, str] = field(default_factory=dict)
    allow_all: bool = False
    rego_policies: list[str] = field(default_factory=list)
    rego_decision: str | None = None
    limits: Limits = field(default_factory=Limits)
    runtime: str = "process"
    docker_image: str | None = None
    docker_base_url: str | None = None
    docker_memory: int | None = None
    docker_cpus: float | None = None
    docker_pids: int | None = None
    docker_oci_runtime: str | None = None
    pool: int = 0
    subject: str = ""
    disabled: list[str] = field(default_factory=list)
    log_level: str = "WARNING"


# --------------------------------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------------------------------


def _limit_fields() -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(Limits))


def _limit_kind(name: str) -> type[int] | type[float]:
    return float if name == "max_execution_time" else int


def _env_name(dest: str) -> str:
    return ENV_PREFIX + dest.upper()


def _add_serve(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="serve MCP over stdio or HTTP",
        description=(
            "Serve the three code-mode tools (search_api, describe_api, execute). Every option also "
            "reads CODEMODE_<OPTION> from the environment (e.g. CODEMODE_PACKS, CODEMODE_ALLOW_ALL, "
            "CODEMODE_MAX_EXECUTION_TIME); command-line flags win, repeatable flags add to the "
            "comma-separated environment lists."
        ),
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true", help="serve one local client on stdin/stdout")
    mode.add_argument(
        "--http", action="store_true", help="serve authenticated streamable HTTP at /mcp (codemode.service)"
    )
    h = p.add_argument_group("HTTP (--http only; see docs/service.md for authentication settings)")
    h.add_argument("--host", help="listen address (CODEMODE_HOST, default 127.0.0.1)")
    h.add_argument("--port", type=int, help="listen port (CODEMODE_PORT, default 8000)")
    h.add_argument("--config", metavar="FILE", help="service TOML configuration file (CODEMODE_CONFIG)")

    g = p.add_argument_group("capabilities")
    g.add_argument(
        "--pack",
        action="append",
        default=[],
        metavar="MODULE:OBJECT",
        help="load a capability pack (repeatable; CODEMODE_PACKS is comma-separated), "
        "e.g. codemode.capabilities.records:pack",
    )
    g.add_argument(
        "--pack-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="setting handed to packs (repeatable; CODEMODE_PACK_OPTIONS is comma-separated)",
    )
    g.add_argument(
        "--disable",
        action="append",
        default=[],
        metavar="ID",
        help="disable a capability by id (repeatable; CODEMODE_DISABLE is comma-separated)",
    )

    a = p.add_argument_group("authorization (exactly one is required)")
    a.add_argument(
        "--allow-all",
        action="store_true",
        default=None,
        help="explicitly allow every call of every subject (CODEMODE_ALLOW_ALL=1)",
    )
    a.add_argument(
        "--rego-policy",
        action="append",
        default=[],
        metavar="FILE",
        help="Rego v1 module file (repeatable; CODEMODE_REGO_POLICY is comma-separated)",
    )
    a.add_argument(
        "--rego-decision",
        metavar="REF",
        help="ground decision reference, e.g. data.codemode.allow (CODEMODE_REGO_DECISION)",
    )

    r = p.add_argument_group("runtime")
    r.add_argument(
        "--runtime",
        choices=["process", "docker"],
        help="where workers run (CODEMODE_RUNTIME, default process)",
    )
    r.add_argument("--pool", type=int, metavar="N", help="keep N warm workers ready (CODEMODE_POOL)")
    r.add_argument("--docker-image", metavar="IMAGE", help="worker image (CODEMODE_DOCKER_IMAGE)")
    r.add_argument(
        "--docker-base-url", metavar="URL", help="Docker Engine endpoint (CODEMODE_DOCKER_BASE_URL)"
    )
    r.add_argument(
        "--docker-memory", metavar="SIZE", help="worker memory+swap limit, e.g. 256m (CODEMODE_DOCKER_MEMORY)"
    )
    r.add_argument("--docker-cpus", type=float, metavar="N", help="worker CPU quota (CODEMODE_DOCKER_CPUS)")
    r.add_argument("--docker-pids", type=int, metavar="N", help="worker pids limit (CODEMODE_DOCKER_PIDS)")
    r.add_argument(
        "--docker-oci-runtime",
        metavar="NAME",
        help="OCI runtime such as runsc (CODEMODE_DOCKER_OCI_RUNTIME)",
    )

    lim = p.add_argument_group("limits (0 = the default)")
    for f in _limit_fields():
        lim.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=_limit_kind(f.name),
            metavar="N",
            help=f"{_LIMIT_HELP.get(f.name, f.name)} ({_env_name(f.name)})",
        )

    p.add_argument(
        "--subject",
        help="subject id for --stdio (CODEMODE_SUBJECT, default: the OS user name)",
    )
    p.add_argument("--log-level", help="host log level on stderr (CODEMODE_LOG_LEVEL, default WARNING)")


def _add_operator_tools(sub: Any) -> None:
    """``image audit``, ``quotas tune`` and ``bench`` (docs/operators.md)."""
    from . import benchcmd, image_audit, quotas

    image = sub.add_parser("image", help="worker image tools", description="Worker image tools.")
    image.set_defaults(group_help=image.format_help)
    image_sub = image.add_subparsers(dest="image_command", metavar="COMMAND")
    audit = image_sub.add_parser(
        "audit",
        help="audit a worker image against the hardening rules",
        description=(
            "Audit a worker image against the hardening rules: numeric non-root USER, entrypoint "
            "python3 -I -m codemode_worker, protocol and role labels, no secret-looking ENV, no "
            "exposed ports or volumes, no setuid/setgid or world-writable files (read from an "
            "export of a never-started container), shell presence (warning), and the protocol "
            "probe under the Docker runtime's hardening. Exit 0 when no check fails, 1 when one "
            "does, 2 when the audit could not run. See docs/operators.md."
        ),
    )
    image_audit.add_arguments(audit)
    quotas_group = sub.add_parser("quotas", help="cgroup quota tools", description="cgroup quota tools.")
    quotas_group.set_defaults(group_help=quotas_group.format_help)
    quotas_sub = quotas_group.add_subparsers(dest="quotas_command", metavar="COMMAND")
    tune = quotas_sub.add_parser(
        "tune",
        help="measure a workload to tune the worker cgroup quotas",
        description=(
            "Measure a workload to tune the worker cgroup quotas: run one program N times in fresh "
            "Docker workers with generous limits, read each container's peak memory, CPU time and "
            "pids from the Engine's stats, time each execute, and recommend --docker-memory, "
            "--docker-cpus, --docker-pids and --max-execution-time. See docs/operators.md for the "
            "method."
        ),
    )
    quotas.add_arguments(tune)
    bench = sub.add_parser(
        "bench",
        help="measure execute latency on this machine",
        description=(
            "Measure execute latency on this machine: trivial execute cold (no pool) and warm "
            "(warm pool), and one native call (warm); prints p50/p99 per series."
        ),
    )
    benchcmd.add_arguments(bench)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="codemode",
        description="Code-mode MCP server: search_api, describe_api and execute over a typed "
        "capability catalog; programs run in single-use sandboxed workers.",
    )
    parser.add_argument("--version", action="version", version=f"codemode {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_serve(sub)
    _add_operator_tools(sub)
    return parser


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


def _env_list(env: Mapping[str, str], name: str) -> list[str]:
    return [part.strip() for part in env.get(name, "").split(",") if part.strip()]


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name} must be one of 1/0/true/false/yes/no/on/off (got {raw!r})")


def _env_number(env: Mapping[str, str], name: str, kind: type[int] | type[float]) -> int | float | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        return kind(raw.strip())
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"{name} must be {what} (got {raw!r})") from None


def _pick(flag: Any, env: Mapping[str, str], name: str, default: Any) -> Any:
    if flag is not None:
        return flag
    raw = env.get(name)
    return raw.strip() if raw is not None and raw.strip() else default


def _options(values: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"pack option {item!r} must be KEY=VALUE")
        out[key.strip()] = value
    return out


def _size(text: str, label: str) -> int:
    match = _SIZE.match(text.strip().lower())
    if match is None or int(match.group(1)) <= 0:
        raise ConfigError(f"{label} must be a positive byte count or a size such as 256m (got {text!r})")
    return int(match.group(1)) * _UNITS[match.group(2)]


def transport_of(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    if args.stdio:
        return "stdio"
    if args.http:
        return "http"
    transport = str(_pick(None, env, "CODEMODE_TRANSPORT", "")).lower()
    if transport not in ("stdio", "http"):
        raise ConfigError("choose a transport: serve --stdio or serve --http (or CODEMODE_TRANSPORT)")
    return transport


def _limits(args: argparse.Namespace, env: Mapping[str, str]) -> Limits:
    values: dict[str, Any] = {}
    for f in _limit_fields():
        value = getattr(args, f.name)
        if value is None:
            value = _env_number(env, _env_name(f.name), _limit_kind(f.name))
        if value is not None:
            values[f.name] = value
    limits = Limits(**values)
    problems = limits.problems()
    if problems:
        raise ConfigError("; ".join(problems))
    return limits


def serve_config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ServeConfig:
    """Merge parsed ``serve`` flags with ``CODEMODE_*`` variables; raises :class:`ConfigError`."""
    env = os.environ if env is None else env
    transport = transport_of(args, env)
    pool = args.pool if args.pool is not None else _env_number(env, "CODEMODE_POOL", int)
    if pool is not None and pool < 0:
        raise ConfigError("--pool must not be negative")
    subject = _pick(args.subject, env, "CODEMODE_SUBJECT", None)
    if subject is None:
        try:
            subject = getpass.getuser()
        except Exception:
            subject = "local"
    allow_all = args.allow_all if args.allow_all is not None else _env_bool(env, "CODEMODE_ALLOW_ALL")
    memory = _pick(args.docker_memory, env, "CODEMODE_DOCKER_MEMORY", None)
    cpus = (
        args.docker_cpus if args.docker_cpus is not None else _env_number(env, "CODEMODE_DOCKER_CPUS", float)
    )
    pids = args.docker_pids if args.docker_pids is not None else _env_number(env, "CODEMODE_DOCKER_PIDS", int)
    return ServeConfig(
        transport=transport,
        packs=split_specs([*_env_list(env, "CODEMODE_PACKS"), *args.pack]),
        pack_options=_options([*_env_list(env, "CODEMODE_PACK_OPTIONS"), *args.pack_option]),
        allow_all=bool(allow_all),
        rego_policies=split_specs([*_env_list(env, "CODEMODE_REGO_POLICY"), *args.rego_policy]),
        rego_decision=_pick(args.rego_decision, env, "CODEMODE_REGO_DECISION", None),
        limits=_limits(args, env),
        runtime=str(_pick(args.runtime, env, "CODEMODE_RUNTIME", "process")).lower(),
        docker_image=_pick(args.docker_image, env, "CODEMODE_DOCKER_IMAGE", None),
        docker_base_url=_pick(args.docker_base_url, env, "CODEMODE_DOCKER_BASE_URL", None),
        docker_memory=_size(str(memory), "--docker-memory") if memory is not None else None,
        docker_cpus=float(cpus) if cpus is not None else None,
        docker_pids=int(pids) if pids is not None else None,
        docker_oci_runtime=_pick(args.docker_oci_runtime, env, "CODEMODE_DOCKER_OCI_RUNTIME", None),
        pool=int(pool or 0),
        subject=str(subject),
        disabled=split_specs([*_env_list(env, "CODEMODE_DISABLE"), *args.disable]),
        log_level=str(_pick(args.log_level, env, "CODEMODE_LOG_LEVEL", "WARNING")).upper(),
    )


def http_overrides(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``codemode.service`` settings given on the command line (the service reads the environment
    and ``CODEMODE_CONFIG`` itself; flags win, and repeatable flags add to the environment lists)."""
    env = os.environ if env is None else env
    if args.subject is not None:
        raise ConfigError("--subject is for --stdio: HTTP subjects come from bearer-token authentication")
    out: dict[str, Any] = {}
    for name in (
        "host",
        "port",
        "rego_decision",
        "runtime",
        "pool",
        "docker_image",
        "docker_base_url",
        "docker_memory",
        "docker_cpus",
        "docker_pids",
        "docker_oci_runtime",
        "log_level",
    ):
        value = getattr(args, name)
        if value is not None:
            out[name] = value
    if args.allow_all:
        out["allow_all"] = True
    for name, values, env_name in (
        ("packs", args.pack, "CODEMODE_PACKS"),
        ("pack_options", args.pack_option, "CODEMODE_PACK_OPTIONS"),
        ("disable", args.disable, "CODEMODE_DISABLE"),
        ("rego_policy", args.rego_policy, "CODEMODE_REGO_POLICY"),
    ):
        if values:
            out[name] = split_specs([*_env_list(env, env_name), *values])
    for f in _limit_fields():
        value = getattr(args, f.name)
        if value is not None:
            out[f.name] = value
    return out


# --------------------------------------------------------------------------------------------------
# Building the server
# --------------------------------------------------------------------------------------------------


def make_authorizer(config: ServeConfig) -> Any:
    from . import authz

    if config.allow_all and (config.rego_policies or config.rego_decision):
        raise ConfigError("choose one authorizer: --allow-all or --rego-policy/--rego-decision, not both")
    if config.allow_all:
        return authz.allow_all()
    if config.rego_policies or config.rego_decision:
        if not config.rego_policies or not config.rego_decision:
            raise ConfigError("--rego-policy FILE and --rego-decision data.<pkg>.<rule> go together")
        from .authz.rego import InvalidPolicy, from_files

        try:
            return from_files(config.rego_decision, config.rego_policies)
        except InvalidPolicy as exc:
            raise ConfigError(str(exc)) from None
    raise ConfigError(
        "no authorizer: pass --allow-all to allow every call explicitly, or "
        "--rego-policy FILE --rego-decision data.<pkg>.allow (or CODEMODE_ALLOW_ALL / "
        "CODEMODE_REGO_POLICY + CODEMODE_REGO_DECISION)"
    )


def _docker_kwargs(config: ServeConfig) -> dict[str, Any]:
    pairs: list[tuple[str, Any]] = [
        ("image", config.docker_image),
        ("base_url", config.docker_base_url),
        ("memory_bytes", config.docker_memory),
        ("cpus", config.docker_cpus),
        ("pids_limit", config.docker_pids),
        ("runtime", config.docker_oci_runtime),
    ]
    return {key: value for key, value in pairs if value is not None}


def make_runtime(config: ServeConfig) -> Any:
    from .runtimes.pool import WarmPool
    from .runtimes.process import ProcessRuntime

    runtime: Any
    docker_kwargs = _docker_kwargs(config)
    if config.runtime == "process":
        if docker_kwargs:
            raise ConfigError("the --docker-* options need --runtime docker")
        runtime = ProcessRuntime()
    elif config.runtime == "docker":
        try:
            from .runtimes.docker import DockerRuntime
        except ImportError as exc:
            raise ConfigError(f"the docker runtime is not available: {exc}") from None
        try:
            runtime = DockerRuntime(**docker_kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"docker runtime: {exc}") from None
    else:
        raise ConfigError(f"unknown runtime {config.runtime!r} (choose process or docker)")
    if config.pool > 0:
        runtime = WarmPool(runtime, config.pool)
    return runtime


def build_server(config: ServeConfig, environ: Mapping[str, str] | None = None) -> Any:
    """Load the packs and build a :class:`codemode.Server`; raises :class:`ConfigError`."""
    from .errors import InvalidRegistration
    from .packs import PackError, PackSettings, load_packs
    from .server import Builder

    settings = PackSettings(
        environ=dict(os.environ if environ is None else environ), options=dict(config.pack_options)
    )
    authorizer = make_authorizer(config)
    try:
        caps = load_packs(config.packs, settings)
    except PackError as exc:
        raise ConfigError(str(exc)) from None
    if not config.packs:
        log.warning("no capability packs configured (--pack / CODEMODE_PACKS): the catalog is empty")
    builder = Builder(
        authorizer=authorizer,
        limits=config.limits,
        disabled=config.disabled,
        runtime=make_runtime(config),
    )
    builder.register(*caps)
    try:
        return builder.build()
    except InvalidRegistration as exc:
        raise ConfigError(str(exc)) from None


# --------------------------------------------------------------------------------------------------
# Serving
# --------------------------------------------------------------------------------------------------


async def _serve_stdio(config: ServeConfig, server: Any) -> None:
    from mcp.server.stdio import stdio_server

    from .mcp import StaticSubject, create_server

    app = create_server(server, StaticSubject(config.subject))
    try:
        await server.start()
        async with stdio_server() as (read_stream, write_stream):
            await app.run(read_stream, write_stream, app.create_initialization_options())
    finally:
        await server.aclose()


def _serve_http(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    try:
        overrides = http_overrides(args, env)
    except ConfigError as exc:
        print(f"codemode: {exc}", file=sys.stderr)
        return 2
    try:
        from . import service
    except ImportError as exc:
        print(f"codemode: serve --http is not available in this installation: {exc}", file=sys.stderr)
        return 2
    load_settings = getattr(service, "load_settings", None)
    serve = getattr(service, "serve", None)
    if load_settings is None or serve is None:
        print(
            "codemode: serve --http is not available yet: codemode.service does not provide "
            "load_settings/serve in this build (use serve --stdio)",
            file=sys.stderr,
        )
        return 2
    try:
        settings = load_settings(config_file=args.config, **overrides)
    except Exception as exc:  # the service's ConfigError (a ValueError) and friends
        print(f"codemode: {exc}", file=sys.stderr)
        return 2
    try:
        with contextlib.suppress(KeyboardInterrupt):
            serve(settings)
    except Exception as exc:
        if type(exc).__name__ == "ConfigError":
            print(f"codemode: {exc}", file=sys.stderr)
            return 2
        log.debug("serve --http failed", exc_info=True)
        print(f"codemode: serve --http failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def _configure_logging(level: str) -> None:
    numeric = logging.getLevelName(level)
    if not isinstance(numeric, int):
        raise ConfigError(f"unknown log level {level!r}")
    logging.basicConfig(
        level=numeric, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _serve(args: argparse.Namespace) -> int:
    env = os.environ
    try:
        if transport_of(args, env) == "http":
            return _serve_http(args, env)
        config = serve_config(args, env)
        _configure_logging(config.log_level)
        server = build_server(config)
    except ConfigError as exc:
        print(f"codemode: {exc}", file=sys.stderr)
        return 2
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve_stdio(config, server))
    except Exception as exc:
        log.debug("serve failed", exc_info=True)
        print(f"codemode: serve failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "image":
        if args.image_command != "audit":
            print(args.group_help(), file=sys.stderr)
            return 2
        from . import image_audit

        return image_audit.run(args)
    if args.command == "quotas":
        if args.quotas_command != "tune":
            print(args.group_help(), file=sys.stderr)
            return 2
        from . import quotas

        return quotas.run(args)
    if args.command == "bench":
        from . import benchcmd

        return benchcmd.run(args)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
