"""One OpenAPI operation compiled: its keyword arguments, how they map to the request, its output.

The rules are those of ``docs/packs.md`` (*OpenAPI documents*): :func:`compile_operation` either
returns a :class:`Compiled` operation or raises :class:`~codemode.packs.jsonschema.Unsupported`
naming the part of the operation and the reason it cannot be represented.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from codemode.packs import Dialect, Unsupported, argument_names, compile_schema

from ._defaults import declared_default

__all__ = [
    "METHODS",
    "BodyMedia",
    "Compiled",
    "Fixed",
    "Operation",
    "Param",
    "Where",
    "compile_operation",
    "resolve",
]

#: The HTTP methods of a path item that are operations.
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
#: How a request body is sent: JSON, or ``application/x-www-form-urlencoded``.
BodyMedia = Literal["json", "form"]
#: Where an argument goes: a path, query or header parameter, a field of the body, or the body.
Where = Literal["path", "query", "header", "body_field", "body"]

_HOP_HEADERS = frozenset(
    ["host", "content-length", "content-type", "transfer-encoding", "connection", "accept-encoding", "te"]
)
_JSON_TYPE = re.compile(r"application/(?:[\w.+-]+\+)?json\s*(?:;.*)?\Z", re.IGNORECASE)
_FORM_TYPE = re.compile(r"application/x-www-form-urlencoded\s*(?:;.*)?\Z", re.IGNORECASE)
_SCALARS = ("str", "int", "float", "bool")


@dataclass(frozen=True)
class Param:
    """One keyword argument of an operation and where it goes in the request.

    Attributes:
        keyword: the argument's keyword in programs.
        name: its name in the document.
        where: where it goes (:data:`Where`).
        multi_segment: a path parameter whose value may span several segments.
    """

    keyword: str
    name: str
    where: Where
    multi_segment: bool = False


@dataclass(frozen=True)
class Operation:
    """One compiled operation: how keyword arguments map to the HTTP request.

    Attributes:
        cap_id: the capability id.
        method: the HTTP method.
        path: the path template.
        params: its keyword arguments.
        wraps_result: the success body is not an object: the output is ``{result: <body>}``.
        empty_result: the success response has no body (the output is ``{}``).
        body_media: how the body is sent (``json`` or ``form``; None without a body).
    """

    cap_id: str
    method: str
    path: str
    params: tuple[Param, ...]
    wraps_result: bool
    empty_result: bool
    body_media: BodyMedia | None = None


@dataclass(frozen=True)
class Fixed:
    """What the configuration sets, so a program never can: header names (lower case), query
    parameter names, and the path parameters allowed to span several segments.

    Attributes:
        headers: header names (lower case).
        query: query parameter names.
        multi_segment: path parameters allowed to span several segments.
    """

    headers: frozenset[str] = frozenset()
    query: frozenset[str] = frozenset()
    multi_segment: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Compiled:
    """What :func:`compile_operation` makes of an operation.

    Attributes:
        input_shape: the record of its keyword arguments.
        output_shape: the record of its result.
        params: its keyword arguments and where each goes.
        wraps_result: the success body is not an object: the output is ``{result: <body>}``.
        empty_result: the success response has no body (the output is ``{}``).
        body_media: how the body is sent (``json`` or ``form``; None without a body).
    """

    input_shape: dict[str, Any]
    output_shape: dict[str, Any]
    params: list[Param]
    wraps_result: bool
    empty_result: bool
    body_media: BodyMedia | None


def resolve(doc: Mapping[str, Any], node: Any, depth: int = 0) -> Any:
    """Follow a chain of local ``$ref`` (parameters, request bodies, responses).

    Args:
        doc: the document.
        node: a node that may be a ``{"$ref": "#/..."}``.
        depth: references already followed (at most 32 in all).

    Returns:
        The node the chain ends at.

    Raises:
        Unsupported: a reference is not local or does not resolve.
    """
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


def _media(content: Mapping[str, Any], kind: re.Pattern[str]) -> Mapping[str, Any] | None:
    for media, body in content.items():
        if isinstance(media, str) and kind.match(media):
            return body if isinstance(body, Mapping) else {}
    return None


def _body_media(content: Any) -> tuple[BodyMedia, Mapping[str, Any]] | None:
    """The request body's media type this pack sends (JSON first, then form-urlencoded)."""
    if not isinstance(content, Mapping) or not content:
        return None
    json_media = _media(content, _JSON_TYPE)
    if json_media is not None:
        return "json", json_media
    form_media = _media(content, _FORM_TYPE)
    if form_media is not None:
        return "form", form_media
    types = ", ".join(map(str, content))
    if any(str(t).lower().startswith("multipart/") for t in content):
        raise Unsupported("/requestBody", f"multipart request body (file uploads) is not supported ({types})")
    raise Unsupported(
        "/requestBody", f"request body is neither JSON nor application/x-www-form-urlencoded ({types})"
    )


