"""OpenAPI 3.0 / 3.1 documents as capabilities: one capability per operation with an operationId.

Each :class:`OpenAPIConfig` names a document (file path or http(s) URL, read once at build and
fetched without credentials), the fixed ``base_url`` every call goes to (a program can never
choose the host), an optional auth header whose value the host reads from an environment
variable or a secret file, a timeout and a response size bound. :func:`openapi_pack` builds a
pack from a list of them.

**Ids and names.** id ``openapi:<api name>:<operationId>``; name ``<namespace>.<snake_case
operationId>`` (``codemode.packs.upstream.capability_names``: ``issues/list-for-repo`` →
``github.issues_list_for_repo``).

**Inputs (flattening rule).**

1. Path, query and header parameters become keyword arguments (path parameters are required; the
   others follow their ``required``). Names that are not Starlark identifiers are snake_cased
   (``X-Request-Id`` → ``x_request_id``, ``per-page`` → ``per_page``), deduplicated with ``_2``.
2. A required JSON request body (``application/json`` or ``*+json``) whose schema is a record
   contributes its properties as further keyword arguments, unless one of them collides with a
   parameter's keyword. Otherwise (optional body, non-record body, collision) the whole body is one
   argument named ``body`` (``body_`` if a parameter took that name), optional when the body is.
   Header parameters that the configuration fixes (``auth_header``, ``headers``) and hop-by-hop
   headers (``Host``, ``Content-Length``...) are never arguments: a program cannot override them.
3. Refused (the operation is skipped with a reason): cookie parameters that are required,
   parameters given by ``content`` instead of ``schema``, object-valued query/header/path
   parameters, request bodies that are required but not JSON, and any schema the JSON Schema
   compiler refuses (``codemode.packs.jsonschema``). Optional cookie parameters and optional non-JSON
   bodies are left out.

Query arrays are sent ``form``/``explode`` (``?tag=a&tag=b``), booleans as ``true``/``false``.

**Output.** The JSON schema of the first 2xx response (``200``, ``201``, ..., ``2XX``): a record is
the output as is; anything else (a list, a scalar, a dict) is wrapped as ``{result: T}``. A 2xx
response without content (e.g. ``204``) gives ``{}``. Operations whose success responses are not
JSON are skipped.

**Calls.** One ``httpx.AsyncClient`` per event loop (connections are reused), bounded by
``timeout`` and the execute deadline. A non-2xx status fails as ``capability failed: HTTP <status>:
<reason>`` (the reason: a ``message``/``detail``/``error`` string of a JSON error body, else the
status phrase; at most 120 characters). A response over ``max_response_bytes``, a non-JSON body,
a transport error or an output that does not fit its schema is a plain ``capability failed``
(detail in the host log).
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from codemode import AgentError, CallContext, Capability
from codemode.authz import Subject
from codemode.catalog.answers import AnswerBounds
from codemode.packs.jsonschema import Dialect, Unsupported, compile_schema
from codemode.packs.loading import PackSettings
from codemode.packs.upstream import (
    SkipReport,
    UpstreamBuildError,
    answer_problem,
    argument_names,
    capability_names,
    check_namespace,
    check_unique_names,
    description_of,
    search_terms_of,
    snake_case,
    summary_of,
)

__all__ = ["OpenAPIConfig", "OpenAPIPack", "Operation", "openapi_pack"]

log = logging.getLogger("codemode.capabilities.openapi")

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
MAX_REASON = 120
_API_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
_OPERATION_ID = re.compile(r"[\x21-\x7e]{1,200}\Z")
_HOP_HEADERS = frozenset(
    ["host", "content-length", "content-type", "transfer-encoding", "connection", "accept-encoding", "te"]
)
_JSON_TYPE = re.compile(r"application/(?:[\w.+-]+\+)?json\s*(?:;.*)?\Z", re.IGNORECASE)


class OpenAPIConfig(BaseModel):
    """One OpenAPI document (an ``[[openapi]]`` table in the TOML settings)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="API id: capability ids are openapi:<name>:<operationId>.")
    namespace: str | None = Field(default=None, description="Capability name prefix; default: name.")
    document: str = Field(description="Path or http(s) URL of the OpenAPI 3.x document (JSON or YAML).")
    base_url: str = Field(description="Fixed base URL every call goes to (e.g. https://api.github.com).")
    auth_header: str | None = Field(default=None, description="Header carrying the credential.")
    auth_value_from_env: str | None = Field(default=None, description="Host env var with its value.")
    auth_value_from_file: str | None = Field(default=None, description="File with its value.")
    headers: dict[str, str] = Field(default_factory=dict, description="Literal (non-secret) headers.")
    timeout: float = Field(default=30.0, gt=0, description="Seconds per call (also bounded by the deadline).")
    max_response_bytes: int = Field(default=1024 * 1024, gt=0, description="Largest response body read.")
    include_operations: list[str] = Field(default_factory=list, description="operationId globs to keep.")
    exclude_operations: list[str] = Field(default_factory=list, description="operationId globs to drop.")
    include_tags: list[str] = Field(
        default_factory=list, description="Keep operations with one of these tags."
    )
    exclude_tags: list[str] = Field(
        default_factory=list, description="Drop operations with one of these tags."
    )
    methods: list[str] = Field(default_factory=list, description="HTTP methods to keep (empty: all).")
    on_unsupported: Literal["skip", "fail"] = Field(default="skip", description="skip (warn) or fail.")

    @model_validator(mode="after")
    def _check(self) -> OpenAPIConfig:
        if not _API_NAME.match(self.name):
            raise ValueError(
                f"api name {self.name!r} must be 1-64 of [A-Za-z0-9_-], not starting with - or _"
            )
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"api {self.name!r}: base_url must start with http:// or https://")
        if (self.auth_value_from_env or self.auth_value_from_file) and not self.auth_header:
            raise ValueError(f"api {self.name!r}: auth_value_from_env/file need auth_header")
        if self.auth_value_from_env and self.auth_value_from_file:
            raise ValueError(
                f"api {self.name!r}: set only one of auth_value_from_env or auth_value_from_file"
            )
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
        return self.namespace if self.namespace is not None else snake_case(self.name)

    def wanted(self, operation_id: str, method: str, tags: Sequence[str]) -> bool:
        if self.methods and method.lower() not in {m.lower() for m in self.methods}:
            return False
        if self.include_operations and not any(
            fnmatch.fnmatchcase(operation_id, p) for p in self.include_operations
        ):
            return False
        if any(fnmatch.fnmatchcase(operation_id, p) for p in self.exclude_operations):
            return False
        if self.include_tags and not set(tags) & set(self.include_tags):
            return False
        return not set(tags) & set(self.exclude_tags)

    def request_headers(self) -> dict[str, str]:
        """Literal headers plus the credential (host side only)."""
        out = dict(self.headers)
        if self.auth_header is None:
            return out
        if self.auth_value_from_env:
            value = os.environ.get(self.auth_value_from_env)
            if value is None:
                raise UpstreamBuildError(
                    f"api {self.name!r}: auth header needs environment variable "
                    f"{self.auth_value_from_env} (unset)"
                )
            out[self.auth_header] = value
        elif self.auth_value_from_file:
            try:
                out[self.auth_header] = Path(self.auth_value_from_file).read_text("utf-8").rstrip("\r\n")
            except OSError as exc:
                raise UpstreamBuildError(
                    f"api {self.name!r}: cannot read auth_value_from_file "
                    f"{self.auth_value_from_file}: {exc.strerror}"
                ) from None
        return out


