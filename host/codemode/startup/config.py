"""The one settings model of codemode: every front end (``serve --stdio``, ``serve --http``,
``quotas tune``, ``bench``) reads its configuration through :func:`load_settings`.

Precedence, highest first: keyword overrides (what the CLI passes for the flags given on its command
line), ``CODEMODE_*`` environment variables, the TOML file named by ``--config`` / ``CODEMODE_CONFIG``,
then the defaults below. Each setting's environment name is its field name upper-cased with the
``CODEMODE_`` prefix, and its flag is the field name with ``-`` for ``_`` (``pool`` →
``--pool`` / ``CODEMODE_POOL``); :func:`names` gives both, and every :class:`ConfigError` names them.
Limits may also be written as a ``[limits]`` table in TOML. List settings accept JSON
(``["a:b", "c:d"]``) or a comma-separated string in the environment.

One setting holds a secret: ``store`` when it is a PostgreSQL URI with a password. It is kept out
of the settings' repr, no error quotes it, and the store names its server by host, port and
database only. Everything else here is public: the token file holds SHA-256 hashes only, JWKS are
public keys.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import getpass
import ipaddress
import json
import logging
import os
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ..execution.admission import Admission, default_quota, default_reserve
from ..execution.limits import DEFAULT_SUBJECT_QUOTA, DEFAULTS, FLOAT_LIMITS, MINIMUMS, SUMMARIES, Limits
from ..runtimes.options import OPTIONS, DockerOptions, KubernetesOptions, ProcessOptions, RuntimeOptions

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "FLAGS",
    "LIMIT_FIELDS",
    "LIST_SETTINGS",
    "OTHER_VARIABLES",
    "POD_NAMESPACE_FILE",
    "RENAMED",
    "SIZE_SETTINGS",
    "ConfigError",
    "Settings",
    "StrList",
    "default_data_dir",
    "default_token_file",
    "env_var",
    "flag",
    "load_settings",
    "misspelled_variables",
    "names",
    "parse_size",
]

#: The variable naming the TOML settings file (``--config``).
CONFIG_ENV = "CODEMODE_CONFIG"
#: The prefix of every setting's environment variable.
ENV_PREFIX = "CODEMODE_"
#: A pod's own namespace (the default of ``quota_namespace`` in a cluster).
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

log = logging.getLogger("codemode.config")

_config_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "codemode_config_file", default=None
)


class ConfigError(ValueError):
    """The configuration is unusable. The message is one line naming the setting's flag and
    environment variable; front ends print it and exit 2."""


#: Settings whose command-line flag is not the field name (the repeatable ones are singular).
FLAGS = {
    "packs": "--pack",
    "pack_options": "--pack-option",
    "allowed_hosts": "--allowed-host",
    "allowed_origins": "--allowed-origin",
    "jwt_algorithms": "--jwt-algorithm",
    "trusted_proxies": "--trusted-proxy",
}


def flag(field: str) -> str:
    """The command-line flag of a settings field.

    Args:
        field: the field name.

    Returns:
        Its flag (``--max-execution-time``; the repeatable ones are singular, see :data:`FLAGS`).
    """
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def env_var(field: str) -> str:
    """The environment variable of a settings field.

    Args:
        field: the field name.

    Returns:
        ``CODEMODE_`` and the name in upper case.
    """
    return ENV_PREFIX + field.upper()


def names(field: str) -> str:
    """``--flag / CODEMODE_FIELD`` for a settings field (what every configuration error cites).

    Args:
        field: the field name.

    Returns:
        The flag and the variable.
    """
    return f"{flag(field)} / {env_var(field)}"


def default_token_file() -> Path:
    """Where ``codemode token`` and ``serve --http`` look for the token file when none is named:
    ``$XDG_CONFIG_HOME/codemode/codemode.tokens`` (``~/.config/...``), never the working directory.

    Returns:
        The path.
    """
    base = os.environ.get("XDG_CONFIG_HOME", "").strip()
    root = Path(base) if base else Path.home() / ".config"
    return root / "codemode" / "codemode.tokens"


def default_data_dir() -> Path:
    """Where ``serve --http`` lets packs keep state when ``data_dir`` is not given:
    ``$XDG_DATA_HOME/codemode`` (``~/.local/share/codemode``).

    Returns:
        The path.
    """
    base = os.environ.get("XDG_DATA_HOME", "").strip()
    root = Path(base) if base else Path.home() / ".local" / "share"
    return root / "codemode"


def _split_list(value: Any) -> Any:
    """Environment lists: JSON arrays or comma-separated strings."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


#: A list setting: from the environment a JSON array or a comma-separated string.
StrList = Annotated[list[str], NoDecode]


LIMIT_FIELDS = tuple(f.name for f in dataclasses.fields(Limits))


def _limit(name: str) -> Any:
    """The setting of the limit ``name``: its default, minimum and text come from ``Limits``."""
    default, minimum = DEFAULTS[name], MINIMUMS[name]
    if name in FLOAT_LIMITS:
        return Field(float(default), gt=minimum, description=SUMMARIES[name])
    return Field(int(default), ge=minimum, description=SUMMARIES[name])


#: Settings that hold a list (JSON or comma-separated in the environment, a repeatable flag).
LIST_SETTINGS = (
    "jwt_algorithms",
    "packs",
    "pack_options",
    "disable",
    "rego_policy",
    "allowed_hosts",
    "allowed_origins",
    "trusted_proxies",
)

#: Settings that hold a size (bytes, or ``256m``/``1g``); the runtimes take them in bytes.
SIZE_SETTINGS = ("docker_memory", "process_memory")

#: Earlier names of settings, still accepted as a flag, an environment variable, a TOML key or a
#: keyword (one name per concept across runtimes: docs/configuration.md, "One name per setting").
RENAMED = {"docker_pids": "docker_max_processes"}


