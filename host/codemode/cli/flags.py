"""``serve`` flags generated from the settings model: one flag per :class:`~codemode.startup.config.Settings`
field, its help showing the real default, the unit and the environment variable, and the modes
(``--stdio``, ``--http``) in which it means something."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

from ..startup.config import LIST_SETTINGS, RENAMED, ConfigError, Settings, env_var, flag

__all__ = ["HTTP_ONLY", "STDIO_ONLY", "Mode", "add_settings_flags", "overrides", "settings_table"]

#: The transport ``serve`` runs.
Mode = Literal["stdio", "http"]

#: Settings that only the HTTP service reads.
HTTP_ONLY = frozenset(
    {
        "host",
        "port",
        "metrics_port",
        "metrics_host",
        "health_port",
        "health_host",
        "audit_log",
        "auth_failure_window",
        "auth_mode",
        "token_file",
        "jwks_file",
        "jwks_url",
        "jwt_issuer",
        "jwt_audience",
        "jwt_algorithms",
        "jwt_leeway_seconds",
        "jwt_max_lifetime_seconds",
        "jwks_cache_seconds",
        "mcp_stateless",
        "mcp_json_response",
        "max_sessions",
        "max_sessions_per_subject",
        "session_idle_timeout",
        "max_request_body_bytes",
        "allowed_hosts",
        "allowed_origins",
        "max_open_requests_per_subject",
        "max_open_requests",
        "stream_idle_timeout",
        "max_stream_seconds",
        "max_connections",
        "max_connections_per_subject",
        "backlog",
        "header_timeout",
        "write_timeout",
        "max_unauthenticated_connections_per_address",
        "trusted_proxies",
        "trusted_proxy_header",
        "ready_check_timeout",
        "start_degraded",
        "shutdown_timeout",
        "drain_delay",
        "orphan_sweep_interval",
    }
)
#: Settings that only ``serve --stdio`` reads.
STDIO_ONLY = frozenset({"subject"})
#: Not flags: the mode is ``--stdio`` / ``--http``; upstream tables live in TOML (or JSON in the
#: environment).
_NOT_FLAGS = frozenset({"transport", "upstream_mcp", "openapi"})
_LISTS = frozenset(LIST_SETTINGS)
#: Each setting's earlier names, still accepted (``--docker-pids`` for ``--docker-max-processes``).
_EARLIER = {new: [old for old, n in RENAMED.items() if n == new] for new in RENAMED.values()}

_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("capabilities", ("packs", "pack_options", "disable")),
    (
        "authorization (exactly one: --allow-all, or --rego-policy with --rego-decision)",
        ("allow_all", "rego_policy", "rego_decision"),
    ),
    ("runtime", ("runtime", "pool", "pool_", "docker_", "kubernetes_")),
    ("limits", ("max_", "subject_quota", "reserved_slots", "quota_")),
    ("stdio only", tuple(STDIO_ONLY)),
    ("HTTP only (see docs/service.md)", tuple(HTTP_ONLY)),
)


def _group_of(name: str) -> str:
    for title, prefixes in _GROUPS:
        if any(name == p or (p.endswith("_") and name.startswith(p)) for p in prefixes):
            return title
    return "general"


def _default_text(name: str, field: Any) -> str:
    if name == "token_file":
        return "~/.config/codemode/codemode.tokens"
    if name == "subject":
        return "the OS user name"
    default = field.get_default(call_default_factory=True)
    if default is None or default == []:
        return ""
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, list):
        return ",".join(str(v) for v in default)
    return str(default)


def _scalar(annotation: Any) -> Any:
    """The argparse ``type`` of a field (None for strings and paths)."""
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    args = (
        [a for a in get_args(annotation) if a is not type(None)] if get_origin(annotation) else [annotation]
    )
    kind = args[0] if args else annotation
    if kind is bool:
        return bool
    if kind in (int, float):
        return kind
    if get_origin(kind) is Literal:
        return list(get_args(kind))
    return None


def _metavar(name: str, kind: Any) -> str:
    if kind in (int, float):
        return "SECONDS" if name.endswith(("_time", "_timeout", "_seconds")) else "N"
    if name.endswith(("_file", "_kubeconfig")):
        return "FILE"
    return name.rsplit("_", 1)[-1].upper()


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per settings field, grouped; every flag defaults to None (= not given).

    Args:
        parser: the ``serve`` parser.
    """
    groups: dict[str, Any] = {}
    for name, field in Settings.model_fields.items():
        if name in _NOT_FLAGS:
            continue
        title = _group_of(name)
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        group = groups[title]
        default = _default_text(name, field)
        help_text = field.description or name
        help_text += f" (default: {default}; {env_var(name)})" if default else f" ({env_var(name)})"
        help_text = help_text.replace("%", "%%")
        kind = _scalar(field.annotation)
        if name in _LISTS:
            group.add_argument(
                flag(name),
                dest=name,
                action="append",
                default=None,
                metavar="VALUE",
                help=help_text + "; repeatable",
            )
        elif kind is bool:
            if field.default is True:
                group.add_argument(
                    flag(name), dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
                )
            else:
                group.add_argument(
                    flag(name), dest=name, action="store_const", const=True, default=None, help=help_text
                )
        elif isinstance(kind, list):
            group.add_argument(flag(name), dest=name, choices=kind, default=None, help=help_text)
        else:
            group.add_argument(
                flag(name),
                *(flag(old) for old in _EARLIER.get(name, ())),
                dest=name,
                type=kind,
                default=None,
                metavar=_metavar(name, kind),
                help=help_text,
            )


def overrides(
    args: argparse.Namespace, mode: Mode, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The settings given as flags. Repeatable flags add to the comma-separated lists of their
    environment variables.

    Args:
        args: the parsed flags.
        mode: the transport.
        environ: the environment (None: ``os.environ``).

    Returns:
        Setting name → value, ``transport`` included.

    Raises:
        ConfigError: a flag means nothing in ``mode`` (an HTTP-only one with ``--stdio``, or the
            other way round).
    """
    environ = os.environ if environ is None else environ
    out: dict[str, Any] = {"transport": mode}
    for name in Settings.model_fields:
        if name in _NOT_FLAGS:
            continue
        value = getattr(args, name, None)
        if value is None:
            continue
        if mode == "stdio" and name in HTTP_ONLY:
            raise ConfigError(f"{flag(name)} is for serve --http; it does nothing with --stdio")
        if mode == "http" and name in STDIO_ONLY:
            raise ConfigError(f"{flag(name)} is for serve --stdio; HTTP subjects come from authentication")
        if name in _LISTS:
            base = [p.strip() for p in environ.get(env_var(name), "").split(",") if p.strip()]
            value = [*base, *value]
        out[name] = value
    return out


def settings_table() -> str:
    """The Markdown table of every setting (docs/configuration.md carries it; a test compares).

    Returns:
        The table: flag, environment variable, default, modes and meaning of each setting.
    """
    from ..startup.config import env_var as env

    rows = ["| flag | environment | default | modes | meaning |", "|---|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        if name in _NOT_FLAGS:
            continue
        modes = "http" if name in HTTP_ONLY else "stdio" if name in STDIO_ONLY else "both"
        default = (_default_text(name, field) or "—").replace("|", "\\|")
        flags, envs = f"`{flag(name)}`", f"`{env(name)}`"
        for old in _EARLIER.get(name, ()):
            flags += f" (earlier `{flag(old)}`)"
            envs += f" (earlier `{env(old)}`)"
        rows.append(f"| {flags} | {envs} | {default} | {modes} | {field.description} |")
    return "\n".join(rows)