# --------------------------------------------------------------------------------------- document


def load_document(location: str, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> dict[str, Any]:
    """Read a JSON or YAML document from a path or URL (once, at build)."""
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


def _resolve(doc: Mapping[str, Any], node: Any, depth: int = 0) -> Any:
    """Follow a chain of local ``$ref`` (parameters, request bodies, responses)."""
    while isinstance(node, Mapping) and "$ref" in node and depth < 32:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise Unsupported("", f"non-local $ref {ref!r}")
        target: Any = doc
        for raw in ref[2:].split("/"):
            part = raw.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, Mapping) or part not in target:
                raise Unsupported("", f"$ref {ref!r} does not resolve")
            target = target[part]
        node, depth = target, depth + 1
    return node


# -------------------------------------------------------------------------------------- operation


@dataclass(frozen=True)
class Param:
    keyword: str
    name: str
    where: Literal["path", "query", "header", "body_field", "body"]


@dataclass(frozen=True)
class Operation:
    """One compiled operation: how keyword arguments map to the HTTP request."""

    cap_id: str
    method: str
    path: str
    params: tuple[Param, ...]
    wraps_result: bool
    empty_result: bool


def _json_media(content: Any) -> Any:
    if not isinstance(content, Mapping):
        return None
    for media, body in content.items():
        if isinstance(media, str) and _JSON_TYPE.match(media):
            return body if isinstance(body, Mapping) else {}
    return None


