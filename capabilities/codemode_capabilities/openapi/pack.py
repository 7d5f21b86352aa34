"""OpenAPI 3.0 / 3.1 documents as capabilities: one capability per operation.

Each :class:`OpenAPIConfig` names a document (file path or http(s) URL, read once at build and
fetched without credentials), the fixed ``base_url`` every call goes to (a program can never
choose the host or leave its path), an optional credential (a header or a query parameter whose
value the host reads from an environment variable or a secret file), a timeout and a response size
bound. :func:`openapi_pack` builds a pack from a list of them. The full rules, with the coverage
measured on published documents, are in ``docs/packs.md`` (*OpenAPI documents*):

* **Ids and names.** An operation with a usable ``operationId`` (unique in the document, 1-200
  printable ASCII characters without spaces) gets the id ``openapi:<api>:<operationId>`` and the
  name ``<namespace>.<snake_case operationId>``. Any other operation is named from its method and
  path: id ``openapi:<api>:<METHOD>:<path>``, name ``<namespace>.<snake_case "<method> <path>">``
  (``GET /character/search`` → ``stapi.get_character_search``). Names clashing after snake_case get
  ``_2``, ``_3``... (operationIds first, then derived names, each in sorted order).
* **Inputs** (:mod:`codemode_capabilities.openapi.operation`): path, query and header parameters,
  then the JSON or form-urlencoded request body, flattened into keyword arguments.
* **Path values** (:mod:`codemode_capabilities.openapi.paths`): one segment each, unless the
  operator lists the parameter in ``multi_segment_parameters``.
* **Calls** (:mod:`codemode_capabilities.openapi.calls`): the credential never comes back to the
  program (redacted from error reasons and results).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx

from codemode import Capability
from codemode.packs import (
    MAX_ID_BYTES,
    AnswerBounds,
    Dialect,
    PackSettings,
    SkipReport,
    Unsupported,
    UpstreamBuildError,
    capability_names,
    check_unique_names,
    compile_each,
    description_of,
    did_you_mean,
    search_terms_of,
    summary_of,
)

from .calls import HTTP, Handler
from .config import OpenAPIConfig
from .operation import METHODS, Operation, compile_operation, resolve

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "OpenAPIConfig",
    "OpenAPIPack",
    "Operation",
    "compile_document",
    "load_document",
    "openapi_pack",
]

log = logging.getLogger("codemode.capabilities.openapi")

#: Bytes of an OpenAPI document read at build.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
_OPERATION_ID = re.compile(r"[\x21-\x7e]{1,200}\Z")
_ID_SAFE = "/{}:@!$&'()*+,;="  # kept as they are in an id derived from a path (others %-encoded)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}\Z")


# --------------------------------------------------------------------------------------- document


def load_document(location: str, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> dict[str, Any]:
    """Read a JSON or YAML document from a path or URL (once, at build; a URL is fetched without
    credentials, redirects followed).

    Args:
        location: a file path or an http(s) URL.
        max_bytes: the bound on the document's bytes.

    Returns:
        The document.

    Raises:
        UpstreamBuildError: it cannot be read or fetched, is over ``max_bytes``, is neither JSON
            nor YAML, or is not an OpenAPI 3.x document.
    """
    if location.startswith(("http://", "https://")):
        try:
            with httpx.stream("GET", location, timeout=30.0, follow_redirects=True) as response:
                response.raise_for_status()
                data = b""
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) > max_bytes:
                        raise UpstreamBuildError(f"OpenAPI document {location} exceeds {max_bytes} bytes")
        except httpx.HTTPError as exc:
            raise UpstreamBuildError(f"cannot fetch OpenAPI document {location}: {exc}") from None
    else:
        try:
            path = Path(location)
            if path.stat().st_size > max_bytes:
                raise UpstreamBuildError(f"OpenAPI document {location} exceeds {max_bytes} bytes")
            data = path.read_bytes()
        except OSError as exc:
            raise UpstreamBuildError(f"cannot read OpenAPI document {location}: {exc.strerror}") from None
    try:
        doc = json.loads(data)
    except ValueError:
        try:
            import yaml

            doc = yaml.safe_load(data)
        except Exception as exc:
            raise UpstreamBuildError(f"OpenAPI document {location} is neither JSON nor YAML: {exc}") from None
    if not isinstance(doc, dict) or not str(doc.get("openapi", "")).startswith("3."):
        raise UpstreamBuildError(f"{location} is not an OpenAPI 3.x document (needs 'openapi: 3.x')")
    return doc


# ------------------------------------------------------------------------------------- operations


@dataclass(frozen=True)
class _Entry:
    """One operation of the document, with the key filters and names use."""

    path: str
    method: str
    op: Mapping[str, Any]
    path_params: list[Any]
    operation_id: str | None  # usable: unique, printable ASCII without spaces, <= 200
    unusable: str | None  # why the document's operationId is not used (None: used, or none given)

    @property
    def key(self) -> str:
        return self.operation_id or f"{self.method.upper()} {self.path}"

    def cap_id(self, api: str) -> str:
        if self.operation_id is not None:
            return f"openapi:{api}:{self.operation_id}"
        return f"openapi:{api}:{self.method.upper()}:{quote(self.path, safe=_ID_SAFE)}"

    @property
    def tags(self) -> list[str]:
        return [t for t in self.op.get("tags") or [] if isinstance(t, str)]


def _entries(doc: Mapping[str, Any], report: SkipReport) -> list[_Entry]:
    raw: list[tuple[str, str, Mapping[str, Any], list[Any]]] = []
    paths = doc.get("paths") or {}
    for path, item in paths.items() if isinstance(paths, Mapping) else []:
        if not _relative_path(path):
            report.skip(
                f"path {str(path)[:80]}", "path must be relative to base_url (one leading /, no dot segment)"
            )
            continue
        try:
            item = resolve(doc, item)
        except Unsupported as exc:
            report.skip(f"path {path[:80]}", str(exc))
            continue
        if not isinstance(item, Mapping):
            continue
        for method in METHODS:
            if isinstance(item.get(method), Mapping):
                raw.append((path, method, item[method], list(item.get("parameters") or [])))
    ids = Counter(op.get("operationId") for _, _, op, _ in raw if isinstance(op.get("operationId"), str))
    out: list[_Entry] = []
    for path, method, op, path_params in raw:
        op_id = op.get("operationId")
        unusable: str | None = None
        if op_id is not None and not isinstance(op_id, str):
            unusable = "operationId is not a string"
        elif isinstance(op_id, str) and not _OPERATION_ID.match(op_id):
            unusable = "operationId is not 1-200 printable ASCII characters without spaces"
        elif isinstance(op_id, str) and ids[op_id] > 1:
            unusable = f"operationId is used by {ids[op_id]} operations"
        usable = op_id if isinstance(op_id, str) and unusable is None else None
        out.append(_Entry(path, method, op, path_params, usable, unusable))
    return out


def _generated_short_name(operation_id: str, method: str, path: str) -> str | None:
    """The function name in FastAPI's generated operationId, ``<function><path>_<method>`` with every
    non-word character of ``<function><path>`` made ``_`` (``get_todo_todos__todo_id__get`` for
    ``def get_todo`` on ``GET /todos/{todo_id}``).

    Args:
        operation_id: the operation's operationId.
        method: its HTTP method.
        path: its path, as in the document.

    Returns:
        ``get_todo``, or None when the operationId is not of that form.
    """
    suffix = re.sub(r"\W", "_", path) + "_" + method.lower()
    if not operation_id.endswith(suffix):
        return None
    short = operation_id[: -len(suffix)]
    return short if _IDENTIFIER.match(short) else None


def _names(config: OpenAPIConfig, entries: Sequence[_Entry]) -> dict[str, str]:
    """``{key: capability name}``: renamed operations first, then operationIds (FastAPI's generated
    ones by their function name, unless two would share it), then names derived from method and
    path."""
    namespace = config.resolved_namespace
    renamed = {e.key: f"{namespace}.{config.rename[e.key]}" for e in entries if e.key in config.rename}
    taken = [n[len(namespace) + 1 :] for n in renamed.values()]
    sources: dict[str, str] = {}
    for e in entries:
        if e.operation_id is not None and e.key not in renamed:
            short = (
                _generated_short_name(e.operation_id, e.method, e.path)
                if config.short_generated_names
                else None
            )
            sources[e.key] = short or e.operation_id
    counts = Counter(sources.values())
    sources = {key: source if counts[source] == 1 else key for key, source in sources.items()}
    by_source = capability_names(namespace, sources.values(), taken)
    named = {key: by_source[source] for key, source in sources.items()}
    taken += [n[len(namespace) + 1 :] for n in named.values()]
    derived = [e.key for e in entries if e.operation_id is None and e.key not in renamed]
    return {**renamed, **named, **capability_names(namespace, derived, taken)}


def _check_renames(config: OpenAPIConfig, entries: Sequence[_Entry]) -> None:
    keys = {e.key for e in entries}
    for key in config.rename:
        if key not in keys:
            raise UpstreamBuildError(
                f"api {config.name!r}: rename {key!r}: no operation has that operationId "
                f"or 'METHOD /path'{did_you_mean(key, sorted(keys), cutoff=0.6)}"
            )


def _multi_segment(config: OpenAPIConfig, entries: Sequence[_Entry]) -> dict[str, frozenset[str]]:
    """``{key: path parameters that may span segments}``; an entry that applies nowhere is an error."""
    out: dict[str, set[str]] = {}
    for pattern, params in config.multi_segment_parameters.items():
        for param in params:
            hits = [e for e in entries if fnmatch.fnmatchcase(e.key, pattern) and "{" + param + "}" in e.path]
            if not hits:
                raise UpstreamBuildError(
                    f"api {config.name!r}: multi_segment_parameters {pattern!r} = [{param!r}]: no operation "
                    f"matching {pattern!r} has a path parameter {param!r}"
                )
            for e in hits:
                out.setdefault(e.key, set()).add(param)
    return {k: frozenset(v) for k, v in out.items()}


def compile_document(
    config: OpenAPIConfig, doc: Mapping[str, Any], http: HTTP, bounds: AnswerBounds | None = None
) -> tuple[list[Capability], SkipReport]:
    """Every wanted operation as a capability (the rules: docs/packs.md, "OpenAPI documents").

    Args:
        config: the API's configuration.
        doc: its document.
        http: the API's client, shared by the handlers.
        bounds: the server's answer bounds (an operation whose answers would not fit is skipped).

    Returns:
        The capabilities, and the report of what was skipped and why (already finished: logged,
        or raised with ``on_unsupported = "fail"``).
    """
    report = SkipReport(config.name, config.on_unsupported)
    dialect: Dialect = "openapi-3.0" if str(doc.get("openapi")).startswith("3.0") else "openapi-3.1"
    every = _entries(doc, report)
    multi = _multi_segment(config, every)
    entries = [e for e in every if config.wanted(e.key, e.method, e.tags)]
    _check_renames(config, every)
    names = _names(config, entries)
    claimed = {e.cap_id(config.name) for e in entries if e.operation_id is not None}
    derived = [f"{e.key} ({e.unusable})" for e in entries if e.unusable]
    if derived:
        log.info(
            "api %r: %d operation(s) named from method and path: %s",
            config.name,
            len(derived),
            "; ".join(derived),
        )
    kept: list[_Entry] = []
    for entry in sorted(entries, key=lambda e: names[e.key]):
        cap_id = entry.cap_id(config.name)
        if entry.operation_id is None and (cap_id in claimed or len(cap_id.encode()) > MAX_ID_BYTES):
            report.skip(entry.key[:80], "the id derived from method and path is taken or too long")
        else:
            kept.append(entry)

    def build(entry: _Entry, omissions: list[Unsupported]) -> Capability:
        cap_id = entry.cap_id(config.name)
        compiled = compile_operation(
            doc, entry.method, entry.op, entry.path_params, dialect, omissions,
            config.fixed(multi.get(entry.key, frozenset())),
        )  # fmt: skip
        operation = Operation(
            cap_id, entry.method, entry.path, tuple(compiled.params), compiled.wraps_result,
            compiled.empty_result, compiled.body_media,
        )  # fmt: skip
        op = entry.op
        summary = op.get("summary") if isinstance(op.get("summary"), str) else None
        description = op.get("description") if isinstance(op.get("description"), str) else None
        http_line = f"{entry.method.upper()} {entry.path}"
        return Capability(
            id=cap_id,
            name=names[entry.key],
            summary=summary_of(summary or description, http_line),
            description=description_of(summary, description, f"HTTP: {http_line}"),
            search_terms=search_terms_of(entry.operation_id, *entry.tags[:4], http_line),
            handler=Handler(http, operation),
            input_shape=compiled.input_shape,
            output_shape=compiled.output_shape,
            third_party=True,
        )

    return compile_each(kept, lambda e: e.key, build, report, bounds), report


# ------------------------------------------------------------------------------------------- pack


class OpenAPIPack:
    """A pack over several OpenAPI documents (see the module docstring).

    Args:
        configs: the APIs (names must be unique).

    Raises:
        UpstreamBuildError: two configs have the same name.
    """

    def __init__(self, configs: Sequence[OpenAPIConfig]) -> None:
        check_unique_names((cfg.name for cfg in configs), "api")
        self.configs = list(configs)
        self.clients = {cfg.name: HTTP(cfg) for cfg in self.configs}
        self.reports: dict[str, SkipReport] = {}

    def capabilities(self, settings: PackSettings | None = None) -> list[Capability]:
        caps: list[Capability] = []
        for cfg in self.configs:
            cfg.credential()  # a missing credential fails the build, not the first call
            doc = load_document(cfg.document)
            bounds = settings.answer_bounds if settings is not None else None
            one, report = compile_document(cfg, doc, self.clients[cfg.name], bounds)
            self.reports[cfg.name] = report
            caps += one
        return caps

    async def aclose(self) -> None:
        """Close each API's client."""
        for client in self.clients.values():
            await client.aclose()


def openapi_pack(configs: Sequence[OpenAPIConfig | Mapping[str, Any]]) -> OpenAPIPack:
    """Build the pack from configs.

    Args:
        configs: models or plain mappings (``[[openapi]]`` tables).

    Returns:
        The pack.
    """
    return OpenAPIPack(
        [c if isinstance(c, OpenAPIConfig) else OpenAPIConfig.model_validate(c) for c in configs]
    )


def _relative_path(path: Any) -> bool:
    """An OpenAPI path key that stays under ``base_url``: one leading ``/``, no scheme, no authority,
    no query, fragment or backslash (httpx would send an absolute URL as it is, credential included),
    and no ``.`` or ``..`` segment, even encoded (it would climb out of base_url's path)."""
    return (
        isinstance(path, str)
        and path.startswith("/")
        and not path.startswith("//")
        and "://" not in path
        and not any(c in path for c in "\\?#")
        and not any(unquote(segment) in (".", "..") for segment in path.split("/"))
    )
