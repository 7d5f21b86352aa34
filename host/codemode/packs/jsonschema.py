"""JSON Schema → capability shapes (draft 2020-12 and the OpenAPI 3.0 / 3.1 schema dialects).

:func:`compile_schema` turns one schema into a shape (``codemode_worker.shapes``) or raises
:class:`Unsupported` naming the JSON pointer and the reason. It never loosens a type: whatever the
model cannot represent exactly is refused, and the caller reports it (see ``docs/packs.md``).

=====================================================  ===========================================
JSON Schema                                            shape
=====================================================  ===========================================
``type: string`` / ``integer`` / ``number`` /          ``str`` / ``int`` / ``float`` / ``bool``
``boolean``
``enum`` of strings (or string ``const``)              ``str`` restricted to those values
``type: array`` + ``items: S``                         ``list[S]``
``type: object`` + ``properties`` / ``required``       record; non-required fields are optional
``type: object`` + ``additionalProperties: S`` only    ``dict[str, S]``
``type: [T, "null"]``, ``anyOf``/``oneOf`` ``[S,       ``S | None``
null]``, OpenAPI 3.0 ``nullable: true``
``allOf`` of object schemas                            one record with the merged properties (a
                                                       property several members describe: their
                                                       ``allOf``)
``allOf`` of one scalar type / of arrays               that type (enums: common values) / a list
``anyOf``/``oneOf`` whose alternatives are one type    that type (string enums: all their values;
                                                       with a plain string: ``str``)
results only: ``anyOf``/``oneOf`` of records           one record of every alternative's properties
(or lists/dicts of them)                               (required where all require one type)
string enum over the catalog's limits                  ``str`` (a value constraint, upstream's)
local ``$ref`` (``#/$defs/X``, ``#/components/...``)   the referenced schema (non-recursive)
=====================================================  ===========================================

Refused (with a reason): recursive ``$ref``, remote ``$ref``, unions of different types (in inputs
also of different records: a call could mix their fields), untyped values (``{}``, ``true``, an
object with neither properties nor a typed ``additionalProperties`` below the root), non-string
enums, binary strings (``format: binary``), tuples (``prefixItems``), ``not`` / ``if`` /
``patternProperties`` and a record that also types its extra keys. Value constraints
(``minimum``, ``maxLength``, ``pattern``, ``format``...) are not types in this model: they are
left to the upstream, which still validates them.

With ``direction="input"`` properties marked ``readOnly`` are left out; with ``"output"``,
``writeOnly`` ones are, and (when the caller asks, see :func:`compile_schema`) so are properties
that cannot be represented: a result can always be cut to fewer fields without lying about them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from codemode_worker.shapes import (
    MAX_ENUM_VALUE_BYTES,
    MAX_ENUM_VALUES,
    MAX_SHAPE_DEPTH,
    ShapeError,
    validate_shape,
)

__all__ = [
    "MAX_SCHEMA_NODES",
    "Dialect",
    "Direction",
    "Shape",
    "Unsupported",
    "compile_schema",
    "record_of",
]

Dialect = Literal["2020-12", "openapi-3.0", "openapi-3.1"]
Direction = Literal["input", "output"]
Shape = dict[str, Any]

_REFUSED_KEYWORDS = ("not", "if", "then", "else", "patternProperties", "dependentSchemas", "prefixItems")
_STRING_TYPES = ("string", ["string"], ["string", "null"], ["null", "string"])
_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}


class Unsupported(Exception):
    """A schema (or part of one) the type model cannot represent exactly."""

    def __init__(self, pointer: str, reason: str) -> None:
        """What cannot be represented, and where.

        Args:
            pointer: the JSON Pointer of the part (``""``: the whole schema).
            reason: why.
        """
        super().__init__(f"{pointer or '/'}: {reason}")
        self.pointer = pointer
        self.reason = reason


#: Schema nodes one type may expand to (every ``$ref`` use counted): far above real tools (GitHub's
#: largest operation needs a few thousand) and far below what would stall the host's start.
MAX_SCHEMA_NODES = 20_000


@dataclass
class _Compiler:
    document: Any
    dialect: Dialect
    direction: Direction
    omissions: list[Unsupported] | None = None
    refs: list[str] = field(default_factory=list)
    #: Schema nodes compiled so far, $ref expansions included: shared references (a diamond of
    #: $defs) expand once per use, so a small document could otherwise cost exponential time.
    nodes: int = 0

    def resolve(self, ref: object, pointer: str) -> tuple[Any, str]:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise Unsupported(pointer, f"non-local $ref {ref!r}")
        target: Any = self.document
        path = ref[1:]
        if path and not path.startswith("/"):
            raise Unsupported(pointer, f"$ref {ref!r} is not a JSON pointer")
        for raw in path.split("/")[1:] if path else []:
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(target, Mapping) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise Unsupported(pointer, f"$ref {ref!r} does not resolve")
        return target, path

    def compile(self, schema: Any, pointer: str, depth: int) -> Shape:
        self.nodes += 1
        if self.nodes > MAX_SCHEMA_NODES:
            raise Unsupported(pointer, f"expands to more than {MAX_SCHEMA_NODES} schema nodes")
        if depth > MAX_SHAPE_DEPTH:
            raise Unsupported(pointer, f"nested deeper than {MAX_SHAPE_DEPTH}")
        if schema is True or (isinstance(schema, Mapping) and not _meaningful(schema)):
            raise Unsupported(pointer, "untyped value (any JSON)")
        if not isinstance(schema, Mapping):
            raise Unsupported(pointer, "schema is not an object")
        if "$ref" in schema:
            ref = schema["$ref"]
            if ref in self.refs:
                raise Unsupported(pointer, f"recursive $ref {ref!r}")
            target, _ = self.resolve(ref, pointer)
            self.refs.append(ref)
            try:
                shape = self.compile(target, f"{pointer}/$ref", depth)
            finally:
                self.refs.pop()
            # OpenAPI 3.1 / 2020-12 allow siblings of $ref; only nullability can change the type.
            if self._nullable_sibling(schema):
                return _optional(shape)
            return shape
        for keyword in _REFUSED_KEYWORDS:
            if keyword in schema:
                raise Unsupported(pointer, f"'{keyword}' is not representable")
        nullable = self._nullable_sibling(schema)
        shape = self._compile_inner(schema, pointer, depth)
        return _optional(shape) if nullable else shape

    def _nullable_sibling(self, schema: Mapping[str, Any]) -> bool:
        return self.dialect != "2020-12" and schema.get("nullable") is True

    def _compile_inner(self, schema: Mapping[str, Any], pointer: str, depth: int) -> Shape:
        for combinator in ("anyOf", "oneOf"):
            if combinator in schema:
                return self._union(schema, combinator, pointer, depth)
        if "allOf" in schema:
            return self._all_of(schema, pointer, depth)
        if "enum" in schema or "const" in schema:
            return self._enum(schema, pointer)
        raw_type = schema.get("type")
        types: list[str]
        if raw_type is None:
            if "properties" in schema or "additionalProperties" in schema or "required" in schema:
                types = ["object"]
            elif "items" in schema:
                types = ["array"]
            else:
                raise Unsupported(pointer, "untyped value (no 'type')")
        elif isinstance(raw_type, str):
            types = [raw_type]
        elif isinstance(raw_type, list) and all(isinstance(t, str) for t in raw_type):
            types = list(dict.fromkeys(raw_type))
        else:
            raise Unsupported(pointer, "'type' is neither a string nor a list of strings")
        nullable = "null" in types
        rest = [t for t in types if t != "null"]
        if len(rest) != 1:
            if not rest:
                raise Unsupported(pointer, "only null is allowed (no value to pass)")
            raise Unsupported(pointer, f"union of types {rest} is not representable")
        shape = self._typed(rest[0], schema, pointer, depth)
        return _optional(shape) if nullable else shape

    def _typed(self, kind: str, schema: Mapping[str, Any], pointer: str, depth: int) -> Shape:
        if kind in _TYPES:
            if kind == "string" and schema.get("format") == "binary":
                raise Unsupported(pointer, "binary string (format: binary)")
            if (
                kind == "string"
                and self.dialect != "openapi-3.0"
                and "contentMediaType" in schema
                and schema.get("contentEncoding") is None
            ):
                raise Unsupported(pointer, "binary string (contentMediaType without encoding)")
            return {"t": _TYPES[kind]}
        if kind == "array":
            items = schema.get("items")
            if items is None:
                raise Unsupported(pointer, "array without 'items' (untyped elements)")
            if isinstance(items, list):
                raise Unsupported(pointer, "tuple array (items list) is not representable")
            return {"t": "list", "of": self.compile(items, f"{pointer}/items", depth + 1)}
        if kind == "object":
            return self._object(schema, pointer, depth)
        raise Unsupported(pointer, f"unknown type {kind!r}")

    def _object(self, schema: Mapping[str, Any], pointer: str, depth: int) -> Shape:
        props = schema.get("properties") or {}
        if not isinstance(props, Mapping):
            raise Unsupported(pointer, "'properties' is not an object")
        extra = schema.get("additionalProperties", True)
        typed_extra = isinstance(extra, Mapping) and _meaningful(extra)
        if not props:
            if typed_extra:
                of = self.compile(extra, f"{pointer}/additionalProperties", depth + 1)
                return {"t": "dict", "of": of}
            if (depth > 0 or self.direction == "output") and extra is not False:
                # A tool without arguments is the empty input record; an untyped result is refused.
                raise Unsupported(pointer, "untyped object (no properties, extra keys of any type)")
            return {"t": "record", "fields": []}
        if typed_extra:
            raise Unsupported(pointer, "record whose extra keys are also typed (additionalProperties)")
        required = schema.get("required") or []
        if not isinstance(required, list):
            raise Unsupported(pointer, "'required' is not a list")
        fields = []
        for name, sub in props.items():
            if not isinstance(name, str) or not name:
                raise Unsupported(pointer, "empty property name")
            if isinstance(sub, Mapping) and self._skipped(sub):
                continue  # readOnly in a request / writeOnly in a response: never sent
            try:
                child = self.compile(sub, f"{pointer}/properties/{_escape(name)}", depth + 1)
            except Unsupported as exc:
                if self.omissions is None or self.direction != "output":
                    raise
                self.omissions.append(exc)  # the output type shows exactly what is returned
                continue
            if name not in required:
                child = _optional(child)
            fields.append({"name": name, "shape": child})
        return {"t": "record", "fields": fields}

    def _skipped(self, sub: Mapping[str, Any]) -> bool:
        target: Any = sub
        if "$ref" in sub and "readOnly" not in sub and "writeOnly" not in sub:
            try:
                target, _ = self.resolve(sub["$ref"], "")
            except Unsupported:
                return False
        if not isinstance(target, Mapping):
            return False
        if self.direction == "input":
            return target.get("readOnly") is True
        return target.get("writeOnly") is True

    def _union(self, schema: Mapping[str, Any], combinator: str, pointer: str, depth: int) -> Shape:
        options = schema[combinator]
        if not isinstance(options, list) or not options:
            raise Unsupported(pointer, f"'{combinator}' is not a non-empty list")
        non_null = [(i, o) for i, o in enumerate(options) if not _is_null(o)]
        if not non_null:
            raise Unsupported(pointer, f"{combinator} of 0 non-null alternatives")
        kept = len(self.omissions) if self.omissions is not None else 0
        shapes = [self.compile(o, f"{pointer}/{combinator}/{i}", depth) for i, o in non_null]
        shape = shapes[0] if len(shapes) == 1 else self._join(shapes)
        if shape is None:
            if self.omissions is not None:
                del self.omissions[kept:]  # the alternatives' own omissions: the union goes whole
            raise Unsupported(pointer, f"{combinator} of {len(non_null)} non-null alternatives")
        if "type" in schema and schema["type"] not in ("null", ["null"]):
            # A sibling 'type' constrains the alternative; accept it only when it agrees.
            sibling = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            want = _shape_type_name(shape)
            if want is not None and want not in sibling:
                raise Unsupported(pointer, f"'type' {sibling} conflicts with the {combinator} alternative")
        return _optional(shape) if len(non_null) != len(options) else shape

    def _join(self, shapes: list[Shape]) -> Shape | None:
        """One shape exactly as wide as the union of ``shapes``, or None. Equal shapes, and strings
        (an enum joined with a plain string is a string), join in both directions; in results also
        records (every field of any alternative, required only where all require it with one type),
        lists and dicts of joinable items."""
        nullable = any(s["t"] == "opt" for s in shapes)
        inner = [s["of"] if s["t"] == "opt" else s for s in shapes]
        joined: Shape | None
        if all(s == inner[0] for s in inner):
            joined = inner[0]
        elif all(s["t"] == "str" for s in inner):
            if any("enum" not in s for s in inner):
                joined = {"t": "str"}
            else:
                joined = _enum_shape(list(dict.fromkeys(v for s in inner for v in s["enum"])))
        elif self.direction != "output" or len({s["t"] for s in inner}) != 1:
            joined = None
        elif inner[0]["t"] in ("list", "dict"):
            of = self._join([s["of"] for s in inner])
            joined = None if of is None else {"t": inner[0]["t"], "of": of}
        elif inner[0]["t"] == "record":
            joined = self._join_records(inner)
        else:
            joined = None
        return None if joined is None else _optional(joined) if nullable else joined

    def _join_records(self, records: list[Shape]) -> Shape | None:
        by_name: dict[str, list[Shape]] = {}
        for record in records:
            for f in record["fields"]:
                by_name.setdefault(f["name"], []).append(f["shape"])
        fields = []
        for name, alternatives in by_name.items():
            shape = self._join(alternatives)
            if shape is None:
                if self.omissions is None:
                    return None
                self.omissions.append(Unsupported("", f"property {name!r} has different types in a union"))
                continue
            required = len(alternatives) == len(records) and all(a["t"] != "opt" for a in alternatives)
            fields.append({"name": name, "shape": shape if required else _optional(shape)})
        return {"t": "record", "fields": fields}

    def _all_of(self, schema: Mapping[str, Any], pointer: str, depth: int) -> Shape:
        parts = schema["allOf"]
        if not isinstance(parts, list) or not parts:
            raise Unsupported(pointer, "'allOf' is not a non-empty list")
        siblings = {k: v for k, v in schema.items() if k in ("properties", "required", "type")}
        if len(parts) == 1 and not siblings.get("properties"):
            return self.compile(parts[0], f"{pointer}/allOf/0", depth)
        member_refs: list[str] = []
        members = self._all_of_members([*parts, siblings], pointer, member_refs)
        kinds = {kind for kind, _, _ in members} - {"neutral"}
        if not kinds:
            raise Unsupported(pointer, "untyped value (allOf of annotations only)")
        odd = [w for kind, w, _ in members if kind in ("union", "other")]
        if odd:
            raise Unsupported(odd[0], "allOf member is a union, or a type the model cannot represent")
        if len(kinds) > 1:
            raise Unsupported(pointer, f"allOf members of different types ({', '.join(sorted(kinds))})")
        kind = kinds.pop()
        typed = [(w, m) for k, w, m in members if k == kind]
        self.refs.extend(member_refs)  # a property referring back to a member is recursion
        try:
            if kind == "object":
                return self._object(self._merge_objects(typed), pointer, depth)
            if kind == "array":
                items = [m["items"] for _, m in typed if "items" in m]
                merged = {
                    "type": "array",
                    **({"items": items[0] if len(items) == 1 else {"allOf": items}} if items else {}),
                }
                return self._typed("array", merged, pointer, depth)
            return self._intersect_scalars([self.compile(m, w, depth) for w, m in typed], pointer)
        finally:
            del self.refs[len(self.refs) - len(member_refs) :]

    def _all_of_members(
        self, parts: list[Any], pointer: str, member_refs: list[str]
    ) -> list[tuple[str, str, Mapping[str, Any]]]:
        """``(kind, pointer, member)`` for each member, ``$ref`` resolved, nested allOf flattened."""
        out: list[tuple[str, str, Mapping[str, Any]]] = []
        for i, part in enumerate(parts):
            where = f"{pointer}/allOf/{i}"
            while isinstance(part, Mapping) and "$ref" in part:
                ref = part["$ref"]
                if ref in self.refs or ref in member_refs:
                    raise Unsupported(where, f"recursive $ref {ref!r}")
                member_refs.append(ref)
                part, _ = self.resolve(ref, where)
            if not isinstance(part, Mapping):
                raise Unsupported(where, "schema is not an object")
            if not part:
                continue
            if isinstance(part.get("allOf"), list) and not any(k in part for k in ("anyOf", "oneOf")):
                rest = {k: v for k, v in part.items() if k != "allOf"}
                out += self._all_of_members([*part["allOf"], rest], where, member_refs)
                continue
            if isinstance(part.get("additionalProperties"), Mapping) and _meaningful(
                part["additionalProperties"]
            ):
                raise Unsupported(where, "allOf member types its extra keys")
            out.append((_member_kind(part), where, part))
        return out

    def _merge_objects(self, members: list[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
        """One object schema: the members' properties (a property several members describe must
        satisfy all of them: it becomes their allOf) and the union of their ``required``."""
        props: dict[str, Any] = {}
        required: list[str] = []
        for _, member in members:
            for name, sub in (member.get("properties") or {}).items():
                if name not in props or props[name] == sub:
                    props[name] = sub
                    continue
                both = [props[name], sub]
                flags = {k: True for k in ("readOnly", "writeOnly") if any(self._flag(x, k) for x in both)}
                props[name] = {"allOf": both, **flags}
            required += [r for r in member.get("required") or [] if r not in required]
        return {"type": "object", "properties": props, "required": required}

    def _flag(self, sub: Any, key: str) -> bool:
        if isinstance(sub, Mapping) and "$ref" in sub and key not in sub:
            try:
                sub, _ = self.resolve(sub["$ref"], "")
            except Unsupported:
                return False
        return isinstance(sub, Mapping) and sub.get(key) is True

    @staticmethod
    def _intersect_scalars(shapes: list[Shape], pointer: str) -> Shape:
        inner = [s["of"] if s["t"] == "opt" else s for s in shapes]
        if len({s["t"] for s in inner}) != 1:
            raise Unsupported(pointer, "allOf members of different types")
        enums = [s["enum"] for s in inner if "enum" in s]
        if not enums:
            shape: Shape = {"t": inner[0]["t"]}
        else:
            values = [v for v in enums[0] if all(v in e for e in enums[1:])]
            if not values:
                raise Unsupported(pointer, "allOf of enums without a common value")
            shape = {"t": "str", "enum": values}
        return _optional(shape) if all(s["t"] == "opt" for s in shapes) else shape

    def _enum(self, schema: Mapping[str, Any], pointer: str) -> Shape:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        if not isinstance(values, list) or not values:
            raise Unsupported(pointer, "'enum' is not a non-empty list")
        declared = schema.get("type")
        nullable = None in values or (isinstance(declared, list) and "null" in declared)
        strings = [v for v in values if v is not None]
        if not strings:
            raise Unsupported(pointer, "enum of only null")
        if not all(isinstance(v, str) for v in strings):
            raise Unsupported(pointer, "non-string enum (the model restricts only strings)")
        if declared is not None and declared not in _STRING_TYPES:
            raise Unsupported(pointer, f"string enum with 'type' {declared!r}")
        shape = _enum_shape(list(dict.fromkeys(strings)))
        return _optional(shape) if nullable else shape


def _enum_shape(values: list[str]) -> Shape:
    """A string enum; one too long for the catalog to list (more than MAX_ENUM_VALUES values, or a
    value over MAX_ENUM_VALUE_BYTES) is a plain string: like other value constraints, the upstream
    checks it."""
    if len(values) > MAX_ENUM_VALUES or any(
        len(v.encode("utf-8", "surrogatepass")) > MAX_ENUM_VALUE_BYTES for v in values
    ):
        return {"t": "str"}
    return {"t": "str", "enum": values}


def _member_kind(member: Mapping[str, Any]) -> str:
    """What one allOf member constrains: object, array, string..., union, other, or neutral
    (annotations and value constraints only)."""
    raw = member.get("type")
    types = [raw] if isinstance(raw, str) else list(raw) if isinstance(raw, list) else []
    types = [t for t in types if t != "null"]
    if len(types) > 1 or any(k in member for k in _REFUSED_KEYWORDS):
        return "other"
    if any(k in member for k in ("anyOf", "oneOf")):
        return "union"
    if types:
        return types[0] if types[0] in ("object", "array", *_TYPES) else "other"
    if any(k in member for k in ("properties", "required", "additionalProperties")):
        return "object"
    if "items" in member:
        return "array"
    if "enum" in member or "const" in member:
        return "string"
    return "neutral"


def _meaningful(schema: Mapping[str, Any]) -> bool:
    """Whether a schema object says anything about the type (``{}`` or annotations only do not)."""
    typing_keys = {
        "type", "properties", "additionalProperties", "items", "enum", "const", "anyOf", "oneOf",
        "allOf", "$ref", "not", "if", "patternProperties", "prefixItems", "required",
    }  # fmt: skip
    return any(k in schema for k in typing_keys)


def _is_null(option: object) -> bool:
    if not isinstance(option, Mapping):
        return False
    return option.get("type") == "null" or option.get("type") == ["null"] or option.get("const", 0) is None


def _shape_type_name(shape: Shape) -> str | None:
    inner = shape["of"] if shape["t"] == "opt" else shape
    return {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "list": "array"}.get(
        inner["t"], "object" if inner["t"] in ("record", "dict") else None
    )


def _optional(shape: Shape) -> Shape:
    return shape if shape["t"] == "opt" else {"t": "opt", "of": shape}


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def compile_schema(
    schema: Any,
    *,
    document: Any = None,
    dialect: Dialect = "2020-12",
    direction: Direction = "input",
    pointer: str = "",
    omissions: list[Unsupported] | None = None,
) -> Shape:
    """Compile a JSON Schema to a shape. With ``direction="output"`` and an ``omissions`` list, an
    object property that cannot be represented is left out of the record instead (the handler's
    result is cut to the declared fields, so the type stays exact) and its reason is appended there.

    Args:
        schema: the JSON Schema (a mapping, or a boolean schema).
        document: what ``$ref`` resolves against (default: ``schema``).
        dialect: ``2020-12``, ``openapi-3.0`` or ``openapi-3.1``.
        direction: ``input`` (arguments) or ``output`` (results).
        pointer: the schema's JSON Pointer in ``document``, for messages.
        omissions: with ``direction="output"``, receives the reasons of the properties left out.

    Returns:
        The shape (``codemode_worker.shapes``).

    Raises:
        Unsupported: anything the type model cannot represent exactly.
    """
    compiler = _Compiler(document if document is not None else schema, dialect, direction, omissions)
    shape = compiler.compile(schema, pointer, 0)
    try:
        validate_shape(shape)
    except ShapeError as exc:
        raise Unsupported(pointer, str(exc)) from None
    return shape


def record_of(
    schema: Any,
    *,
    document: Any = None,
    dialect: Dialect = "2020-12",
    direction: Direction = "input",
    pointer: str = "",
    omissions: list[Unsupported] | None = None,
) -> Shape:
    """Like :func:`compile_schema` but the result must be a record (a tool's arguments or result).

    Args:
        schema, document, dialect, direction, pointer, omissions: as for :func:`compile_schema`.

    Returns:
        The record shape; an absent schema, ``{}`` or ``{"type": "object"}`` is the empty record.

    Raises:
        Unsupported: not an object schema, or anything :func:`compile_schema` refuses.
    """
    if schema is None or schema == {} or schema is True:
        return {"t": "record", "fields": []}
    shape = compile_schema(
        schema, document=document, dialect=dialect, direction=direction, pointer=pointer, omissions=omissions
    )
    if shape["t"] != "record":
        raise Unsupported(pointer, f"expected an object schema with properties, got {shape['t']}")
    return shape