def _success_response(
    doc: Mapping[str, Any], responses: Any, dialect: Dialect, omissions: list[Unsupported]
) -> tuple[dict[str, Any], bool, bool]:
    """(output record, wraps_result, empty_result) from the first 2xx response."""
    if not isinstance(responses, Mapping):
        raise Unsupported("/responses", "no responses")
    codes = sorted(str(c) for c in responses if re.fullmatch(r"2\d\d", str(c)))
    codes += [c for c in responses if str(c).upper() == "2XX"]
    if not codes:
        raise Unsupported("/responses", "no 2xx response")
    code = codes[0]
    response = _resolve(doc, responses[code])
    content = response.get("content") if isinstance(response, Mapping) else None
    if not content:
        return {"t": "record", "fields": []}, False, True
    media = _json_media(content)
    if media is None:
        raise Unsupported(
            f"/responses/{code}", f"success response is not JSON ({', '.join(map(str, content))})"
        )
    schema = media.get("schema")
    if schema is None:
        raise Unsupported(f"/responses/{code}", "JSON response without a schema")
    shape = compile_schema(
        schema,
        document=doc,
        dialect=dialect,
        direction="output",
        pointer=f"/responses/{code}",
        omissions=omissions,
    )
    if shape["t"] == "record":
        return shape, False, False
    return {"t": "record", "fields": [{"name": "result", "shape": shape}]}, True, False