class Settings(BaseSettings):
    """Everything a front end needs. See docs/configuration.md for each setting."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        validate_default=True,
    )
    #: Where these settings were read from, for problems found after loading (:meth:`origin`).
    _origin: str = PrivateAttr(default="settings")

    def origin(self) -> str:
        """Where a problem of these settings is, for its one line: the configuration file
        (``--config / CODEMODE_CONFIG: 'path'``) when one was read, else ``settings``.

        Returns:
            The origin, without a trailing colon.
        """
        return self._origin

    # ---------------------------------------------------------------------------- front end
    transport: Literal["stdio", "http"] | None = Field(
        None, description="how MCP is served: stdio (one local client) or http (the service)"
    )
    subject: str | None = Field(None, description="subject id of the single stdio client")
    log_level: str = Field("info", description="host log level on stderr")

    # ---------------------------------------------------------------------------- listening (http)
    host: str = Field("127.0.0.1", description="listen address")
    port: int = Field(8000, ge=0, le=65535, description="listen port")
    metrics_port: int = Field(
        9464,
        ge=0,
        le=65535,
        description="port of the separate /metrics server (0 = any free port); never the --port server",
    )
    metrics_host: str | None = Field(
        None, description="interface of the metrics port (default 127.0.0.1, not --host)"
    )
    health_port: int = Field(
        8001,
        ge=0,
        le=65535,
        description="port of the separate /healthz and /readyz server for probes (0 = any free port)",
    )
    health_host: str | None = Field(None, description="interface of the health port (default: --host)")
    audit_log: str = Field(
        "stderr", description="where audit JSON lines go: stderr, stdout, a file path, or none"
    )
    auth_failure_window: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="seconds of one audit window for refused /mcp requests: per client address the "
        "first is one line, the rest one summary line with their count",
    )

    # ---------------------------------------------------------------------------- authentication (http)
    auth_mode: Literal["token_file", "jwt"] = Field("token_file", description="bearer token file or JWT")
    token_file: Path | None = Field(None, description="bearer-token hash file (codemode token new)")
    jwks_file: Path | None = Field(None, description="JWKS file (auth_mode jwt)")
    jwks_url: str | None = Field(None, description="JWKS URL, https or loopback http (auth_mode jwt)")
    jwt_issuer: str | None = Field(None, description="required JWT issuer (auth_mode jwt)")
    jwt_audience: str | None = Field(None, description="required JWT audience (auth_mode jwt)")
    jwt_algorithms: StrList = Field(
        default_factory=lambda: ["RS256", "ES256"], description="accepted JWT algorithms"
    )
    jwt_leeway_seconds: float = Field(30.0, ge=0, le=300, description="clock leeway in seconds")
    jwt_max_lifetime_seconds: float = Field(
        86400.0,
        gt=0,
        description="longest JWT lifetime accepted (exp - iat, both required); a longer one is refused",
    )
    jwks_cache_seconds: float = Field(300.0, gt=0, description="seconds a fetched JWKS is kept")

    # ---------------------------------------------------------------------------- catalog & policy
    packs: StrList = Field(
        default_factory=list, description="capability packs, module:object or ./file.py:object"
    )
    pack_options: StrList = Field(default_factory=list, description="KEY=VALUE options handed to packs")
    disable: StrList = Field(default_factory=list, description="capability ids removed at build time")
    data_dir: Path | None = Field(
        None,
        description=(
            "directory where packs keep state on disk (serve --http default: "
            "$XDG_DATA_HOME/codemode, i.e. ~/.local/share/codemode; serve --stdio: in memory)"
        ),
    )
    allow_all: bool = Field(False, description="allow every call of every subject (explicit)")
    rego_policy: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, description="Rego v1 module files for the in-process Rego authorizer"
    )
    upstream_mcp: list[dict[str, Any]] = Field(
        default_factory=list,
        description="upstream MCP servers as [[upstream_mcp]] TOML tables (docs/packs.md)",
    )
    openapi: list[dict[str, Any]] = Field(
        default_factory=list, description="OpenAPI documents as [[openapi]] TOML tables (docs/packs.md)"
    )
    rego_decision: str | None = Field(None, description="ground decision reference, e.g. data.codemode.allow")
    rego_evaluate_inline: bool = Field(
        False,
        description=(
            "evaluate the Rego policy on the event loop's thread (faster per call; only for policies "
            "whose evaluation time is bounded whatever the input: it cannot be stopped at a deadline)"
        ),
    )
    rego_bounded_inline: bool = Field(
        True,
        description=(
            "evaluate a bounded Rego policy (nothing in it can iterate, docs/authz.md) on the event "
            "loop's thread when the input is small; off: every decision goes to an evaluation thread"
        ),
    )

    # ---------------------------------------------------------------------------- runtime
    runtime: Literal["process", "docker", "kubernetes"] = Field("process", description="where workers run")
    pool: int = Field(
        0,
        ge=0,
        description="warm workers kept ready (0 = none); with --pool-max: the fewest kept; in the reuse "
        "mode: sandboxes kept idle in all",
    )
    pool_max: int | None = Field(
        None,
        ge=0,
        description="the most warm workers the measured demand may keep ready: between --pool and this, "
        "the pool keeps arrival rate (over 2 s) x spawn time x 2, its peak held 10 s (unset: the pool "
        "stays at --pool); in the reuse mode: the most sandboxes kept, between --pool and this the "
        "subjects active in the last 10 s plus that product for leases that found none of their own",
    )
    pool_refill_concurrency: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="warm workers (reuse mode: sandboxes) the pool starts at once at most (unset: all "
        "missing at once on kubernetes and the process template, one per CPU otherwise)",
    )
    pool_subject_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="the fraction of the warm pool one subject may take before the pool has refilled it "
        "(reuse mode: of --pool, counting the sandboxes it holds), while another subject competes (waits "
        "for a sandbox or was served within the last 10 s); past it that subject's executes start cold, "
        "and a lone subject takes any warm one (1 = no cap; unset: 0.5, or 1 with --stdio, which serves "
        "one subject)",
    )
    reuse_executes: int = Field(
        0,
        ge=0,
        description="the reuse mode (docker, kubernetes; an operator's choice): a sandbox serves up to this "
        "many executes of its one subject, a fresh scrubbed worker process each (0 = off: one fresh sandbox "
        "per execute)",
    )
    reuse_idle_seconds: float = Field(
        60.0,
        gt=0,
        le=86400,
        description="the reuse mode: seconds a sandbox is kept for its subject without an execute",
    )
    process_spawn: Literal["template", "classic"] | None = Field(
        None,
        description="how worker processes are made: template (default: forked from a pre-imported "
        "worker template) or classic (python -I started for each worker)",
    )
    process_memory: str | None = Field(
        None, description="worker address-space limit (RLIMIT_AS), bytes or 512m/2g (default 2g)"
    )
    process_cpu_seconds: float | None = Field(
        None, gt=0, description="worker CPU time limit in seconds (RLIMIT_CPU, default 30)"
    )
    process_open_files: int | None = Field(
        None, gt=0, description="worker open files limit (RLIMIT_NOFILE, default 32)"
    )
    process_max_processes: int | None = Field(
        None,
        gt=0,
        description="processes and threads per worker uid (RLIMIT_NPROC; host as root; default 16)",
    )
    process_worker_uid_base: int | None = Field(
        None,
        ge=0,
        description="first worker uid when the host runs as root (default 1000000000; 0 = no uid change)",
    )
    process_worker_uids: int | None = Field(
        None, gt=0, description="worker uids to hand out, one per live worker (default 4096)"
    )
    docker_image: str | None = Field(None, description="worker image (default codemode-worker:<protocol>)")
    docker_base_url: str | None = Field(
        None, description="Docker Engine endpoint (default: DOCKER_HOST or the local socket)"
    )
    docker_memory: str | None = Field(
        None, description="worker memory (= memory+swap) limit, bytes or 256m/1g (default 256m)"
    )
    docker_cpus: float | None = Field(None, gt=0, description="worker CPU quota in CPUs (default 1)")
    docker_max_processes: int | None = Field(
        None, gt=0, description="processes and threads per worker (pids limit, default 64)"
    )
    docker_open_files: int | None = Field(
        None, gt=0, description="worker open files limit (RLIMIT_NOFILE, default 64)"
    )
    docker_oci_runtime: str | None = Field(None, description="OCI runtime such as runsc (gVisor)")
    kubernetes_namespace: str | None = Field(
        None, description="namespace of worker pods (default codemode-workers)"
    )
    kubernetes_image: str | None = Field(None, description="worker image for pods")
    kubernetes_memory: str | None = Field(
        None, description="memory request = limit of a worker pod, e.g. 256Mi"
    )
    kubernetes_cpu: str | None = Field(None, description="CPU limit of a worker pod, e.g. 500m")
    kubernetes_cpu_request: str | None = Field(
        None, description="CPU request of a worker pod, e.g. 100m (default 100m: Burstable QoS)"
    )
    kubernetes_runtime_class: str | None = Field(None, description="RuntimeClass of worker pods, e.g. gvisor")
    kubernetes_seccomp_profile: str | None = Field(
        None,
        description="Localhost seccomp profile of worker pods, relative to the kubelet's seccomp root "
        "(default RuntimeDefault)",
    )
    kubernetes_kubeconfig: Path | None = Field(
        None, description="kubeconfig file (default: in-cluster, then $KUBECONFIG / ~/.kube/config)"
    )
    kubernetes_context: str | None = Field(None, description="kubeconfig context")

    # ---------------------------------------------------------------------------- limits & quota
    max_source_bytes: int = _limit("max_source_bytes")
    max_execution_steps: int = _limit("max_execution_steps")
    max_execution_time: float = _limit("max_execution_time")
    max_native_calls: int = _limit("max_native_calls")
    max_value_depth: int = _limit("max_value_depth")
    max_value_bytes: int = _limit("max_value_bytes")
    max_intermediate_value_bytes: int = _limit("max_intermediate_value_bytes")
    max_search_query_bytes: int = _limit("max_search_query_bytes")
    max_search_results: int = _limit("max_search_results")
    max_concurrent_executions: int = _limit("max_concurrent_executions")
    max_search_response_bytes: int = _limit("max_search_response_bytes")
    max_callstack: int = _limit("max_callstack")
    max_describe_response_bytes: int = _limit("max_describe_response_bytes")
    max_print_bytes: int = _limit("max_print_bytes")
    max_approval_time: float = _limit("max_approval_time")
    max_pending_approvals: int = _limit("max_pending_approvals")
    max_approval_wait: float = _limit("max_approval_wait")
    max_suspension_bytes: int = _limit("max_suspension_bytes")
    max_state_keys: int = _limit("max_state_keys")
    max_state_bytes: int = _limit("max_state_bytes")
    max_parallel_calls: int = _limit("max_parallel_calls")
    subject_quota: int = Field(
        DEFAULT_SUBJECT_QUOTA,
        ge=0,
        description=(
            "concurrent executes per subject (0 = no quota; when not given: "
            f"{DEFAULT_SUBJECT_QUOTA} with --http, at most max_concurrent_executions - reserved_slots; "
            "0 with --stdio, whose one static subject may use every slot)"
        ),
    )
    reserved_slots: int | None = Field(
        None,
        ge=0,
        description=(
            "worker slots kept for subjects with nothing in flight "
            "(default with --http: a quarter of max_concurrent_executions, at least 1; with --stdio: 0)"
        ),
    )

    quota_store: Literal["local", "kubernetes"] = Field(
        "local",
        description=(
            "where subject_quota is counted: local (each replica alone) or kubernetes "
            "(Lease objects shared by every replica; fails closed when the API is unreachable)"
        ),
    )
    quota_namespace: str | None = Field(
        None, description="namespace of the quota Leases (default in a pod: its own namespace)"
    )
    quota_kubeconfig: Path | None = Field(
        None, description="kubeconfig of the quota store (default: in-cluster, else $KUBECONFIG)"
    )
    quota_lease_seconds: int = Field(
        15, ge=3, le=3600, description="seconds a dead replica's quota holds outlive its last renewal"
    )
    quota_store_timeout: float = Field(
        2.0, gt=0, le=60, description="seconds the quota store may take to admit an execute"
    )
    store: str | None = Field(
        None,
        repr=False,  # a PostgreSQL URI may hold a password
        description=(
            "where suspended executes and state keys are kept: sqlite (a file in the data dir), "
            "memory (gone with the process) or a postgresql:// URI shared by replicas "
            "(default: sqlite when there is a data dir, else memory)"
        ),
    )
    store_timeout: float = Field(
        2.0,
        gt=0,
        le=60,
        description="seconds one operation of the PostgreSQL store may take (then: unavailable)",
    )

    # ---------------------------------------------------------------------------- MCP transport (http)
    mcp_stateless: bool = Field(True, description="stateless streamable HTTP (no server-side session)")
    mcp_json_response: bool = Field(False, description="answer with JSON instead of an event stream")
    max_sessions: int = Field(
        1000, gt=0, description="stateful mode: open MCP sessions of all subjects; more get 503"
    )
    max_sessions_per_subject: int = Field(
        50,
        gt=0,
        description="stateful mode: open MCP sessions of one subject (less than max_sessions); one more "
        "closes the subject's session idle the longest, or gets 429 when none is idle",
    )
    session_idle_timeout: float = Field(
        300.0,
        gt=0,
        description="stateful mode: seconds a session may have no request in flight (no POST "
        "being served, no event stream open) before it is closed",
    )
    max_request_body_bytes: int = Field(1024 * 1024, gt=0, description="bytes of one HTTP request body")
    allowed_hosts: StrList = Field(
        default_factory=list,
        description="Host header allow-list (host:port or host:*); empty = the loopback names when "
        "host is a loopback address, else off",
    )
    allowed_origins: StrList = Field(default_factory=list, description="Origin allow-list; empty = off")
    max_open_requests_per_subject: int = Field(
        16, gt=0, description="open /mcp requests (and event streams) of one subject; more get 429"
    )
    max_open_requests: int = Field(256, gt=0, description="open /mcp requests of all subjects; more get 429")
    stream_idle_timeout: float = Field(
        60.0, gt=0, description="seconds an /mcp event stream may send nothing before the host ends it"
    )
    max_stream_seconds: float = Field(3600.0, gt=0, description="seconds an /mcp event stream may stay open")
    max_connections: int | None = Field(
        None,
        gt=0,
        description="open HTTP connections and requests the server accepts; more get 503 "
        "(default: half the file-descriptor limit, at most 1000)",
    )
    max_connections_per_subject: int | None = Field(
        None,
        gt=0,
        description="open HTTP connections of one subject (counted from its first authenticated "
        "request; less than max_connections); more get 429 and are closed (default: 4 x "
        "max_open_requests_per_subject, at most half of max_connections)",
    )
    backlog: int = Field(128, gt=0, description="listen backlog of the main port")
    header_timeout: float = Field(
        5.0,
        gt=0,
        le=300,
        description="seconds a connection may take to send a complete request head (from accept, "
        "and from the first byte of each later request); slower connections are closed",
    )
    write_timeout: float = Field(
        10.0,
        gt=0,
        le=300,
        description="seconds an answer may wait unsent because the client does not read it (its "
        "TCP window stays full); such connections are closed",
    )
    max_unauthenticated_connections_per_address: int = Field(
        32,
        gt=0,
        description="connections one client address (IPv6: its /64) may hold open before one of "
        "them carries an authenticated request; more are refused with 429",
    )
    trusted_proxies: StrList = Field(
        default_factory=list,
        description="addresses or networks (CIDR) of proxies whose forwarded client address is "
        "believed (trusted_proxy_header); empty = the peer address is the client",
    )
    trusted_proxy_header: Literal["x-forwarded-for", "forwarded"] = Field(
        "x-forwarded-for",
        description="the one header the trusted proxies write: x-forwarded-for or forwarded (RFC 7239)",
    )

    # ---------------------------------------------------------------------------- traces
    trace_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces: one trace per "
        "execute (default: no tracing; OpenTelemetry is not even imported)",
    )
    trace_service_name: str = Field(
        "codemode", min_length=1, max_length=200, description="service.name of the traces"
    )
    trace_subject: Literal["hash", "omit"] = Field(
        "hash",
        description="the subject on each execute span: hash (16 hex digits of a keyed SHA-256 of "
        "its id, a pseudonym of its own) or omit",
    )

    # ---------------------------------------------------------------------------- lifecycle (http)
    ready_check_timeout: float = Field(6.0, gt=0, description="seconds a /readyz runtime check may take")
    start_degraded: bool = Field(
        False,
        description=(
            "start even when a pack, an upstream or the runtime fails at start: a failed pack or "
            "upstream is left out (/readyz 503 until a restart), a failed runtime is retried "
            "(default: exit 2 with the problem in one line)"
        ),
    )
    shutdown_timeout: float = Field(30.0, ge=0, description="seconds to drain in-flight executes at shutdown")
    orphan_sweep_interval: float = Field(
        30.0,
        ge=0,
        description=(
            "seconds between runs of the orphan rule while serving (docker and kubernetes runtimes): "
            "a replica removes the workers of another host that provably died; 0 = at start only"
        ),
    )
    drain_delay: float = Field(
        0.0,
        ge=0,
        le=300,
        description=(
            "seconds between SIGTERM and closing the listener: /readyz answers 503 and every response "
            "says Connection: close, while new requests are still served, so a load balancer (a "
            "Kubernetes Service) stops sending before the port closes; then shutdown_timeout applies"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _flatten_limits(cls, data: Any) -> Any:
        """Accept ``limits = {...}`` / a ``[limits]`` table (or a ``codemode.Limits``) as flat fields,
        and likewise each runtime's table or options; earlier setting names as today's."""
        if isinstance(data, dict) and "limits" in data:
            data = dict(data)
            nested = data.pop("limits")
            if isinstance(nested, Limits):
                # the fields it changes: the others are left to the environment and the file
                nested = {k: v for k, v in dataclasses.asdict(nested).items() if v != DEFAULTS[k]}
            if not isinstance(nested, dict):
                raise ValueError("limits must be a table of limit values")
            unknown = sorted(set(nested) - set(LIMIT_FIELDS))
            if unknown:
                raise ValueError("; ".join(_unknown_limit(key) for key in unknown))
            for key, value in nested.items():
                data.setdefault(key, value)
        if isinstance(data, dict):
            # an earlier name left here came as a keyword (the other sources renamed their own): it wins
            data = _flatten_runtimes(_renamed(dict(data), "settings", override=True))
        return data

    @field_validator(*LIST_SETTINGS, mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("store")
    @classmethod
    def _store(cls, value: str | None) -> str | None:
        if value is None:
            return None
        text = value.strip()
        if text in ("sqlite", "memory") or text.startswith(("postgresql://", "postgres://")):
            return text
        # never quote the value: it may be a connection string with a password
        raise ValueError("must be sqlite, memory or a postgresql:// URI")

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item.strip(), strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network (CIDR)") from None
        return [item.strip() for item in value]

    @field_validator("jwt_algorithms")
    @classmethod
    def _algorithms(cls, value: list[str]) -> list[str]:
        allowed = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
        bad = [a for a in value if a not in allowed]
        if bad or not value:
            raise ValueError(f"must be a non-empty list of asymmetric algorithms from {sorted(allowed)}")
        return value

    @field_validator("trace_endpoint")
    @classmethod
    def _trace_endpoint(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            parts = urlsplit(value.strip())
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http or https URL such as http://127.0.0.1:4318/v1/traces")
        return value.strip()

    @field_validator("audit_log")
    @classmethod
    def _audit(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be stderr, stdout, none or a file path")
        return value.strip()

    @field_validator(*SIZE_SETTINGS, mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError("must be a byte count or a size such as 256m")
        text = str(value).strip()
        parse_size(text)
        return text

    @property
    def docker_memory_bytes(self) -> int | None:
        """``docker_memory`` in bytes (None when unset)."""
        return None if self.docker_memory is None else parse_size(self.docker_memory)

    @field_validator("pack_options")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        for item in value:
            key, sep, _ = item.partition("=")
            if not sep or not key.strip():
                raise ValueError("each pack option must be KEY=VALUE")
        return value

    @property
    def limits(self) -> Limits:
        """The ``codemode.Limits`` these settings describe."""
        return Limits(**{name: getattr(self, name) for name in LIMIT_FIELDS})

    @property
    def process(self) -> ProcessOptions:
        """The process runtime's options (``--process-*``, ``[process]``)."""
        return ProcessOptions(**self._options_of("process"))

    @property
    def docker(self) -> DockerOptions:
        """The Docker runtime's options (``--docker-*``, ``[docker]``)."""
        return DockerOptions(**self._options_of("docker"))

    @property
    def kubernetes(self) -> KubernetesOptions:
        """The Kubernetes runtime's options (``--kubernetes-*``, ``[kubernetes]``)."""
        return KubernetesOptions(**self._options_of("kubernetes"))

    @property
    def runtime_options(self) -> RuntimeOptions:
        """The options of the chosen runtime (``runtime``)."""
        options: RuntimeOptions = getattr(self, self.runtime)
        return options

    def _options_of(self, runtime: str) -> dict[str, Any]:
        """The options of ``runtime`` these settings set: an option with no setting, or whose
        setting is unset, keeps the options type's own default."""
        out = {}
        for f in dataclasses.fields(OPTIONS[runtime]):
            name = f"{runtime}_{f.name}"
            value = getattr(self, name, None)
            if value is not None:
                out[f.name] = parse_size(value) if name in SIZE_SETTINGS else value
        return out

    @property
    def pack_option_map(self) -> dict[str, str]:
        """``pack_options`` (``KEY=VALUE`` items) as a mapping; a later key replaces an earlier one."""
        out: dict[str, str] = {}
        for item in self.pack_options:
            key, _, value = item.partition("=")
            out[key.strip()] = value
        return out

    @property
    def effective_reserved_slots(self) -> int:
        """``reserved_slots``, or the reserve derived from ``max_concurrent_executions``."""
        if self.reserved_slots is not None:
            return self.reserved_slots
        return default_reserve(self.max_concurrent_executions)

    @property
    def admission(self) -> Admission:
        """The slots, quota and reserve these settings describe (checked when they were loaded)."""
        return Admission(self.max_concurrent_executions, self.subject_quota, self.effective_reserved_slots)

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        slots = self.max_concurrent_executions
        if self.transport == "stdio":
            # One static subject: nobody to protect it from, so it may use every slot.
            for name in ("subject_quota", "reserved_slots"):
                if name not in self.model_fields_set:
                    self.__dict__[name] = 0
        elif "subject_quota" not in self.model_fields_set and self.effective_reserved_slots < slots:
            # Not configured: the default quota, lowered so that one subject can reach it.
            self.__dict__["subject_quota"] = default_quota(slots, self.effective_reserved_slots)
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def problems(self) -> list[str]:
        """Cross-field configuration problems, each naming its flag and environment variable.

        Returns:
            The problems (empty when there are none).
        """
        out: list[str] = []
        if self.allow_all and (self.rego_policy or self.rego_decision):
            out.append(f"choose one authorizer: {names('allow_all')} or {names('rego_policy')}, not both")
        elif not self.allow_all:
            if not self.rego_policy and not self.rego_decision:
                out.append(
                    f"no authorizer: set {names('allow_all')} to allow every call explicitly, or "
                    f"{names('rego_policy')} with {names('rego_decision')}"
                )
            elif not self.rego_policy or not self.rego_decision:
                out.append(
                    f"the Rego authorizer needs both {names('rego_policy')} and {names('rego_decision')}"
                )
        if self.rego_evaluate_inline and not self.rego_policy:
            out.append(f"{names('rego_evaluate_inline')} applies to the Rego authorizer only")
        for path in self.rego_policy:
            problem = _unreadable(Path(path))
            if problem:
                out.append(f"{names('rego_policy')}: policy file {str(path)!r} {problem}")
        out += self._slot_problems()
        out += self._quota_problems()
        if self.store == "sqlite" and self.pack_data_dir is None:
            out.append(f"{names('store')} sqlite needs {names('data_dir')} (serve --stdio keeps no data dir)")
        if "store_timeout" in self.model_fields_set and self.store_kind != "postgres":
            out.append(f"{names('store_timeout')} applies to a PostgreSQL store ({names('store')})")
        if self.reuse_executes and self.runtime == "process":
            out.append(f"{names('reuse_executes')} needs {names('runtime')} docker or kubernetes")
        elif self.reuse_executes and not self.pool:
            out.append(
                f"{names('reuse_executes')} needs {names('pool')} > 0 "
                "(the sandboxes kept idle for their subjects)"
            )
        out += self._pool_problems()
        if "reuse_idle_seconds" in self.model_fields_set and not self.reuse_executes:
            out.append(
                f"{names('reuse_idle_seconds')} applies to the reuse mode only ({names('reuse_executes')})"
            )
        if self.max_print_bytes > self.max_value_bytes:
            out.append(f"{names('max_print_bytes')} must not exceed {names('max_value_bytes')}")
        for prefix in ("process", "docker", "kubernetes"):
            given = [
                f
                for f in type(self).model_fields
                if f.startswith(prefix + "_") and getattr(self, f) is not None
            ]
            if given and self.runtime != prefix:
                out.append(f"{names(given[0])} needs {names('runtime')} {prefix}")
        return out

    @property
    def store_kind(self) -> Literal["memory", "sqlite", "postgres"]:
        """The store in use: ``store``, else ``sqlite`` when there is a data dir
        (:attr:`pack_data_dir`), else ``memory``."""
        if self.store is None:
            return "sqlite" if self.pack_data_dir is not None else "memory"
        if self.store in ("sqlite", "memory"):
            return self.store  # type: ignore[return-value]
        return "postgres"

    @property
    def store_path(self) -> Path | None:
        """The SQLite store's file (``codemode-store.sqlite3`` in the data dir), or None when the store is
        not SQLite."""
        directory = self.pack_data_dir
        if self.store_kind != "sqlite" or directory is None:
            return None
        return directory / "codemode-store.sqlite3"

    @property
    def effective_quota_namespace(self) -> str | None:
        """``quota_namespace``, or in a pod its own namespace (None: neither)."""
        if self.quota_namespace is not None:
            return self.quota_namespace
        try:
            return POD_NAMESPACE_FILE.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None

    def _quota_problems(self) -> list[str]:
        if self.quota_store == "local":
            given = [f for f in ("quota_namespace", "quota_kubeconfig") if getattr(self, f) is not None]
            return [f"{names(given[0])} needs {names('quota_store')} kubernetes"] if given else []
        if self.effective_quota_namespace is None:
            return [f"{names('quota_store')} kubernetes needs {names('quota_namespace')} outside a pod"]
        return []

    def _pool_problems(self) -> list[str]:
        """The demand-sized warm pool's bounds (docs/reference/runtimes.md, "Warm pool")."""
        out: list[str] = []
        given = self.model_fields_set
        if self.pool_max is not None and self.pool_max < self.pool:
            out.append(f"{names('pool_max')} must be at least {names('pool')} ({self.pool})")
        if "pool_refill_concurrency" in given and not self.pool and not self.pool_max:
            out.append(f"{names('pool_refill_concurrency')} needs {names('pool')} or {names('pool_max')} > 0")
        return out

    def _slot_problems(self) -> list[str]:
        """Quota and slots are configured together (docs/service.md, "Fair slots"), in the words of
        the library's ``Builder`` (``codemode.execution.admission.Admission``)."""
        return Admission.problems_of(
            self.max_concurrent_executions, self.subject_quota, self.effective_reserved_slots, names
        )

    def http_problems(self) -> list[str]:
        """What ``serve --http`` needs beyond :meth:`problems`: authentication and listening.

        Returns:
            The problems (empty when there are none).
        """
        out: list[str] = []
        if self.auth_mode == "token_file":
            path = self.token_file_path
            problem = _unreadable(path)
            if problem:
                hint = (
                    f"create one with: codemode token new SUBJECT --token-file {path}"
                    if problem == "does not exist"
                    else "make it readable by the service's user: chown or chmod it"
                )
                out.append(f"{names('token_file')}: token file {str(path)!r} {problem} ({hint})")
        else:
            if (self.jwks_file is None) == (self.jwks_url is None):
                out.append(f"auth_mode jwt needs exactly one of {names('jwks_file')} and {names('jwks_url')}")
            if not self.jwt_issuer:
                out.append(f"auth_mode jwt needs {names('jwt_issuer')}")
            if not self.jwt_audience:
                out.append(f"auth_mode jwt needs {names('jwt_audience')}")
            if self.jwks_url is not None and not _safe_jwks_url(self.jwks_url):
                out.append(f"{names('jwks_url')}: must be https (plain http only for a loopback host)")
        if not self.mcp_stateless and self.max_sessions_per_subject >= self.max_sessions:
            out.append(
                f"{names('max_sessions_per_subject')}: must be less than {names('max_sessions')}, "
                "so that one subject cannot hold every session"
            )
        if (
            self.max_connections_per_subject is not None
            and self.max_connections is not None
            and self.max_connections_per_subject >= self.max_connections
        ):
            out.append(
                f"{names('max_connections_per_subject')}: must be less than {names('max_connections')}, "
                "so that one subject cannot hold every connection"
            )
        if self.metrics_port != 0 and self.metrics_port == self.port:
            out.append(f"{names('metrics_port')}: must differ from {names('port')}")
        if self.health_port != 0 and self.health_port in (self.port, self.metrics_port):
            out.append(
                f"{names('health_port')}: must differ from {names('port')} and {names('metrics_port')}"
            )
        return out

    @property
    def effective_pool_subject_share(self) -> float:
        """``pool_subject_share``, else 1 (no cap) for stdio, which serves one subject, else 0.5."""
        if self.pool_subject_share is not None:
            return self.pool_subject_share
        return 1.0 if self.transport == "stdio" else 0.5

    @property
    def pack_data_dir(self) -> Path | None:
        """The data directory handed to packs: ``data_dir``, else :func:`default_data_dir` for the HTTP
        service, else None (state in memory)."""
        if self.data_dir is not None:
            return self.data_dir
        return default_data_dir() if self.transport == "http" else None

    @property
    def metrics_host_address(self) -> str:
        """Where the metrics server listens: ``metrics_host``, else loopback (tenants reach ``host``)."""
        return self.metrics_host or "127.0.0.1"

    @property
    def health_host_address(self) -> str:
        """Where the health server listens: ``health_host``, else ``host`` (probes reach the pod)."""
        return self.health_host or self.host

    @property
    def token_file_path(self) -> Path:
        """The token file in use: ``token_file`` or :func:`default_token_file`."""
        return self.token_file if self.token_file is not None else default_token_file()

    @property
    def subject_id(self) -> str:
        """The stdio subject: ``subject`` or the OS user name."""
        if self.subject:
            return self.subject
        try:
            return getpass.getuser()
        except Exception:
            return "local"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, _EarlierEnv(settings_cls, env_settings)]
        path = _config_file.get()
        if path is None:
            env_path = os.environ.get(CONFIG_ENV, "").strip()
            path = Path(env_path) if env_path else None
        if path is not None:
            if not path.is_file():
                raise ConfigError(f"--config / {CONFIG_ENV}: config file {str(path)!r} does not exist")
            sources.append(_TomlSource(settings_cls, toml_file=path))
        return tuple(sources)


