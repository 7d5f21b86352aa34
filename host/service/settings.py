"""Service settings: ``CODEMODE_*`` environment variables and an optional TOML file.

Precedence, highest first: keyword arguments (what the CLI passes for ``--host``/``--port``), the
environment, the TOML file named by ``CODEMODE_CONFIG`` (or by ``load_settings(config_file=...)``),
then the defaults below. The environment names are the field names upper-cased with the
``CODEMODE_`` prefix, the same names ``codemode serve`` reads (``CODEMODE_PACKS``, ``CODEMODE_POOL``,
``CODEMODE_MAX_EXECUTION_TIME``, ...). Limits may also be written as a ``[limits]`` table in TOML.
List settings accept JSON (``["a:b", "c:d"]``) or a comma-separated string in the environment.

Nothing here is a secret: the token file holds SHA-256 hashes only, JWKS are public keys.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import ipaddress
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ..limits import Limits

__all__ = ["LIMIT_FIELDS", "ConfigError", "Settings", "load_settings"]

CONFIG_ENV = "CODEMODE_CONFIG"

_config_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "codemode_config_file", default=None
)


class ConfigError(ValueError):
    """The service configuration is unusable (the message says which setting and why)."""


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


StrList = Annotated[list[str], NoDecode]


LIMIT_FIELDS = tuple(f.name for f in dataclasses.fields(Limits))


class Settings(BaseSettings):
    """Everything ``codemode serve --http`` needs. See docs/service.md for each setting."""

    model_config = SettingsConfigDict(
        env_prefix="CODEMODE_",
        extra="forbid",
        validate_default=True,
    )

    # ---------------------------------------------------------------------------- listening
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    metrics_port: int | None = Field(None, ge=0, le=65535)
    """When set, ``/metrics`` is served only on this port (a second small server), not on ``port``."""
    metrics_host: str | None = None
    """Interface for the metrics port; defaults to ``host``."""
    log_level: str = "info"
    audit_log: str = "stderr"
    """Where the ``codemode.audit`` JSON lines go: ``stderr``, ``stdout``, a file path, or ``none``
    (no handler of its own: records propagate to the root logger's handlers)."""

    # ---------------------------------------------------------------------------- authentication
    auth_mode: Literal["token_file", "jwt"] = "token_file"
    token_file: Path | None = None
    """``token_file`` mode: JSON ``{"<sha256 hex of token>": "subject"}`` or ``<sha256 hex> subject``
    lines."""
    jwks_file: Path | None = None
    jwks_url: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_algorithms: StrList = Field(default_factory=lambda: ["RS256", "ES256"])
    jwt_leeway_seconds: float = Field(30.0, ge=0, le=300)
    jwks_cache_seconds: float = Field(300.0, gt=0)

    # ---------------------------------------------------------------------------- catalog & policy
    packs: StrList = Field(default_factory=list)
    """Capability packs as ``module:object`` specs."""
    pack_options: StrList = Field(default_factory=list)
    """``KEY=VALUE`` options handed to packs (``codemode.packs.PackSettings.options``)."""
    disable: StrList = Field(default_factory=list)
    """Capability ids removed at build time."""
    allow_all: bool = False
    """The explicit allow-everything authorizer (there is no implicit allow)."""
    rego_policy: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    """Rego module files (trusted configuration) for the in-process Rego authorizer."""
    rego_decision: str | None = None
    """The decision reference, e.g. ``data.codemode.allow``."""

    # ---------------------------------------------------------------------------- runtime
    runtime: Literal["process", "docker", "kubernetes"] = "process"
    docker_image: str | None = None
    """Worker image; default: the Docker runtime's (``codemode-worker:<protocol version>``)."""
    docker_base_url: str | None = None
    """Docker Engine endpoint, e.g. ``unix:///var/run/docker.sock``; default: ``DOCKER_HOST`` or the
    local socket."""
    docker_memory: str | None = None
    """Worker memory (= memory+swap) limit: bytes or ``512k``/``256m``/``1g`` (binary units);
    default: the runtime's (256 MiB)."""
    docker_cpus: float | None = Field(None, gt=0)
    docker_pids: int | None = Field(None, gt=0)
    docker_oci_runtime: str | None = None
    """An OCI runtime name such as ``runsc`` (gVisor)."""
    kubernetes_namespace: str | None = None
    """Namespace of the worker pods; default: the Kubernetes runtime's (``codemode-workers``)."""
    kubernetes_image: str | None = None
    kubernetes_memory: str | None = None
    """Memory request = limit of each worker pod, e.g. ``256Mi``."""
    kubernetes_cpu: str | None = None
    kubernetes_runtime_class: str | None = None
    """A RuntimeClass name such as ``gvisor``."""
    pool: int = Field(0, ge=0)
    """Warm workers kept ready (0 = no pool)."""

    # ---------------------------------------------------------------------------- limits & quota
    # codemode.Limits, 0 = the library default (SPEC §5). In TOML also as a [limits] table.
    max_source_bytes: int = Field(0, ge=0)
    max_execution_steps: int = Field(0, ge=0)
    max_execution_time: float = Field(0.0, ge=0)
    max_native_calls: int = Field(0, ge=0)
    max_value_depth: int = Field(0, ge=0)
    max_value_bytes: int = Field(0, ge=0)
    max_intermediate_value_bytes: int = Field(0, ge=0)
    max_search_query_bytes: int = Field(0, ge=0)
    max_search_results: int = Field(0, ge=0)
    max_concurrent_executions: int = Field(0, ge=0)
    max_search_response_bytes: int = Field(0, ge=0)
    max_callstack: int = Field(0, ge=0)
    subject_quota: int = Field(4, ge=0)
    """Concurrent executes one subject may run; beyond it ``resource limit exceeded`` (0 = no quota)."""

    # ---------------------------------------------------------------------------- MCP transport
    mcp_stateless: bool = True
    """Stateless streamable HTTP (no server-side session; any replica can serve any request)."""
    mcp_json_response: bool = False
    max_request_body_bytes: int = Field(1024 * 1024, gt=0)
    allowed_hosts: StrList = Field(default_factory=list)
    """Host header allow-list for DNS-rebinding protection (``host:port`` or ``host:*``); empty = off."""
    allowed_origins: StrList = Field(default_factory=list)

    # ---------------------------------------------------------------------------- lifecycle
    ready_check_timeout: float = Field(6.0, gt=0)
    shutdown_timeout: float = Field(30.0, ge=0)
    """Seconds to wait for in-flight executes at shutdown before cancelling them."""

    @model_validator(mode="before")
    @classmethod
    def _flatten_limits(cls, data: Any) -> Any:
        """Accept ``limits = {...}`` / a ``[limits]`` table (or a ``codemode.Limits``) as flat fields."""
        if isinstance(data, dict) and "limits" in data:
            data = dict(data)
            nested = data.pop("limits")
            if isinstance(nested, Limits):
                nested = {k: v for k, v in dataclasses.asdict(nested).items() if v}
            if not isinstance(nested, dict):
                raise ValueError("limits must be a table of limit values")
            unknown = sorted(set(nested) - set(LIMIT_FIELDS))
            if unknown:
                raise ValueError(f"limits: unknown limit(s) {unknown}")
            for key, value in nested.items():
                data.setdefault(key, value)
        return data

    @field_validator(
        "jwt_algorithms",
        "packs",
        "pack_options",
        "disable",
        "rego_policy",
        "allowed_hosts",
        "allowed_origins",
        mode="before",
    )
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("jwt_algorithms")
    @classmethod
    def _algorithms(cls, value: list[str]) -> list[str]:
        allowed = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
        bad = [a for a in value if a not in allowed]
        if bad or not value:
            raise ValueError(f"must be a non-empty list of asymmetric algorithms from {sorted(allowed)}")
        return value

    @field_validator("audit_log")
    @classmethod
    def _audit(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be stderr, stdout, none or a file path")
        return value.strip()

    @field_validator("docker_memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError("must be a byte count or a size such as 256m")
        text = str(value).strip()
        _parse_size(text)
        return text

    @property
    def docker_memory_bytes(self) -> int | None:
        return None if self.docker_memory is None else _parse_size(self.docker_memory)

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
    def pack_option_map(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in self.pack_options:
            key, _, value = item.partition("=")
            out[key.strip()] = value
        return out

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def problems(self) -> list[str]:
        """Cross-field configuration problems (each names its setting)."""
        out: list[str] = []
        if self.auth_mode == "token_file":
            if self.token_file is None:
                out.append("token_file: required when auth_mode is token_file")
        else:
            if (self.jwks_file is None) == (self.jwks_url is None):
                out.append("jwks_file / jwks_url: exactly one is required when auth_mode is jwt")
            if not self.jwt_issuer:
                out.append("jwt_issuer: required when auth_mode is jwt")
            if not self.jwt_audience:
                out.append("jwt_audience: required when auth_mode is jwt")
            if self.jwks_url is not None and not _safe_jwks_url(self.jwks_url):
                out.append("jwks_url: must be https (plain http only for a loopback host)")
        if self.allow_all and (self.rego_policy or self.rego_decision):
            out.append("allow_all / rego_policy: choose one authorizer")
        elif not self.allow_all:
            if not self.rego_policy and not self.rego_decision:
                out.append(
                    "authorizer: none configured (set allow_all = true, or rego_policy and rego_decision)"
                )
            elif not self.rego_policy or not self.rego_decision:
                out.append("rego_policy / rego_decision: both are required for the Rego authorizer")
        if self.metrics_port is not None and self.metrics_port != 0 and self.metrics_port == self.port:
            out.append("metrics_port: must differ from port")
        return out

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _config_file.get()
        if path is None:
            env_path = os.environ.get(CONFIG_ENV, "").strip()
            path = Path(env_path) if env_path else None
        if path is not None:
            if not path.is_file():
                raise ConfigError(f"{CONFIG_ENV}: config file {str(path)!r} does not exist")
            sources.append(_TomlSource(settings_cls, toml_file=path))
        return tuple(sources)


_PATH_KEYS = ("token_file", "jwks_file", "audit_log")


class _TomlSource(TomlConfigSettingsSource):
    """A TOML file whose relative paths are relative to the file itself, not the working directory."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        data = super()._read_file(file_path)
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


def _parse_size(text: str) -> int:
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

    ``config_file`` takes the place of ``CODEMODE_CONFIG``. Raises :class:`ConfigError` with every
    problem (never with a secret: there are none in the settings).
    """
    from pydantic import ValidationError

    path = Path(config_file) if config_file is not None else None
    try:
        with _using_config(path):
            return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for err in exc.errors(include_url=False, include_input=False):
            loc = ".".join(str(p) for p in err["loc"]) or "settings"
            lines.append(f"{loc}: {err['msg']}")
        raise ConfigError(
            "invalid service configuration:\n" + "\n".join(f"- {line}" for line in lines)
        ) from None