def compile_operation(
    doc: Mapping[str, Any],
    path: str,
    method: str,
    op: Mapping[str, Any],
    path_params: Sequence[Any],
    dialect: Dialect,
    omissions: list[Unsupported] | None = None,
    fixed_headers: frozenset[str] = frozenset(),
) -> tuple[dict[str, Any], dict[str, Any], list[Param], bool, bool]:
    """(input record, output record, params, wraps_result, empty_result) or :class:`Unsupported`.

    Header parameters named in ``fixed_headers`` (lower case: the configured auth and literal
    headers) and hop-by-hop headers are never inputs: a program cannot override them.
    """
    merged: dict[tuple[str, str], Mapping[str, Any]] = {}
    for raw in [*path_params, *(op.get("parameters") or [])]:
        p = _resolve(doc, raw)
        if (
            not isinstance(p, Mapping)
            or not isinstance(p.get("name"), str)
            or not isinstance(p.get("in"), str)
        ):
            raise Unsupported("/parameters", "malformed parameter")
        merged[(p["in"], p["name"])] = p
    fields: list[tuple[str, dict[str, Any], str]] = []  # (original name, shape, where)
    for (where, name), p in merged.items():
        pointer = f"/parameters/{where}/{name}"
        if where == "header" and (name.lower() in fixed_headers or name.lower() in _HOP_HEADERS):
            continue
        if where == "cookie":
            if p.get("required"):
                raise Unsupported(pointer, "required cookie parameter")
            continue
        if "schema" not in p:
            raise Unsupported(pointer, "parameter described by 'content' instead of 'schema'")
        shape = compile_schema(p["schema"], document=doc, dialect=dialect, direction="input", pointer=pointer)
        inner = shape["of"] if shape["t"] == "opt" else shape
        if inner["t"] in ("record", "dict") or (inner["t"] == "list" and where != "query"):
            raise Unsupported(pointer, f"{inner['t']}-valued {where} parameter")
        if inner["t"] == "list" and inner["of"]["t"] in ("record", "dict", "list"):
            raise Unsupported(pointer, "query array of structured values")
        required = where == "path" or p.get("required") is True
        if not required and shape["t"] != "opt":
            shape = {"t": "opt", "of": shape}
        fields.append((name, shape, where))
    keywords = argument_names([f[0] for f in fields])
    # two parameters with the same name in different places keep distinct keywords
    params = [Param(keywords[n], n, w) for n, _, w in fields]  # type: ignore[arg-type]
    record_fields: list[dict[str, Any]] = [{"name": keywords[n], "shape": s} for n, s, _ in fields]
    body = _resolve(doc, op.get("requestBody")) if op.get("requestBody") is not None else None
    if isinstance(body, Mapping):
        media = _json_media(body.get("content"))
        body_required = body.get("required") is True
        if media is None:
            if body_required:
                raise Unsupported("/requestBody", "required request body is not JSON")
        elif "schema" not in media:
            raise Unsupported("/requestBody", "JSON request body without a schema")
        else:
            shape = compile_schema(
                media["schema"], document=doc, dialect=dialect, direction="input", pointer="/requestBody"
            )
            taken: set[str] = {str(f["name"]) for f in record_fields}
            flat = (
                body_required
                and shape["t"] == "record"
                and shape["fields"]
                and not taken & set(argument_names([f["name"] for f in shape["fields"]]).values())
            )
            if flat:
                body_keywords = argument_names([f["name"] for f in shape["fields"]], taken)
                for f in shape["fields"]:
                    kw = body_keywords[f["name"]]
                    params.append(Param(kw, f["name"], "body_field"))
                    record_fields.append({"name": kw, "shape": f["shape"]})
            else:
                kw = "body" if "body" not in taken else "body_"
                params.append(Param(kw, "body", "body"))
                record_fields.append({"name": kw, "shape": shape if body_required else _optional(shape)})
    output, wraps, empty = _success_response(
        doc, op.get("responses"), dialect, omissions if omissions is not None else []
    )
    return {"t": "record", "fields": record_fields}, output, params, wraps, empty


def _optional(shape: dict[str, Any]) -> dict[str, Any]:
    return shape if shape["t"] == "opt" else {"t": "opt", "of": shape}


# ------------------------------------------------------------------------------------------ calls


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return repr(value)
    return str(value)


class _HTTP:
    """One ``httpx.AsyncClient`` per event loop, shared by every operation of an API."""

    def __init__(self, config: OpenAPIConfig) -> None:
        self.config = config
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = httpx.AsyncClient(
                base_url=self.config.base_url.rstrip("/"),
                headers=self.config.request_headers(),
                timeout=self.config.timeout,
                follow_redirects=False,
            )
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None


class CallFailed(Exception):
    """A call failed for a reason the client must not see (already logged)."""


def _reason(response: httpx.Response, body: bytes) -> str:
    text = ""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, Mapping):
        for key in ("message", "detail", "error", "title"):
            if isinstance(data.get(key), str) and data[key].strip():
                text = data[key]
                break
    text = text or response.reason_phrase or ""
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return text[:MAX_REASON]


