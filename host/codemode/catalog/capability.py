"""Capabilities and their build-time validation (docs/reference/capabilities.md)."""

from __future__ import annotations

import keyword
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from codemode_worker.protocol import RESERVED_ROOTS as SURFACE_ROOTS
from codemode_worker.protocol import STARLARK_KEYWORDS
from codemode_worker.shapes import validate_shape

from .functions import compile_handler
from .types import HandlerTypes, PlainRecord, TypeProblem, signature

__all__ = [
    "MAX_CAPABILITIES",
    "MAX_DESCRIPTION_BYTES",
    "MAX_ID_BYTES",
    "MAX_SEARCH_TERMS",
    "MAX_SEARCH_TERM_BYTES",
    "MAX_SUMMARY_BYTES",
    "RESERVED_ROOTS",
    "Capability",
    "CompiledCapability",
    "Handler",
    "validate_catalog",
]

#: Capabilities one catalog may register.
MAX_CAPABILITIES = 4096
#: Search terms of one capability, and their UTF-8 bytes together.
MAX_SEARCH_TERMS = 16
MAX_SEARCH_TERM_BYTES = 1024
#: UTF-8 bytes of a capability's id, summary and description.
MAX_ID_BYTES = 256
MAX_SUMMARY_BYTES = 1024
MAX_DESCRIPTION_BYTES = 16 * 1024

