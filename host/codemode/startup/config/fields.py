"""The settings' declarations: every setting with its type, default, constraints and facts
(:func:`~codemode.startup.config.facts.setting`), its own checks, and what follows from it alone.
:class:`~codemode.startup.config.model.Settings` adds the checks across settings and the sources."""

from __future__ import annotations

import dataclasses
import getpass
import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from ...execution.admission import Admission, default_reserve
from ...execution.limits import DEFAULT_SUBJECT_QUOTA, DEFAULTS, FLOAT_LIMITS, MINIMUMS, SUMMARIES, Limits
from ...runtimes.options import DockerOptions, KubernetesOptions, ProcessOptions
from . import places
from .facts import ENV_PREFIX, coerce, setting
from .tables import DockerTable, KubernetesTable, ProcessTable

#: A list setting: from the environment a JSON array or a comma-separated string.
StrList = Annotated[list[str], NoDecode]


def _limit(name: str) -> Any:
    """The setting of the limit ``name``: its default, minimum and text come from ``Limits``."""
    default, minimum = DEFAULTS[name], MINIMUMS[name]
    if name in FLOAT_LIMITS:
        return setting(float(default), SUMMARIES[name], group="limits", kind="duration", gt=minimum)
    return setting(int(default), SUMMARIES[name], group="limits", ge=minimum)


