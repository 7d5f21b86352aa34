"""The ``[[openapi]]`` table: one OpenAPI document, where its calls go and with which credential.

Read by :mod:`codemode_capabilities.openapi` (the pack) and :mod:`codemode_capabilities.openapi.calls`
(the requests); the rules are in ``docs/packs.md`` (*OpenAPI documents*).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from codemode.packs import UpstreamBuildError, check_namespace, snake_case

from .operation import METHODS, Fixed

__all__ = ["OpenAPIConfig"]

_API_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
_SHORT_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")


class OpenAPIConfig(BaseModel):
    """One OpenAPI document (an ``[[openapi]]`` table in the TOML settings)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="API id: capability ids are openapi:<name>:<operation>.")
    namespace: str | None = Field(default=None, description="Capability name prefix; default: name.")
    document: str = Field(description="Path or http(s) URL of the OpenAPI 3.x document (JSON or YAML).")
    base_url: str = Field(description="Fixed base URL every call goes to (e.g. https://api.github.com).")
    auth_header: str | None = Field(default=None, description="Header carrying the credential.")
    auth_query: str | None = Field(
        default=None, description="Query parameter carrying the credential (instead of auth_header)."
    )
    auth_value_from_env: str | None = Field(default=None, description="Host env var with its value.")
    auth_value_from_file: str | None = Field(default=None, description="File with its value.")
    headers: dict[str, str] = Field(default_factory=dict, description="Literal (non-secret) headers.")
    timeout: float = Field(default=30.0, gt=0, description="Seconds per call (also bounded by the deadline).")
    max_response_bytes: int = Field(default=1024 * 1024, gt=0, description="Largest response body read.")
    include_operations: list[str] = Field(
        default_factory=list, description="Operation globs to keep (operationId, else 'METHOD /path')."
    )
    exclude_operations: list[str] = Field(default_factory=list, description="Operation globs to drop.")
    include_tags: list[str] = Field(
        default_factory=list, description="Keep operations with one of these tags."
    )
    exclude_tags: list[str] = Field(
        default_factory=list, description="Drop operations with one of these tags."
    )
    methods: list[str] = Field(default_factory=list, description="HTTP methods to keep (empty: all).")
    multi_segment_parameters: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Operation glob -> path parameters whose values may contain '/' (several segments).",
    )
    on_unsupported: Literal["skip", "fail"] = Field(default="skip", description="skip (warn) or fail.")
    rename: dict[str, str] = Field(
        default_factory=dict,
        description="operationId (or 'METHOD /path') -> capability name without the namespace (snake_case).",
    )
    short_generated_names: bool = Field(
        default=True,
        description="Name an operation whose operationId is FastAPI's generated one by its function name.",
    )

    @model_validator(mode="after")
    def _check(self) -> OpenAPIConfig:
        if not _API_NAME.match(self.name):
            raise ValueError(
                f"api name {self.name!r} must be 1-64 of [A-Za-z0-9_-], not starting with - or _"
            )
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"api {self.name!r}: base_url must start with http:// or https://")
        if self.auth_header and self.auth_query:
            raise ValueError(f"api {self.name!r}: set only one of auth_header or auth_query")
        if (self.auth_value_from_env or self.auth_value_from_file) and not (
            self.auth_header or self.auth_query
        ):
            raise ValueError(f"api {self.name!r}: auth_value_from_env/file need auth_header or auth_query")
        if self.auth_value_from_env and self.auth_value_from_file:
            raise ValueError(
                f"api {self.name!r}: set only one of auth_value_from_env or auth_value_from_file"
            )
        for key, short in self.rename.items():
            if not _SHORT_NAME.match(short):
                raise ValueError(
                    f"api {self.name!r}: rename {key!r} = {short!r}: a name is 1-64 of [a-z0-9_], "
                    "starting with a letter (the namespace is added)"
                )
        if len(set(self.rename.values())) != len(self.rename):
            raise ValueError(f"api {self.name!r}: rename gives two operations the same name")
        bad = [m for m in self.methods if m.lower() not in METHODS]
        if bad:
            raise ValueError(f"api {self.name!r}: unknown HTTP methods {bad}")
        try:
            check_namespace(self.resolved_namespace)
        except UpstreamBuildError as exc:
            raise ValueError(f"{exc} (set namespace for api {self.name!r})") from None
        return self

    @property
    def resolved_namespace(self) -> str:
        """The capability name prefix: ``namespace``, else the API name in snake_case."""
        return self.namespace if self.namespace is not None else snake_case(self.name)

    def wanted(self, key: str, method: str, tags: Sequence[str]) -> bool:
        """Whether the filters keep an operation.

        Args:
            key: its operationId, else ``METHOD /path``.
            method: its HTTP method.
            tags: its tags.

        Returns:
            True when ``methods``, the operation globs and the tag lists all keep it.
        """
        if self.methods and method.lower() not in {m.lower() for m in self.methods}:
            return False
        if self.include_operations and not any(fnmatch.fnmatchcase(key, p) for p in self.include_operations):
            return False
        if any(fnmatch.fnmatchcase(key, p) for p in self.exclude_operations):
            return False
        if self.include_tags and not set(tags) & set(self.include_tags):
            return False
        return not set(tags) & set(self.exclude_tags)

    def credential(self) -> str | None:
        """The credential's value (host side only), read from its variable or file.

        Returns:
            The value (a file's trailing newline dropped), or None without a credential.

        Raises:
            UpstreamBuildError: the variable is unset or the file cannot be read.
        """
        if self.auth_value_from_env:
            value = os.environ.get(self.auth_value_from_env)
            if value is None:
                raise UpstreamBuildError(
                    f"api {self.name!r}: auth_value_from_env needs environment variable "
                    f"{self.auth_value_from_env} (unset)"
                )
            return value
        if self.auth_value_from_file:
            try:
                return Path(self.auth_value_from_file).read_text("utf-8").rstrip("\r\n")
            except OSError as exc:
                raise UpstreamBuildError(
                    f"api {self.name!r}: cannot read auth_value_from_file "
                    f"{self.auth_value_from_file}: {exc.strerror}"
                ) from None
        return None

    def request_headers(self) -> dict[str, str]:
        """Literal headers plus the credential when it goes in a header (host side only).

        Returns:
            Header name → value.
        """
        out = dict(self.headers)
        value = self.credential()
        if self.auth_header is not None and value is not None:
            out[self.auth_header] = value
        return out

    def request_params(self) -> dict[str, str]:
        """The credential when it goes in the query string (host side only).

        Returns:
            ``{auth_query: value}``, or empty.
        """
        value = self.credential()
        return {self.auth_query: value} if self.auth_query is not None and value is not None else {}

    def fixed(self, multi_segment: frozenset[str] = frozenset()) -> Fixed:
        """What the host sets itself, so that an operation's own parameters cannot set it.

        Args:
            multi_segment: path parameters allowed to span segments (``path_multi_segment``).

        Returns:
            The configured header names (lower case, the credential's included), the credential's
            query parameter, and ``multi_segment``.
        """
        headers = [*self.headers, *([self.auth_header] if self.auth_header else [])]
        query = [self.auth_query] if self.auth_query else []
        return Fixed(frozenset(h.lower() for h in headers), frozenset(query), multi_segment)