_PATH_KEYS = ("token_file", "jwks_file", "audit_log", "data_dir", "quota_kubeconfig")


def _renamed(data: dict[str, Any], origin: str, *, override: bool = False) -> dict[str, Any]:
    """``data`` with each earlier setting name (:data:`RENAMED`) under its name now; both given is
    an error naming ``origin`` (unless the earlier one ``override``s)."""
    for old, new in RENAMED.items():
        if old in data:
            if new in data and not override:
                raise ConfigError(f"{origin}: {old!r} is the earlier name of {new!r}: give one of them")
            data[new] = data.pop(old)
    return data


def _flatten_runtimes(data: dict[str, Any]) -> dict[str, Any]:
    """Accept a ``[docker]`` (``[process]``, ``[kubernetes]``) table, a dict or an options object
    (``codemode.runtimes.options``) as the flat ``docker_*`` settings; flat keys win."""
    for runtime, options_type in OPTIONS.items():
        if runtime not in data:
            continue
        nested = data.pop(runtime)
        if isinstance(nested, options_type):  # what differs from the options' own defaults
            default = options_type()
            nested = {
                f.name: getattr(nested, f.name)
                for f in dataclasses.fields(nested)
                if getattr(nested, f.name) != getattr(default, f.name)
            }
        if not isinstance(nested, dict):
            raise ValueError(f"{runtime} must be a table of {runtime} runtime options")
        flat = _renamed({f"{runtime}_{k}": v for k, v in nested.items()}, f"[{runtime}]")
        # The options an operator may set (the runtime's options type holds others, for code).
        known = {name for name in Settings.model_fields if name.startswith(f"{runtime}_")}
        unknown = sorted(k.removeprefix(runtime + "_") for k in set(flat) - known)
        if unknown:
            raise ValueError(f"{runtime}: unknown option(s) {unknown}")
        for key, value in flat.items():
            data.setdefault(key, value)
    return data