class SettingsFields(BaseSettings):
    """Every setting. See docs/configuration.md for each one."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="_",
        env_nested_max_split=1,
        extra="forbid",
        validate_default=True,
    )

    # ---------------------------------------------------------------------------- front end
    transport: Literal["stdio", "http"] | None = setting(
        None,
        description="how MCP is served: stdio (one local client) or http (the service)",
        flagged=False,
    )
    subject: str | None = setting(
        None,
        description="subject id of the single stdio client",
        mode="stdio",
        shown_default="the OS user name",
    )
    log_level: str = setting("info", description="host log level on stderr")

    # ---------------------------------------------------------------------------- listening (http)
    host: str = setting("127.0.0.1", description="listen address", mode="http")
    port: int = setting(8000, ge=0, le=65535, description="listen port", mode="http")
    metrics_port: int = setting(
        9464,
        ge=0,
        le=65535,
        description="port of the separate /metrics server (0 = any free port); never the --port server",
        mode="http",
    )
    metrics_host: str | None = setting(
        None,
        description="interface of the metrics port (default 127.0.0.1, not --host)",
        mode="http",
    )
    health_port: int = setting(
        8001,
        ge=0,
        le=65535,
        description="port of the separate /healthz and /readyz server for probes (0 = any free port)",
        mode="http",
    )
    health_host: str | None = setting(
        None, description="interface of the health port (default: --host)", mode="http"
    )
    audit_log: str = setting(
        "stderr",
        description="where audit JSON lines go: stderr, stdout, a file path, or none",
        mode="http",
        kind="path",
    )
    auth_failure_window: float = setting(
        10.0,
        gt=0,
        le=3600,
        description="seconds of one audit window for refused /mcp requests: per client address the "
        "first is one line, the rest one summary line with their count",
        mode="http",
        kind="duration",
    )

    # ---------------------------------------------------------------------------- authentication (http)
    auth_mode: Literal["token_file", "jwt"] = setting(
        "token_file", description="bearer token file or JWT", mode="http"
    )
    token_file: Path | None = setting(
        None,
        description="bearer-token hash file (codemode token new)",
        mode="http",
        kind="path",
        shown_default="~/.config/codemode/codemode.tokens",
    )
    jwks_file: Path | None = setting(None, description="JWKS file (auth_mode jwt)", mode="http", kind="path")
    jwks_url: str | None = setting(
        None, description="JWKS URL, https or loopback http (auth_mode jwt)", mode="http"
    )
    jwt_issuer: str | None = setting(None, description="required JWT issuer (auth_mode jwt)", mode="http")
    jwt_audience: str | None = setting(None, description="required JWT audience (auth_mode jwt)", mode="http")
    jwt_algorithms: StrList = setting(
        default_factory=lambda: ["RS256", "ES256"],
        description="accepted JWT algorithms",
        mode="http",
        kind="list",
        flag="--jwt-algorithm",
    )
    jwt_leeway_seconds: float = setting(
        30.0, ge=0, le=300, description="clock leeway in seconds", mode="http", kind="duration"
    )
    jwt_max_lifetime_seconds: float = setting(
        86400.0,
        gt=0,
        description="longest JWT lifetime accepted (exp - iat, both required); a longer one is refused",
        mode="http",
        kind="duration",
    )
    jwks_cache_seconds: float = setting(
        300.0, gt=0, description="seconds a fetched JWKS is kept", mode="http", kind="duration"
    )

    # ---------------------------------------------------------------------------- catalog & policy
    packs: StrList = setting(
        default_factory=list,
        description="capability packs, module:object or ./file.py:object",
        group="capabilities",
        kind="list",
        flag="--pack",
    )
    pack_options: StrList = setting(
        default_factory=list,
        description="KEY=VALUE options handed to packs",
        group="capabilities",
        kind="list",
        flag="--pack-option",
    )
    disable: StrList = setting(
        default_factory=list,
        description="capability ids removed at build time",
        group="capabilities",
        kind="list",
    )
    data_dir: Path | None = setting(
        None,
        description=(
            "directory where packs keep state on disk (serve --http default: "
            "$XDG_DATA_HOME/codemode, i.e. ~/.local/share/codemode; serve --stdio: in memory)"
        ),
        kind="path",
        metavar="DIR",
    )
    allow_all: bool = setting(
        False, description="allow every call of every subject (explicit)", group="authorization"
    )
    rego_policy: Annotated[list[Path], NoDecode] = setting(
        default_factory=list,
        description="Rego v1 module files for the in-process Rego authorizer",
        group="authorization",
        kind="paths",
    )
    upstream_mcp: list[dict[str, Any]] = setting(
        default_factory=list,
        description="upstream MCP servers as [[upstream_mcp]] TOML tables (docs/packs.md)",
        flagged=False,
    )
    openapi: list[dict[str, Any]] = setting(
        default_factory=list,
        description="OpenAPI documents as [[openapi]] TOML tables (docs/packs.md)",
        flagged=False,
    )
    rego_decision: str | None = setting(
        None, description="ground decision reference, e.g. data.codemode.allow", group="authorization"
    )
    rego_evaluate_inline: bool = setting(
        False,
        description=(
            "evaluate the Rego policy on the event loop's thread (faster per call; only for policies "
            "whose evaluation time is bounded whatever the input: it cannot be stopped at a deadline)"
        ),
        group="authorization",
    )
    rego_bounded_inline: bool = setting(
        True,
        description=(
            "evaluate a bounded Rego policy (nothing in it can iterate, docs/authz.md) on the event "
            "loop's thread when the input is small; off: every decision goes to an evaluation thread"
        ),
        group="authorization",
    )

    # ---------------------------------------------------------------------------- runtime
    runtime: Literal["process", "docker", "kubernetes"] = setting(
        "process", description="where workers run", group="runtime"
    )
    pool: int = setting(
        0,
        ge=0,
        description="warm workers kept ready (0 = none); with --pool-max: the fewest kept; in the reuse "
        "mode: sandboxes kept idle in all",
        group="runtime",
    )
    pool_max: int | None = setting(
        None,
        ge=0,
        description="the most warm workers the measured demand may keep ready: between --pool and this, "
        "the pool keeps arrival rate (over 2 s) x spawn time x 2, its peak held 10 s (unset: the pool "
        "stays at --pool); in the reuse mode: the most sandboxes kept, between --pool and this the "
        "subjects active in the last 10 s plus that product for leases that found none of their own",
        group="runtime",
    )
    pool_refill_concurrency: int | None = setting(
        None,
        ge=1,
        le=1024,
        description="warm workers (reuse mode: sandboxes) the pool starts at once at most (unset: all "
        "missing at once on kubernetes and the process template, one per CPU otherwise)",
        group="runtime",
    )
    pool_subject_share: float | None = setting(
        None,
        gt=0,
        le=1,
        description="the fraction of the warm pool one subject may take before the pool has refilled it "
        "(reuse mode: of --pool, counting the sandboxes it holds), while another subject competes (waits "
        "for a sandbox or was served within the last 10 s); past it that subject's executes start cold, "
        "and a lone subject takes any warm one (1 = no cap; unset: 0.5, or 1 with --stdio, which serves "
        "one subject)",
        group="runtime",
    )
    reuse_executes: int = setting(
        0,
        ge=0,
        description="the reuse mode (docker, kubernetes; an operator's choice): a sandbox serves up to this "
        "many executes of its one subject, a fresh scrubbed worker process each (0 = off: one fresh sandbox "
        "per execute)",
        group="runtime",
    )
    reuse_idle_seconds: float = setting(
        60.0,
        gt=0,
        le=86400,
        description="the reuse mode: seconds a sandbox is kept for its subject without an execute",
        group="runtime",
        kind="duration",
    )

    process: ProcessTable = setting(
        description="the process runtime's settings ([process])",
        group="runtime",
        flagged=False,
        default_factory=ProcessTable,
    )
    docker: DockerTable = setting(
        description="the Docker runtime's settings ([docker])",
        group="runtime",
        flagged=False,
        default_factory=DockerTable,
    )
    kubernetes: KubernetesTable = setting(
        description="the Kubernetes runtime's settings ([kubernetes])",
        group="runtime",
        flagged=False,
        default_factory=KubernetesTable,
    )

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
    subject_quota: int = setting(
        DEFAULT_SUBJECT_QUOTA,
        ge=0,
        description=(
            "concurrent executes per subject (0 = no quota; when not given: "
            f"{DEFAULT_SUBJECT_QUOTA} with --http, at most max_concurrent_executions - reserved_slots; "
            "0 with --stdio, whose one static subject may use every slot)"
        ),
        group="limits",
    )
    reserved_slots: int | None = setting(
        None,
        ge=0,
        description=(
            "worker slots kept for subjects with nothing in flight "
            "(default with --http: a quarter of max_concurrent_executions, at least 1; with --stdio: 0)"
        ),
        group="limits",
    )

    quota_store: Literal["local", "kubernetes"] = setting(
        "local",
        description=(
            "where subject_quota is counted: local (each replica alone) or kubernetes "
            "(Lease objects shared by every replica; fails closed when the API is unreachable)"
        ),
        group="limits",
    )
    quota_namespace: str | None = setting(
        None,
        description="namespace of the quota Leases (default in a pod: its own namespace)",
        group="limits",
    )
    quota_kubeconfig: Path | None = setting(
        None,
        description="kubeconfig of the quota store (default: in-cluster, else $KUBECONFIG)",
        group="limits",
        kind="path",
    )
    quota_lease_seconds: int = setting(
        15,
        ge=3,
        le=3600,
        description="seconds a dead replica's quota holds outlive its last renewal",
        group="limits",
        kind="duration",
    )
    quota_store_timeout: float = setting(
        2.0,
        gt=0,
        le=60,
        description="seconds the quota store may take to admit an execute",
        group="limits",
        kind="duration",
    )
    store: str | None = setting(
        None,
        repr=False,  # a PostgreSQL URI may hold a password
        description=(
            "where suspended executes and state keys are kept: sqlite (a file in the data dir), "
            "memory (gone with the process) or a postgresql:// URI shared by replicas "
            "(default: sqlite when there is a data dir, else memory)"
        ),
    )
    store_timeout: float = setting(
        2.0,
        gt=0,
        le=60,
        description="seconds one operation of the PostgreSQL store may take (then: unavailable)",
        kind="duration",
    )

    # ---------------------------------------------------------------------------- MCP transport (http)
    mcp_stateless: bool = setting(
        True, description="stateless streamable HTTP (no server-side session)", mode="http"
    )
    mcp_json_response: bool = setting(
        False, description="answer with JSON instead of an event stream", mode="http"
    )
    max_sessions: int = setting(
        1000,
        gt=0,
        description="stateful mode: open MCP sessions of all subjects; more get 503",
        mode="http",
    )
    max_sessions_per_subject: int = setting(
        50,
        gt=0,
        description="stateful mode: open MCP sessions of one subject (less than max_sessions); one more "
        "closes the subject's session idle the longest, or gets 429 when none is idle",
        mode="http",
    )
    session_idle_timeout: float = setting(
        300.0,
        gt=0,
        description="stateful mode: seconds a session may have no request in flight (no POST "
        "being served, no event stream open) before it is closed",
        mode="http",
        kind="duration",
    )
    max_request_body_bytes: int = setting(
        1024 * 1024, gt=0, description="bytes of one HTTP request body", mode="http"
    )
    allowed_hosts: StrList = setting(
        default_factory=list,
        description="Host header allow-list (host:port or host:*); empty = the loopback names when "
        "host is a loopback address, else off",
        mode="http",
        kind="list",
        flag="--allowed-host",
    )
    allowed_origins: StrList = setting(
        default_factory=list,
        description="Origin allow-list; empty = off",
        mode="http",
        kind="list",
        flag="--allowed-origin",
    )
    max_open_requests_per_subject: int = setting(
        16,
        gt=0,
        description="open /mcp requests (and event streams) of one subject; more get 429",
        mode="http",
    )
    max_open_requests: int = setting(
        256, gt=0, description="open /mcp requests of all subjects; more get 429", mode="http"
    )
    stream_idle_timeout: float = setting(
        60.0,
        gt=0,
        description="seconds an /mcp event stream may send nothing before the host ends it",
        mode="http",
        kind="duration",
    )
    max_stream_seconds: float = setting(
        3600.0, gt=0, description="seconds an /mcp event stream may stay open", mode="http", kind="duration"
    )
    max_connections: int | None = setting(
        None,
        gt=0,
        description="open HTTP connections and requests the server accepts; more get 503 "
        "(default: half the file-descriptor limit, at most 1000)",
        mode="http",
    )
    max_connections_per_subject: int | None = setting(
        None,
        gt=0,
        description="open HTTP connections of one subject (counted from its first authenticated "
        "request; less than max_connections); more get 429 and are closed (default: 4 x "
        "max_open_requests_per_subject, at most half of max_connections)",
        mode="http",
    )
    backlog: int = setting(128, gt=0, description="listen backlog of the main port", mode="http")
    header_timeout: float = setting(
        5.0,
        gt=0,
        le=300,
        description="seconds a connection may take to send a complete request head (from accept, "
        "and from the first byte of each later request); slower connections are closed",
        mode="http",
        kind="duration",
    )
    write_timeout: float = setting(
        10.0,
        gt=0,
        le=300,
        description="seconds an answer may wait unsent because the client does not read it (its "
        "TCP window stays full); such connections are closed",
        mode="http",
        kind="duration",
    )
    max_unauthenticated_connections_per_address: int = setting(
        32,
        gt=0,
        description="connections one client address (IPv6: its /64) may hold open before one of "
        "them carries an authenticated request; more are refused with 429",
        mode="http",
    )
    trusted_proxies: StrList = setting(
        default_factory=list,
        description="addresses or networks (CIDR) of proxies whose forwarded client address is "
        "believed (trusted_proxy_header); empty = the peer address is the client",
        mode="http",
        kind="list",
        flag="--trusted-proxy",
    )
    trusted_proxy_header: Literal["x-forwarded-for", "forwarded"] = setting(
        "x-forwarded-for",
        description="the one header the trusted proxies write: x-forwarded-for or forwarded (RFC 7239)",
        mode="http",
    )

    # ---------------------------------------------------------------------------- traces
    trace_endpoint: str | None = setting(
        None,
        description="OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces: one trace per "
        "execute (default: no tracing; OpenTelemetry is not even imported)",
    )
    trace_service_name: str = setting(
        "codemode", min_length=1, max_length=200, description="service.name of the traces"
    )
    trace_subject: Literal["hash", "omit"] = setting(
        "hash",
        description="the subject on each execute span: hash (16 hex digits of a keyed SHA-256 of "
        "its id, a pseudonym of its own) or omit",
    )

    # ---------------------------------------------------------------------------- lifecycle (http)
    ready_check_timeout: float = setting(
        6.0, gt=0, description="seconds a /readyz runtime check may take", mode="http", kind="duration"
    )
    start_degraded: bool = setting(
        False,
        description=(
            "start even when a pack, an upstream or the runtime fails at start: a failed pack or "
            "upstream is left out (/readyz 503 until a restart), a failed runtime is retried "
            "(default: exit 2 with the problem in one line)"
        ),
        mode="http",
    )
    shutdown_timeout: float = setting(
        30.0,
        ge=0,
        description="seconds to drain in-flight executes at shutdown",
        mode="http",
        kind="duration",
    )
    orphan_sweep_interval: float = setting(
        30.0,
        ge=0,
        description=(
            "seconds between runs of the orphan rule while serving (docker and kubernetes runtimes): "
            "a replica removes the workers of another host that provably died; 0 = at start only"
        ),
        mode="http",
        kind="duration",
    )
    drain_delay: float = setting(
        0.0,
        ge=0,
        le=300,
        description=(
            "seconds between SIGTERM and closing the listener: /readyz answers 503 and every response "
            "says Connection: close, while new requests are still served, so a load balancer (a "
            "Kubernetes Service) stops sending before the port closes; then shutdown_timeout applies"
        ),
        mode="http",
        kind="duration",
    )

    @field_validator("*", mode="before")
    @classmethod
    def _by_kind(cls, value: Any, info: ValidationInfo) -> Any:
        """Each value in the form its kind takes (a list from text, bytes from a size)."""
        assert info.field_name is not None
        return coerce(cls.model_fields[info.field_name], value)

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
        return Limits(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Limits)})

    @property
    def runtime_options(self) -> ProcessOptions | DockerOptions | KubernetesOptions:
        """The options object of the chosen runtime (``runtime``)."""
        table: ProcessTable | DockerTable | KubernetesTable = getattr(self, self.runtime)
        return table.options()

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
            return places.POD_NAMESPACE_FILE.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None

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
        return places.default_data_dir() if self.transport == "http" else None

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
        return self.token_file if self.token_file is not None else places.default_token_file()

    @property
    def subject_id(self) -> str:
        """The stdio subject: ``subject`` or the OS user name."""
        if self.subject:
            return self.subject
        try:
            return getpass.getuser()
        except Exception:
            return "local"