# The worker's language surface plus other Starlark builtin names (standard and common extensions),
# so a capability can never shadow a builtin even if a later dialect adds it.
RESERVED_ROOTS = SURFACE_ROOTS | frozenset(
    [
        "bytes",
        "set",
        "struct",
        "filter",
        "map",
        "partial",
        "load",
        "debug",
        "call_stack",
        "call_stack_frame",
        "breakpoint",
        "enum",
        "record",
        "field",
        "isinstance",
        "eval",
        "exec",
        "main",
    ]
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

#: A capability's handler: a plain typed function or ``(ctx, subject, args) -> result``, sync or async.
Handler = Callable[..., Any | Awaitable[Any]]


@dataclass
class Capability:
    """One host operation as registered by the application (each field's rules:
    docs/reference/capabilities.md).

    ``name`` is the dotted name programs call (``records.get``); ``summary`` one line for search and
    ``description`` the longer text of ``describe_api``; ``id`` the stable id policies and
    ``disabled`` use (default: the name); ``search_terms`` extra words search matches;
    ``handler`` the function run for each call; ``third_party`` marks texts written by someone other
    than the operator (an upstream).

    Types come from the handler's annotations (a plain typed function such as
    ``lookup(city: str, days: int = 1) -> Forecast``, or ``(ctx, subject, args: In) -> Out`` with
    dataclasses: ``codemode.catalog.functions``) unless ``input_shape`` and ``output_shape`` are both
    given: then they are record shapes (see
    ``codemode_worker.shapes``, e.g. compiled from JSON Schema by ``codemode.packs.jsonschema``), the
    handler is ``(ctx, subject, args: dict[str, Any]) -> Mapping[str, Any]`` receiving the bound
    canonical map, and its result is checked against ``output_shape`` (undeclared keys dropped).
    """

    name: str
    summary: str
    handler: Handler
    id: str | None = None
    description: str | None = None
    search_terms: Sequence[str] = field(default_factory=list)
    input_shape: Mapping[str, Any] | None = None
    output_shape: Mapping[str, Any] | None = None
    #: True when the summary, description and search terms were written by someone other than the
    #: operator (an upstream MCP server, an OpenAPI document): search ranks it after host
    #: capabilities on equal scores and counts its search terms as summary text.
    third_party: bool = False


@dataclass(frozen=True)
class CompiledCapability:
    """A validated capability with its compiled types.

    Attributes:
        id: the stable id (the given one, else the name).
        name: the dotted name programs call.
        summary: the one-line summary.
        description: the longer text (the summary when none was given).
        search_terms: the extra words search matches.
        handler: the function run for each call (a shape-declared one wrapped so its mapping
            result is checked as a plain record).
        input_shape: the record shape of the arguments.
        output_shape: the record shape of the result.
        input_type: the argument type (``dict`` for declared shapes).
        output_type: the result type (``dict`` for declared shapes).
        signature: the Starlark call signature ``describe_api`` and ``search_api`` show.
        third_party: whether the texts were written by someone other than the operator.
    """

    id: str
    name: str
    summary: str
    description: str
    search_terms: tuple[str, ...]
    handler: Handler
    input_shape: dict[str, Any]
    output_shape: dict[str, Any]
    input_type: Any
    output_type: Any
    signature: str
    third_party: bool = False


def _name_problems(name: object) -> list[str]:
    if not isinstance(name, str):
        return ["name must be a string"]
    segments = name.split(".")
    if len(segments) < 2:
        return ["name must have at least two dotted segments (namespace.operation)"]
    for seg in segments:
        if not _IDENT.match(seg):
            return [f"name segment {seg!r} is not a Starlark identifier"]
        if seg in STARLARK_KEYWORDS or keyword.iskeyword(seg):
            return [f"name segment {seg!r} is a reserved word"]
    if segments[0] in RESERVED_ROOTS:
        return [f"name root {segments[0]!r} is reserved"]
    return []


def _text_problems(label: str, value: object, limit: int, *, required: bool) -> list[str]:
    if value is None and not required:
        return []
    if not isinstance(value, str):
        return [f"{label} must be a string"]
    if not value.strip():
        return [f"{label} must not be blank"]
    if value != value.strip():
        return [f"{label} must not have leading or trailing whitespace"]
    if len(value.encode("utf-8")) > limit:
        return [f"{label} exceeds {limit} bytes"]
    if label == "summary" and any(not (ch.isprintable()) for ch in value):
        return ["summary must be one line of printable text"]
    if any(not (ch.isprintable() or ch in "\n\t") for ch in value):
        return [f"{label} must not contain control characters"]
    return []


def _terms_problems(terms: object) -> list[str]:
    if isinstance(terms, str) or not isinstance(terms, Sequence):
        return ["search_terms must be a list of strings"]
    out = []
    if len(terms) > MAX_SEARCH_TERMS:
        out.append(f"at most {MAX_SEARCH_TERMS} search terms")
    total = 0
    for t in terms:
        if not isinstance(t, str) or not t.strip():
            out.append("search terms must be non-blank strings")
            break
        total += len(t.encode("utf-8"))
    if total > MAX_SEARCH_TERM_BYTES:
        out.append(f"search terms exceed {MAX_SEARCH_TERM_BYTES} bytes together")
    return out


def _declared_shapes(cap: Capability) -> tuple[HandlerTypes | None, list[str]]:
    """Shapes given directly: both must be well-formed record shapes (JSON-copied, so later
    changes to the caller's objects cannot reach the compiled capability)."""
    import json

    out: list[dict[str, Any]] = []
    problems: list[str] = []
    for label, shape in (("input_shape", cap.input_shape), ("output_shape", cap.output_shape)):
        if shape is None:
            problems.append(f"{label}: required when the other shape is given")
            continue
        try:
            copied = json.loads(json.dumps(shape))
            validate_shape(copied)
        except (TypeError, ValueError) as exc:
            problems.append(f"{label}: {exc}")
            continue
        if copied["t"] != "record":
            problems.append(f"{label}: must be a record shape")
            continue
        out.append(copied)
    if problems:
        return None, problems
    return (out[0], out[1], dict, dict), []


def _plain_result_handler(handler: Handler) -> Handler:
    """Wrap a shape-declared handler so its mapping result is checked as a plain record."""
    import functools
    import inspect

    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004
    ):

        @functools.wraps(handler)
        async def run_async(*args: Any) -> Any:
            return _as_plain(await handler(*args))

        return run_async

    @functools.wraps(handler)
    def run_sync(*args: Any) -> Any:
        return _as_plain(handler(*args))

    return run_sync


