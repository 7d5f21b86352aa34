"""One ``[[upstream_mcp]]`` table: :class:`UpstreamMCPConfig`, its checks, and what a session of it
is given (its credentials, per-subject headers and environment, read on the host only). The pack
(:mod:`codemode_capabilities.mcp.upstream`) re-exports it; docs/packs.md, "Upstream MCP servers",
says what each key does."""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from codemode.packs import MAX_CAPABILITIES, UpstreamBuildError, check_namespace, snake_case

from .pool import DEFAULT_STUCK_GRACE
from .stdio_relay import VIEW_DIR
from .tenancy import (
    ARG_PLACEHOLDERS,
    fixed_paths,
    names_path,
    placeholders_in,
    subject_key,
    subject_token,
)

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "DEFAULT_MAX_TOOLS", "UpstreamMCPConfig"]

#: Tools taken from one upstream by default: a huge list is cut (with a skip report) rather than
#: filling the catalog (at most 4,096 capabilities in all) and stopping the start.
DEFAULT_MAX_TOOLS = 1024
#: Bytes of one upstream message (a stdio line, an HTTP JSON body or an SSE event); a larger one fails
#: the call it answers.
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_MIB = 1024 * 1024
_UPSTREAM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")


class UpstreamMCPConfig(BaseModel):
    """One upstream MCP server (a ``[[upstream_mcp]]`` table in the TOML settings)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Upstream id: capability ids are mcp:<name>:<tool>.")
    namespace: str | None = Field(
        default=None, description="Capability name prefix (dotted snake_case); default: name in snake_case."
    )
    command: str | None = Field(default=None, description="stdio transport: the program to start.")
    args: list[str] = Field(default_factory=list, description="stdio transport: its arguments.")
    env: dict[str, str] = Field(default_factory=dict, description="stdio: literal extra environment.")
    env_from_host: dict[str, str] = Field(
        default_factory=dict, description="stdio: child variable -> host variable whose value it gets."
    )
    cwd: str | None = Field(default=None, description="stdio: working directory.")
    url: str | None = Field(default=None, description="streamable HTTP transport: the MCP endpoint URL.")
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP: literal (non-secret) headers.")
    headers_from_env: dict[str, str] = Field(
        default_factory=dict, description="HTTP: header -> host environment variable holding its value."
    )
    headers_from_file: dict[str, str] = Field(
        default_factory=dict, description="HTTP: header -> file holding its value (trailing newline dropped)."
    )
    tenancy: Literal["per_subject", "shared"] = Field(
        default="per_subject",
        description="per_subject: a session (stdio: a process) per subject; shared: one for all subjects.",
    )
    subject_headers: dict[str, str] = Field(
        default_factory=dict,
        description="HTTP, per_subject: header -> template with {subject} (percent-encoded) / {subject_key}.",
    )
    subject_headers_from_file: dict[str, str] = Field(
        default_factory=dict,
        description="HTTP, per_subject: header -> JSON file mapping each subject id to its value.",
    )
    max_sessions: int = Field(
        default=16, ge=1, description="per_subject: sessions (stdio: processes) at once."
    )
    idle_timeout: float = Field(
        default=300.0, gt=0, description="per_subject: seconds before an idle one closes."
    )
    max_session_seconds: float = Field(
        default=3600.0, gt=0, description="per_subject: a session older than this is closed once idle."
    )
    max_restarts_per_minute: int = Field(
        default=6,
        ge=0,
        description="Restarts and failed starts one subject may cause per minute; then its calls fail.",
    )
    stuck_grace: float = Field(
        default=DEFAULT_STUCK_GRACE,
        gt=0,
        description="Seconds past an unanswered call's timeout a session gets to answer a ping; "
        "then it is stuck and stopped (stdio: the process is terminated).",
    )
    max_calls_per_minute: int = Field(
        default=600, ge=0, description="Calls per subject per minute (0: no bound)."
    )
    max_sent_bytes_per_minute: int = Field(
        default=4 * _MIB, ge=0, description="Argument bytes a subject sends per minute (0: no bound)."
    )
    max_returned_bytes_per_minute: int = Field(
        default=64 * _MIB, ge=0, description="Result bytes a subject receives per minute (0: no bound)."
    )
    process_memory_bytes: int = Field(
        default=1024 * _MIB, ge=0, description="stdio: RLIMIT_DATA of the server process (0: none)."
    )
    process_file_bytes: int = Field(
        default=256 * _MIB, ge=0, description="stdio: RLIMIT_FSIZE, largest file it may write (0: none)."
    )
    process_tree_memory_bytes: int = Field(
        default=0,
        ge=0,
        description="stdio: resident memory of the server and every process it started, summed; "
        "past it all are killed (0: none).",
    )
    process_cpu_seconds: int = Field(
        default=0, ge=0, description="stdio: RLIMIT_CPU, CPU seconds over the process's life (0: none)."
    )
    max_subject_dir_bytes: int = Field(
        default=0,
        ge=0,
        description="{subject_dir}: bytes the subject's directory may hold, checked before each call "
        "(0: no bound).",
    )
    max_subject_dir_entries: int = Field(
        default=0,
        ge=0,
        description="{subject_dir}: entries the subject's directory may hold, checked before each call "
        "(0: no bound).",
    )
    shared_paths: list[str] = Field(
        default_factory=list,
        description="stdio: paths every subject's server may be given as they are (read-only data, the "
        "server's own files); any other fixed path in env/args/cwd refuses a per-subject table under "
        "serve --http.",
    )
    subject_dir_view: Literal["private", "host"] = Field(
        default="private",
        description="stdio, {subject_dir}: private: the server runs in a mount view of its own and sees "
        "its directory at /mnt; host: it is given the host path (which a tenant can then learn).",
    )
    include: list[str] = Field(default_factory=list, description="Tool name globs to keep (empty: all).")
    exclude: list[str] = Field(default_factory=list, description="Tool name globs to drop.")
    timeout: float = Field(default=30.0, gt=0, description="Seconds per call (also bounded by the deadline).")
    connect_timeout: float = Field(default=30.0, gt=0, description="Seconds to connect and list tools.")
    max_message_bytes: int = Field(
        default=DEFAULT_MAX_MESSAGE_BYTES,
        ge=1024,
        description="Largest message read from the upstream: a stdio line, an HTTP JSON body or SSE event.",
    )
    on_unsupported: Literal["skip", "fail"] = Field(
        default="skip", description="A tool whose schema cannot be represented: skip it (warn) or fail."
    )
    max_tools: int = Field(
        default=DEFAULT_MAX_TOOLS,
        ge=1,
        le=MAX_CAPABILITIES,
        description="Most tools taken from this upstream (after include/exclude, in name order); "
        "the rest are skipped.",
    )

    @model_validator(mode="after")
    def _check(self) -> UpstreamMCPConfig:
        if not _UPSTREAM_NAME.match(self.name):
            raise ValueError(
                f"upstream name {self.name!r} must be 1-64 of [A-Za-z0-9_-], not starting with - or _"
            )
        if (self.command is None) == (self.url is None):
            raise ValueError(f"upstream {self.name!r}: set exactly one of command (stdio) or url (HTTP)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"upstream {self.name!r}: url must start with http:// or https://")
        if self.command is None and (
            self.args
            or self.env
            or self.env_from_host
            or self.cwd
            or self.shared_paths
            or self.subject_dir_view != "private"
        ):
            raise ValueError(
                f"upstream {self.name!r}: args/env/env_from_host/cwd/shared_paths/subject_dir_view are for "
                "stdio (command)"
            )
        subject_headers = {**self.subject_headers, **self.subject_headers_from_file}
        if self.url is None and (
            self.headers or self.headers_from_env or self.headers_from_file or subject_headers
        ):
            raise ValueError(f"upstream {self.name!r}: headers are for HTTP (url)")
        if self.tenancy == "shared" and (self.placeholders or subject_headers):
            raise ValueError(
                f"upstream {self.name!r}: {sorted(self.placeholders) or 'subject_headers'} need "
                'tenancy = "per_subject" (a shared upstream has no subject)'
            )
        if (self.max_subject_dir_bytes or self.max_subject_dir_entries) and (
            "{subject_dir}" not in self.placeholders
        ):
            raise ValueError(
                f"upstream {self.name!r}: max_subject_dir_bytes/max_subject_dir_entries bound the "
                "directory of {subject_dir}, which env/args/cwd do not use"
            )
        hidden = self._hidden_by_view()
        if hidden:
            where, piece = hidden
            raise ValueError(
                f"upstream {self.name!r}: {where} names {piece!r}, under {VIEW_DIR}, where the server sees "
                '{subject_dir}: move it elsewhere, or set subject_dir_view = "host"'
            )
        both = {h.lower() for h in self.subject_headers} & {h.lower() for h in self.subject_headers_from_file}
        if both:
            raise ValueError(
                f"upstream {self.name!r}: header {sorted(both)} is in both subject_headers and "
                "subject_headers_from_file"
            )
        try:
            check_namespace(self.resolved_namespace)
        except UpstreamBuildError as exc:
            raise ValueError(f"{exc} (set namespace for upstream {self.name!r})") from None
        return self

    @property
    def resolved_namespace(self) -> str:
        """The capability name prefix: ``namespace``, else the upstream name in snake_case."""
        return self.namespace if self.namespace is not None else snake_case(self.name)

    @property
    def placeholders(self) -> set[str]:
        """The subject placeholders used in ``env`` values, ``args`` and ``cwd``."""
        return placeholders_in([*self.env.values(), *self.args, *([self.cwd] if self.cwd else [])]) & set(
            ARG_PLACEHOLDERS
        )

    @property
    def uses_view(self) -> bool:
        """Whether the server runs in a mount view of its own (``{subject_dir}``, ``private``)."""
        return (
            self.command is not None
            and self.subject_dir_view == "private"
            and ("{subject_dir}" in self.placeholders)
        )

    def _hidden_by_view(self) -> tuple[str, str] | None:
        """A configured path the view would hide (under :data:`VIEW_DIR`), if any."""
        if not self.uses_view:
            return None
        values = [
            ("command", self.command or ""),
            *[(f"shared_paths[{i}]", p) for i, p in enumerate(self.shared_paths)],
        ]
        for where, piece in [*values, *fixed_paths(self.env, self.args, self.cwd, ())]:
            path = os.path.normpath(piece) if names_path(piece) else ""
            if path == VIEW_DIR or path.startswith(VIEW_DIR + "/"):
                return where, piece
        return None

    def shared_state(self) -> list[tuple[str, str]]:
        """The fixed paths every subject's server of a per-subject stdio table would be given (the rule
        of :func:`~codemode_capabilities.mcp.tenancy.fixed_paths`, less ``shared_paths``).

        Returns:
            ``(where, path)`` pairs; none for a shared or HTTP table.
        """
        if self.command is None or self.tenancy == "shared":
            return []
        return fixed_paths(self.env, self.args, self.cwd, self.shared_paths)

    @property
    def subject_specific(self) -> bool:
        """Whether a subject's session is started differently from the host's."""
        return bool(self.placeholders or self.subject_headers or self.subject_headers_from_file)

    def wanted(self, tool: str) -> bool:
        """Whether ``include`` and ``exclude`` keep a tool.

        Args:
            tool: the upstream tool name.

        Returns:
            True when it matches an ``include`` glob (or there are none) and no ``exclude`` glob.
        """
        if self.include and not any(fnmatch.fnmatchcase(tool, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(tool, p) for p in self.exclude)

    def secret_headers(self) -> dict[str, str]:
        """All HTTP headers with secrets resolved (host side only).

        Returns:
            ``headers`` plus the values of ``headers_from_env`` and ``headers_from_file``.

        Raises:
            UpstreamBuildError: a variable is unset or a file cannot be read.
        """
        out = dict(self.headers)
        for header, var in self.headers_from_env.items():
            value = os.environ.get(var)
            if value is None:
                raise UpstreamBuildError(
                    f"upstream {self.name!r}: header {header!r} needs environment variable {var} (unset)"
                )
            out[header] = value
        for header, path in self.headers_from_file.items():
            out[header] = _read_secret(self.name, header, path)
        return out

    def secret_values(self, subject_id: str | None) -> tuple[str, ...]:
        """Every credential value a session sends: redacted from the upstream's error text (host
        side only).

        Args:
            subject_id: the session's subject (None: the host's own session).

        Returns:
            The values of ``env_from_host`` (stdio), or of the secret and per-subject headers (HTTP).
        """
        if self.command is not None:
            return tuple(self.child_env()[child] for child in self.env_from_host)
        headers = self.secret_headers()
        values = [headers[h] for h in [*self.headers_from_env, *self.headers_from_file]]
        if subject_id is not None:
            values += self.subject_header_values(subject_id).values()
        return tuple(values)

    def subject_header_values(self, subject_id: str) -> dict[str, str]:
        """The per-subject headers of ``subject_id`` (host side only; read at each connect).

        Args:
            subject_id: the subject.

        Returns:
            ``subject_headers`` with ``{subject}``/``{subject_key}`` filled in, and the subject's
            value from each ``subject_headers_from_file`` table.

        Raises:
            UpstreamBuildError: a file cannot be read, is not JSON, or has no string for the subject.
        """
        values = {"{subject}": subject_token(subject_id), "{subject_key}": subject_key(subject_id)}
        out = {h: _expand_header(t, values) for h, t in self.subject_headers.items()}
        for header, path in self.subject_headers_from_file.items():
            try:
                table = json.loads(_read_secret(self.name, header, path))
            except json.JSONDecodeError:
                raise UpstreamBuildError(
                    f"upstream {self.name!r}: header {header!r}: {path} is not JSON"
                ) from None
            value = table.get(subject_id) if isinstance(table, dict) else None
            if not isinstance(value, str):
                raise UpstreamBuildError(
                    f"upstream {self.name!r}: header {header!r}: {path} has no string for subject key "
                    f"{subject_key(subject_id)}"
                )
            out[header] = value
        return out

    def child_env(self) -> dict[str, str]:
        """The extra environment of a stdio server: ``env`` plus the values of ``env_from_host``.

        Returns:
            The variables, before placeholders are filled in.

        Raises:
            UpstreamBuildError: a host variable of ``env_from_host`` is unset.
        """
        env = dict(self.env)
        for child, var in self.env_from_host.items():
            value = os.environ.get(var)
            if value is None:
                raise UpstreamBuildError(
                    f"upstream {self.name!r}: env {child!r} needs host environment variable {var} (unset)"
                )
            env[child] = value
        return env


def _expand_header(template: str, values: Mapping[str, str]) -> str:
    return re.sub(r"\{subject(?:_key)?\}", lambda m: values[m.group(0)], template)


def _read_secret(upstream: str, header: str, path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise UpstreamBuildError(
            f"upstream {upstream!r}: header {header!r}: cannot read {path}: {exc.strerror}"
        ) from None