def _check_form(shape: dict[str, Any]) -> None:
    if shape["t"] != "record":
        raise Unsupported("/requestBody", "form-urlencoded body that is not an object")
    for field in shape["fields"]:
        inner = field["shape"]["of"] if field["shape"]["t"] == "opt" else field["shape"]
        if inner["t"] == "list":
            inner = inner["of"]
        if inner["t"] not in _SCALARS:
            raise Unsupported(
                f"/requestBody/properties/{field['name']}",
                "form field that is not a scalar or a list of them",
            )


def _output(
    doc: Mapping[str, Any], responses: Any, dialect: Dialect, omissions: list[Unsupported]
) -> tuple[dict[str, Any], bool, bool]:
    """(output record, wraps_result, empty_result): the first 2xx response, else ``default``,
    else ``{}`` (an operation that declares only errors); only redirects are refused."""
    if not isinstance(responses, Mapping):
        raise Unsupported("/responses", "no responses")
    keys = {str(c).upper(): c for c in responses}  # YAML may give integer codes
    codes = sorted(k for k in keys if re.fullmatch(r"2\d\d", k)) + [k for k in keys if k == "2XX"]
    if not codes and "DEFAULT" in keys:
        codes = ["DEFAULT"]
    if not codes:
        if keys and all(re.fullmatch(r"3(?:\d\d|XX)", k) for k in keys):
            raise Unsupported("/responses", "answers only with redirects, which calls do not follow")
        return {"t": "record", "fields": []}, False, True
    code = str(keys[codes[0]])
    response = resolve(doc, responses[keys[codes[0]]])
    content = response.get("content") if isinstance(response, Mapping) else None
    if not content:
        return {"t": "record", "fields": []}, False, True
    media = _media(content, _JSON_TYPE) if isinstance(content, Mapping) else None
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


def _optional(shape: dict[str, Any]) -> dict[str, Any]:
    return shape if shape["t"] == "opt" else {"t": "opt", "of": shape}