class _Handler:
    def __init__(self, http: _HTTP, op: Operation) -> None:
        self.http = http
        self.op = op

    async def __call__(self, ctx: CallContext, subject: Subject, args: dict[str, Any]) -> dict[str, Any]:
        cfg, op = self.http.config, self.op
        path = op.path
        query: list[tuple[str, str | int | float | bool | None]] = []
        headers: dict[str, str] = {}
        body: Any = None
        body_fields: dict[str, Any] = {}
        for p in op.params:
            if p.keyword not in args:
                continue
            value = args[p.keyword]
            if p.where == "path":
                text = _query_value(value)
                if text in ("", ".", ".."):
                    # encoded or not, a dot segment could walk the path outside the operation
                    raise AgentError(f"path parameter {p.keyword} must not be empty, '.' or '..'")
                path = path.replace("{" + p.name + "}", quote(text, safe=""))
            elif p.where == "query":
                values = value if isinstance(value, list) else [value]
                query += [(p.name, _query_value(v)) for v in values]
            elif p.where == "header":
                headers[p.name] = _query_value(value)
            elif p.where == "body_field":
                body_fields[p.name] = value
            else:
                body = value
        if any(p.where == "body_field" for p in op.params):
            body = body_fields
        budget = min(cfg.timeout, ctx.remaining())
        if budget <= 0:
            raise CallFailed(op.cap_id)
        try:
            async with asyncio.timeout(budget):
                request = self.http.client().build_request(
                    op.method.upper(),
                    path,
                    params=query or None,
                    headers=headers or None,
                    json=body if body is not None else None,
                )
                if not _same_origin(request.url, cfg.base_url):
                    # Never reachable through a compiled path; kept as the last guard of the credential.
                    log.warning("openapi %r: %s would leave base_url; refused", cfg.name, op.cap_id)
                    raise CallFailed(op.cap_id)
                response = await self.http.client().send(request, stream=True)
                try:
                    data = bytearray()
                    async for chunk in response.aiter_bytes():  # decoded: the bound counts real bytes
                        data += chunk
                        if len(data) > cfg.max_response_bytes:
                            log.warning(
                                "api %r: %s response exceeds %d bytes",
                                cfg.name,
                                op.cap_id,
                                cfg.max_response_bytes,
                            )
                            raise CallFailed(op.cap_id)
                finally:
                    await response.aclose()
        except CallFailed:
            raise
        except (TimeoutError, httpx.HTTPError) as exc:
            log.warning("api %r: %s failed: %s: %s", cfg.name, op.cap_id, type(exc).__name__, str(exc)[:300])
            raise CallFailed(op.cap_id) from None
        raw = bytes(data)
        if not 200 <= response.status_code < 300:
            # An authentication answer may echo part of the host's credential: status only.
            reason = "" if response.status_code in (401, 403, 407) else _reason(response, raw)
            raise AgentError(f"HTTP {response.status_code}" + (f": {reason}" if reason else ""))
        if op.empty_result:
            return {}
        try:
            value = json.loads(raw)
        except ValueError:
            log.warning(
                "api %r: %s returned a non-JSON body (%s)",
                cfg.name,
                op.cap_id,
                response.headers.get("content-type"),
            )
            raise CallFailed(op.cap_id) from None
        if op.wraps_result:
            return {"result": value}
        if not isinstance(value, dict):
            log.warning("api %r: %s returned %s, not an object", cfg.name, op.cap_id, type(value).__name__)
            raise CallFailed(op.cap_id)
        return value


# ------------------------------------------------------------------------------------------- pack