def _as_plain(result: Any) -> Any:
    return PlainRecord(result) if isinstance(result, Mapping) else result


def _compile_one(cap: Capability) -> tuple[CompiledCapability | None, list[str]]:
    problems = _name_problems(cap.name)
    cap_id = cap.id if cap.id is not None else cap.name
    if not isinstance(cap_id, str) or not cap_id or not cap_id.isprintable() or " " in cap_id:
        problems.append("id must be a non-empty printable string without spaces")
    elif len(cap_id.encode("utf-8")) > MAX_ID_BYTES:
        problems.append(f"id exceeds {MAX_ID_BYTES} bytes")
    problems += _text_problems("summary", cap.summary, MAX_SUMMARY_BYTES, required=True)
    problems += _text_problems("description", cap.description, MAX_DESCRIPTION_BYTES, required=False)
    problems += _terms_problems(cap.search_terms)
    if not isinstance(cap.third_party, bool):
        problems.append("third_party must be a bool")
    shapes = None
    handler: Handler = cap.handler
    if not callable(cap.handler):
        problems.append("handler must be callable")
    elif cap.input_shape is not None or cap.output_shape is not None:
        shapes, shape_problems = _declared_shapes(cap)
        problems += shape_problems
        handler = _plain_result_handler(cap.handler)
    else:
        try:
            shapes, handler = compile_handler(cap.handler)
        except TypeProblem as exc:
            problems.append(f"handler types: {exc}")
    if problems or shapes is None:
        return None, problems
    in_shape, out_shape, in_tp, out_tp = shapes
    return (
        CompiledCapability(
            id=cap_id,
            name=cap.name,
            summary=cap.summary,
            description=cap.description if cap.description is not None else cap.summary,
            search_terms=tuple(cap.search_terms),
            handler=handler,
            input_shape=in_shape,
            output_shape=out_shape,
            input_type=in_tp,
            output_type=out_tp,
            signature=signature(cap.name, in_shape),
            third_party=cap.third_party is True,
        ),
        [],
    )


def validate_catalog(
    caps: Sequence[Capability], disabled: Sequence[str]
) -> tuple[list[CompiledCapability], list[str]]:
    """Compile every capability and collect every problem; returns the *enabled* capabilities.

    Args:
        caps: the registered capabilities.
        disabled: ids of capabilities to leave out of the catalog.

    Returns:
        The enabled compiled capabilities and every problem found (empty when the catalog is valid).
    """
    problems: list[str] = []
    if len(caps) > MAX_CAPABILITIES:
        problems.append(f"at most {MAX_CAPABILITIES} capabilities may be registered (got {len(caps)})")
    compiled: list[CompiledCapability] = []
    for i, cap in enumerate(caps):
        if not isinstance(cap, Capability):
            problems.append(f"registration #{i + 1}: not a Capability")
            continue
        one, cap_problems = _compile_one(cap)
        label = cap.name if isinstance(cap.name, str) else f"#{i + 1}"
        problems += [f"capability {label!r}: {p}" for p in cap_problems]
        if one is not None:
            compiled.append(one)
    seen_ids: dict[str, str] = {}
    seen_names: set[str] = set()
    for c in compiled:
        if c.id in seen_ids:
            problems.append(f"capability {c.name!r}: duplicate id {c.id!r} (also {seen_ids[c.id]!r})")
        seen_ids.setdefault(c.id, c.name)
        if c.name in seen_names:
            problems.append(f"capability {c.name!r}: duplicate name")
        seen_names.add(c.name)
    names = sorted(seen_names)
    for c in compiled:
        prefix = c.name + "."
        for other in names:
            if other.startswith(prefix):
                problems.append(f"capability {c.name!r}: name is also the namespace of {other!r}")
                break
    disabled_set = set()
    for d in disabled:
        if d not in seen_ids:
            problems.append(f"disabled id {d!r} is not a registered capability")
        disabled_set.add(d)
    enabled = [c for c in compiled if c.id not in disabled_set]
    return enabled, problems