def compile_operation(
    doc: Mapping[str, Any],
    method: str,
    op: Mapping[str, Any],
    path_params: Sequence[Any],
    dialect: Dialect,
    omissions: list[Unsupported] | None = None,
    fixed: Fixed = Fixed(),
) -> Compiled:
    """The operation compiled. Header and query parameters that ``fixed`` names, and hop-by-hop
    headers, are never inputs: a program cannot override them.

    Args:
        doc: the document (for ``$ref``).
        method: the HTTP method.
        op: the operation object.
        path_params: the path item's parameters (the operation's own take precedence).
        dialect: the JSON Schema dialect of the document's schemas.
        omissions: where output properties left out are reported (None: not reported).
        fixed: what the configuration sets.

    Returns:
        The compiled operation.

    Raises:
        Unsupported: a part of the operation cannot be represented (the error names it).
    """
    merged: dict[tuple[str, str], Mapping[str, Any]] = {}
    for raw in [*path_params, *(op.get("parameters") or [])]:
        p = resolve(doc, raw)
        if (
            not isinstance(p, Mapping)
            or not isinstance(p.get("name"), str)
            or not isinstance(p.get("in"), str)
        ):
            raise Unsupported("/parameters", "malformed parameter")
        merged[(p["in"], p["name"])] = p
    fields: list[tuple[str, dict[str, Any], Where]] = []  # (original name, shape, where)
    defaults: dict[tuple[str, str], Any] = {}  # (where, original name) -> declared default
    for (where, name), p in merged.items():
        pointer = f"/parameters/{where}/{name}"
        if where == "header" and (name.lower() in fixed.headers or name.lower() in _HOP_HEADERS):
            continue
        if where == "query" and name in fixed.query:
            continue
        if where == "cookie":
            if p.get("required"):
                raise Unsupported(pointer, "required cookie parameter")
            continue
        if where not in ("path", "query", "header"):
            raise Unsupported(pointer, f"parameter in {where!r}")
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
            shape = _optional(shape)
        fields.append((name, shape, cast(Where, where)))
        if not required:
            has, value = declared_default(p["schema"], shape)
            if has:
                defaults[(where, name)] = value
    keywords = argument_names([f[0] for f in fields])
    # two parameters with the same name in different places keep distinct keywords
    params = [Param(keywords[n], n, w, w == "path" and n in fixed.multi_segment) for n, _, w in fields]
    record_fields: list[dict[str, Any]] = [
        _with_default({"name": keywords[n], "shape": s}, defaults, (w, n)) for n, s, w in fields
    ]
    body_media: BodyMedia | None = None
    body = resolve(doc, op.get("requestBody")) if op.get("requestBody") is not None else None
    chosen = _body_media(body.get("content")) if isinstance(body, Mapping) else None
    if isinstance(body, Mapping) and chosen is not None:
        body_media, media = chosen
        body_required = body.get("required") is True
        if "schema" not in media:
            raise Unsupported("/requestBody", "request body without a schema")
        shape = compile_schema(
            media["schema"], document=doc, dialect=dialect, direction="input", pointer="/requestBody"
        )
        if body_media == "form":
            _check_form(shape)
        taken: set[str] = {str(f["name"]) for f in record_fields}
        flat = (
            body_required
            and shape["t"] == "record"
            and shape["fields"]
            and not taken & set(argument_names([f["name"] for f in shape["fields"]]).values())
        )
        if flat:
            body_keywords = argument_names([f["name"] for f in shape["fields"]], taken)
            properties = _properties(doc, media["schema"])
            for f in shape["fields"]:
                kw = body_keywords[f["name"]]
                params.append(Param(kw, f["name"], "body_field"))
                has, value = declared_default(properties.get(f["name"]), f["shape"])
                if has:
                    defaults[("body", f["name"])] = value
                record_fields.append(
                    _with_default({"name": kw, "shape": f["shape"]}, defaults, ("body", f["name"]))
                )
        else:
            kw = "body" if "body" not in taken else "body_"
            params.append(Param(kw, "body", "body"))
            record_fields.append({"name": kw, "shape": shape if body_required else _optional(shape)})
    output, wraps, empty = _output(
        doc, op.get("responses"), dialect, omissions if omissions is not None else []
    )
    return Compiled({"t": "record", "fields": record_fields}, output, params, wraps, empty, body_media)


def _with_default(
    field: dict[str, Any], defaults: Mapping[tuple[str, str], Any], key: tuple[str, str]
) -> dict[str, Any]:
    """``field`` with its declared default (codemode_capabilities.openapi._defaults), if any."""
    if key in defaults:
        field["default"] = defaults[key]
    return field


def _properties(doc: Mapping[str, Any], schema: Any) -> Mapping[str, Any]:
    """The ``properties`` of a body schema (through one local ``$ref``), for their defaults."""
    try:
        resolved = resolve(doc, schema)
    except Unsupported:
        return {}
    props = resolved.get("properties") if isinstance(resolved, Mapping) else None
    return props if isinstance(props, Mapping) else {}