def compile_document(
    config: OpenAPIConfig, doc: Mapping[str, Any], http: _HTTP, bounds: AnswerBounds | None = None
) -> tuple[list[Capability], SkipReport]:
    """Every wanted operation as a capability, plus the report of what was skipped and why."""
    report = SkipReport(config.name, config.on_unsupported)
    dialect: Dialect = "openapi-3.0" if str(doc.get("openapi")).startswith("3.0") else "openapi-3.1"
    found: list[tuple[str, str, str, Mapping[str, Any], list[Any]]] = []
    paths = doc.get("paths") or {}
    for path, item in paths.items() if isinstance(paths, Mapping) else []:
        if not _relative_path(path):
            report.skip(f"path {str(path)[:80]}", "path must be relative to base_url (one leading /)")
            continue
        item = _resolve(doc, item)
        if not isinstance(item, Mapping):
            continue
        for method in METHODS:
            op = item.get(method)
            if not isinstance(op, Mapping):
                continue
            op_id = op.get("operationId")
            if not isinstance(op_id, str):
                report.skip(f"{method.upper()} {path}", "no operationId")
                continue
            tags = [t for t in op.get("tags") or [] if isinstance(t, str)]
            if config.wanted(op_id, method, tags):
                found.append((op_id, path, method, op, list(item.get("parameters") or [])))
    names = capability_names(config.resolved_namespace, [f[0] for f in found])
    fixed = frozenset(
        h.lower() for h in [*config.headers, *([config.auth_header] if config.auth_header else [])]
    )
    caps: list[Capability] = []
    seen_ids: set[str] = set()
    for op_id, path, method, op, path_params in sorted(found, key=lambda f: names[f[0]]):
        if not _OPERATION_ID.match(op_id) or op_id in seen_ids:
            report.skip(op_id[:80], "operationId is not unique printable ASCII without spaces (≤ 200)")
            continue
        seen_ids.add(op_id)
        omissions: list[Unsupported] = []
        try:
            in_shape, out_shape, params, wraps, empty = compile_operation(
                doc, path, method, op, path_params, dialect, omissions, fixed
            )
        except Unsupported as exc:
            report.skip(op_id, str(exc))
            continue
        for omission in omissions:
            report.omit(op_id, str(omission))
        cap_id = f"openapi:{config.name}:{op_id}"
        operation = Operation(cap_id, method, path, tuple(params), wraps, empty)
        summary = op.get("summary") if isinstance(op.get("summary"), str) else None
        description = op.get("description") if isinstance(op.get("description"), str) else None
        tags = [t for t in op.get("tags") or [] if isinstance(t, str)]
        caps.append(
            Capability(
                id=cap_id,
                name=names[op_id],
                summary=summary_of(summary or description, f"{method.upper()} {path}"),
                description=description_of(summary, description, f"HTTP: {method.upper()} {path}"),
                search_terms=search_terms_of(op_id, *tags[:4], f"{method.upper()} {path}"),
                handler=_Handler(http, operation),
                input_shape=in_shape,
                output_shape=out_shape,
                third_party=True,
            )
        )
        too_large = answer_problem(caps[-1], bounds or AnswerBounds())
        if too_large is not None:  # never cut: a cut signature would lie
            caps.pop()
            report.skip(op_id, too_large)
            continue
        report.converted.append(op_id)
    report.finish()
    return caps, report


class OpenAPIPack:
    """A pack over several OpenAPI documents (see the module docstring)."""

    def __init__(self, configs: Sequence[OpenAPIConfig]) -> None:
        check_unique_names((cfg.name for cfg in configs), "api")
        self.configs = list(configs)
        self.clients = {cfg.name: _HTTP(cfg) for cfg in self.configs}
        self.reports: dict[str, SkipReport] = {}

    def capabilities(self, settings: PackSettings | None = None) -> list[Capability]:
        caps: list[Capability] = []
        for cfg in self.configs:
            cfg.request_headers()  # a missing credential fails the build, not the first call
            doc = load_document(cfg.document)
            bounds = settings.answer_bounds if settings is not None else None
            one, report = compile_document(cfg, doc, self.clients[cfg.name], bounds)
            self.reports[cfg.name] = report
            caps += one
        return caps

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()


def openapi_pack(configs: Sequence[OpenAPIConfig | Mapping[str, Any]]) -> OpenAPIPack:
    """Build the pack from configs (models or plain mappings, e.g. ``[[openapi]]`` tables)."""
    return OpenAPIPack(
        [c if isinstance(c, OpenAPIConfig) else OpenAPIConfig.model_validate(c) for c in configs]
    )


def _relative_path(path: Any) -> bool:
    """An OpenAPI path key that stays under ``base_url``: one leading ``/``, no scheme, no authority,
    no query, fragment or backslash (httpx would send an absolute URL as it is, credential included)."""
    return (
        isinstance(path, str)
        and path.startswith("/")
        and not path.startswith("//")
        and "://" not in path
        and not any(c in path for c in "\\?#")
    )


def _same_origin(url: httpx.URL, base_url: str) -> bool:
    base = httpx.URL(base_url)
    return (url.scheme, url.host, url.port) == (base.scheme, base.host, base.port)