class _EarlierEnv(PydanticBaseSettingsSource):
    """The environment source, also reading each setting's earlier variable (:data:`RENAMED`)."""

    def __init__(self, settings_cls: type[BaseSettings], inner: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self._inner = inner

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads through the inner source

    def __call__(self) -> dict[str, Any]:
        data = dict(self._inner())
        for old, new in RENAMED.items():
            value = os.environ.get(env_var(old))
            if value is None:
                continue
            if new in data:
                raise ConfigError(f"{env_var(old)} is the earlier name of {env_var(new)}: set one of them")
            data[new] = value
        return data


class _TomlSource(TomlConfigSettingsSource):
    """A TOML file whose relative paths are relative to the file itself, not the working directory."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            data = super()._read_file(file_path)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"--config / {CONFIG_ENV}: {str(file_path)!r} is not valid TOML: {exc}"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--config / {CONFIG_ENV}: cannot read {str(file_path)!r}: {exc}") from None
        data = _renamed(data, f"--config / {CONFIG_ENV}: {str(file_path)!r}")
        base = Path(str(file_path)).resolve().parent
        for key in _PATH_KEYS:
            value = data.get(key)
            if isinstance(value, str) and value not in ("stderr", "stdout", "none") and value:
                data[key] = str(base / value)
        policies = data.get("rego_policy")
        if isinstance(policies, str):
            policies = [policies]
        if isinstance(policies, list):
            data["rego_policy"] = [str(base / p) if isinstance(p, str) else p for p in policies]
        return data


_SIZE = re.compile(r"^(\d+)\s*([kmg]?)(?:i?b)?$")
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(text: str) -> int:
    """Bytes of ``256m``/``1g``/``512k``/``1048576`` (binary units).

    Args:
        text: the size (a trailing ``b``/``ib`` is accepted, case does not matter).

    Returns:
        The byte count.

    Raises:
        ValueError: it is not a positive byte count or size.
    """
    match = _SIZE.match(text.strip().lower())
    if match is None or int(match.group(1)) <= 0:
        raise ValueError("must be a positive byte count or a size such as 256m")
    return int(match.group(1)) * _UNITS[match.group(2)]


def _safe_jwks_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    if parts.scheme == "https" and parts.hostname:
        return True
    if parts.scheme != "http" or not parts.hostname:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


@contextlib.contextmanager
def _using_config(path: Path | None) -> Iterator[None]:
    token = _config_file.set(path)
    try:
        yield
    finally:
        _config_file.reset(token)


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Settings from keyword overrides, the environment and a TOML file.

    Args:
        config_file: the TOML file; takes the place of ``CODEMODE_CONFIG``.
        overrides: setting values that win over the environment and the file (the flags).

    Returns:
        The settings.

    Raises:
        ConfigError: every problem (never quoting a value: ``store`` may hold a password).
    """
    from pydantic import ValidationError

    path = Path(config_file) if config_file is not None else None
    _warn_misspelled()
    with _using_config(path):
        try:
            settings = Settings(**overrides)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from None
        settings._origin = _config_origin()
        return settings


def _describe(exc: Any) -> str:
    """One line for a pydantic ``ValidationError``: each problem with its flag and variable."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = [str(p) for p in err["loc"]]
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and len(loc) == 1:
            parts.append(_unknown_setting(loc[0]))
        elif loc and loc[0] in Settings.model_fields:
            parts.append(f"{names(loc[0])}: {message}")
        elif loc:
            parts.append(f"{'.'.join(loc)}: {message}")
        else:
            parts.append(message)
    return "; ".join(parts)


def _config_path() -> str | None:
    path = _config_file.get()
    return str(path) if path is not None else (os.environ.get(CONFIG_ENV, "").strip() or None)


def _close_setting(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _config_origin() -> str:
    """Where a configuration problem is, for its one line: ``--config / CODEMODE_CONFIG: 'path'``
    when a file was read (the only source of a table or an unknown key), else ``settings``.

    Returns:
        The origin, without a trailing colon.
    """
    where = _config_path()
    return f"--config / {CONFIG_ENV}: {where!r}" if where else "settings"


def _unknown_setting(key: str) -> str:
    """An unknown key: in the configuration file (the only source that can hold one), with the
    closest setting name (the ``[limits]`` table's name among them: ``[limit]`` is a typo too)."""
    choices = [*Settings.model_fields, "limits"]
    return f"{_config_origin()}: unknown setting {key!r}{_close_setting(key, choices)}"


def _unknown_limit(key: str) -> str:
    """An unknown key of the ``[limits]`` table, said as an unknown top-level key is: where it
    is, and the closest limit name."""
    return f"{_config_origin()}: unknown limit {key!r} in [limits]{_close_setting(key, LIMIT_FIELDS)}"


#: ``CODEMODE_*`` variables the host reads that are not settings (packs read their own
#: ``CODEMODE_<PACK>_*`` variables; those are never compared with the settings).
#: ``CODEMODE_*`` variables that are not settings but are read (never flagged as misspelled).
OTHER_VARIABLES = frozenset({CONFIG_ENV, "CODEMODE_TRANSPORT"})
_warned: set[str] = set()


def misspelled_variables(environ: Mapping[str, str]) -> list[str]:
    """One warning per ``CODEMODE_*`` variable that is no setting but close to one (``did you
    mean``); variables close to no setting (a pack's options, say) are left alone.

    Args:
        environ: the environment.

    Returns:
        The warnings.
    """
    known = {env_var(field) for field in [*Settings.model_fields, *RENAMED]}
    out = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in known or name in OTHER_VARIABLES:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.88)
        if close:
            out.append(f"{name} is not a setting and is ignored: did you mean {close[0]}?")
    return out


def _warn_misspelled() -> None:
    for line in misspelled_variables(os.environ):
        if line not in _warned:
            _warned.add(line)
            log.warning("%s", line)


def _unreadable(path: Path) -> str | None:
    """Why ``path`` cannot be read as a configuration file, or None."""
    try:
        if not path.exists():
            return "does not exist"
        if not path.is_file():
            return "is not a regular file"
    except OSError as exc:  # a folder on the way cannot be searched by this user
        return f"cannot be reached by uid {os.getuid()} ({exc.strerror})"
    if not os.access(path, os.R_OK):
        return f"is not readable by uid {os.getuid()}"
    return None
