"""The checks across settings: what no single setting's type can say (one authorizer, the slots,
quota and reserve together, a runtime's settings with their runtime, what ``serve --http`` needs),
each problem one line naming its flags and variables."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from urllib.parse import urlsplit

from ...common.extras import MissingExtra
from ...execution.admission import Admission
from .facts import is_table
from .fields import SettingsFields
from .naming import leaf, names
from .places import unreadable


def problems(s: SettingsFields) -> list[str]:
    """Cross-field configuration problems, each naming its flag and environment variable.

    Args:
        s: the settings.

    Returns:
        The problems (empty when there are none).
    """
    out: list[str] = []
    if s.allow_all and (s.rego_policy or s.rego_decision):
        out.append(f"choose one authorizer: {names('allow_all')} or {names('rego_policy')}, not both")
    elif not s.allow_all:
        if not s.rego_policy and not s.rego_decision:
            out.append(
                f"no authorizer: set {names('allow_all')} to allow every call explicitly, or "
                f"{names('rego_policy')} with {names('rego_decision')}"
            )
        elif not s.rego_policy or not s.rego_decision:
            out.append(f"the Rego authorizer needs both {names('rego_policy')} and {names('rego_decision')}")
    if s.rego_evaluate_inline and not s.rego_policy:
        out.append(f"{names('rego_evaluate_inline')} applies to the Rego authorizer only")
    for path in s.rego_policy:
        problem = unreadable(Path(path))
        if problem:
            out.append(f"{names('rego_policy')}: policy file {str(path)!r} {problem}")
    out += _slot_problems(s)
    out += _quota_problems(s)
    if s.store == "sqlite" and s.pack_data_dir is None:
        out.append(f"{names('store')} sqlite needs {names('data_dir')} (serve --stdio keeps no data dir)")
    if "store_timeout" in s.model_fields_set and s.store_kind != "postgres":
        out.append(f"{names('store_timeout')} applies to a PostgreSQL store ({names('store')})")
    if s.reuse_executes and s.runtime == "process":
        out.append(f"{names('reuse_executes')} needs {names('runtime')} docker or kubernetes")
    elif s.reuse_executes and not s.pool:
        out.append(
            f"{names('reuse_executes')} needs {names('pool')} > 0 "
            "(the sandboxes kept idle for their subjects)"
        )
    out += _pool_problems(s)
    if "reuse_idle_seconds" in s.model_fields_set and not s.reuse_executes:
        out.append(
            f"{names('reuse_idle_seconds')} applies to the reuse mode only ({names('reuse_executes')})"
        )
    if s.max_print_bytes > s.max_value_bytes:
        out.append(f"{names('max_print_bytes')} must not exceed {names('max_value_bytes')}")
    for name, field in type(s).model_fields.items():
        if not is_table(field) or name == s.runtime:
            continue
        table = getattr(s, name)
        given = [f for f in type(table).model_fields if getattr(table, f) is not None]
        if given:
            out.append(f"{names(f'{name}_{given[0]}')} needs {names('runtime')} {name}")
    out += _options_problems(s)
    return out


def _options_problems(s: SettingsFields) -> list[str]:
    """What the chosen runtime's options refuse (validation lives in the options), naming the
    setting when the options name the option."""
    try:
        s.runtime_options  # noqa: B018 (made to be checked)
    except MissingExtra as exc:  # the runtime's checks need its client (the kubernetes extra)
        return [f"{names('runtime')}: {exc}"]
    except ValueError as exc:
        option = getattr(exc, "option", None)
        name = f"{s.runtime}_{option}"
        where = names(name) if leaf(name) is not None else f"--{s.runtime}-* / CODEMODE_{s.runtime.upper()}_*"
        return [f"{where}: {exc}"]
    return []


def _quota_problems(s: SettingsFields) -> list[str]:
    if s.quota_store == "local":
        given = [f for f in ("quota_namespace", "quota_kubeconfig") if getattr(s, f) is not None]
        return [f"{names(given[0])} needs {names('quota_store')} kubernetes"] if given else []
    if s.effective_quota_namespace is None:
        return [f"{names('quota_store')} kubernetes needs {names('quota_namespace')} outside a pod"]
    return []


def _pool_problems(s: SettingsFields) -> list[str]:
    """The demand-sized warm pool's bounds (docs/reference/runtimes.md, "Warm pool")."""
    out: list[str] = []
    given = s.model_fields_set
    if s.pool_max is not None and s.pool_max < s.pool:
        out.append(f"{names('pool_max')} must be at least {names('pool')} ({s.pool})")
    if "pool_refill_concurrency" in given and not s.pool and not s.pool_max:
        out.append(f"{names('pool_refill_concurrency')} needs {names('pool')} or {names('pool_max')} > 0")
    return out


def _slot_problems(s: SettingsFields) -> list[str]:
    """Quota and slots are configured together (docs/service.md, "Fair slots"), in the words of
    the library's ``Builder`` (``codemode.execution.admission.Admission``)."""
    return Admission.problems_of(
        s.max_concurrent_executions, s.subject_quota, s.effective_reserved_slots, names
    )


def http_problems(s: SettingsFields) -> list[str]:
    """What ``serve --http`` needs beyond :func:`problems`: authentication and listening.

    Args:
        s: the settings.

    Returns:
        The problems (empty when there are none).
    """
    out: list[str] = []
    if s.auth_mode == "token_file":
        path = s.token_file_path
        problem = unreadable(path)
        if problem:
            hint = (
                f"create one with: codemode token new SUBJECT --token-file {path}"
                if problem == "does not exist"
                else "make it readable by the service's user: chown or chmod it"
            )
            out.append(f"{names('token_file')}: token file {str(path)!r} {problem} ({hint})")
    else:
        if (s.jwks_file is None) == (s.jwks_url is None):
            out.append(f"auth_mode jwt needs exactly one of {names('jwks_file')} and {names('jwks_url')}")
        if not s.jwt_issuer:
            out.append(f"auth_mode jwt needs {names('jwt_issuer')}")
        if not s.jwt_audience:
            out.append(f"auth_mode jwt needs {names('jwt_audience')}")
        if s.jwks_url is not None and not _safe_jwks_url(s.jwks_url):
            out.append(f"{names('jwks_url')}: must be https (plain http only for a loopback host)")
    if not s.mcp_stateless and s.max_sessions_per_subject >= s.max_sessions:
        out.append(
            f"{names('max_sessions_per_subject')}: must be less than {names('max_sessions')}, "
            "so that one subject cannot hold every session"
        )
    if (
        s.max_connections_per_subject is not None
        and s.max_connections is not None
        and s.max_connections_per_subject >= s.max_connections
    ):
        out.append(
            f"{names('max_connections_per_subject')}: must be less than {names('max_connections')}, "
            "so that one subject cannot hold every connection"
        )
    if s.metrics_port != 0 and s.metrics_port == s.port:
        out.append(f"{names('metrics_port')}: must differ from {names('port')}")
    if s.health_port != 0 and s.health_port in (s.port, s.metrics_port):
        out.append(f"{names('health_port')}: must differ from {names('port')} and {names('metrics_port')}")
    return out


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
