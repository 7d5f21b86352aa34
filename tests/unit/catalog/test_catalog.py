"""Registration validation, the type model and describe notation (docs/reference/capabilities.md,
describe.md)."""

from __future__ import annotations

import dataclasses
import sys
import threading
from dataclasses import dataclass
from typing import Any, Optional

import pytest

import codemode
from codemode import authz
from codemode.catalog.capability import validate_catalog
from codemode.catalog.types import OutputError, TypeProblem, compile_type, construct, constructor, to_plain
from codemode.common.errors import AgentError, client_text, sanitize_disclosure


@dataclass
class Window:
    start: int
    end: int | None = None


@dataclass
class Filter:
    owner: str
    window: Window
    labels: dict[str, str] | None = None


@dataclass
class SearchIn:
    filter: Filter
    tags: list[str]
    scores: list[dict[str, float | None]]
    limit: int | None = None


@dataclass
class Hit:
    id: int
    note: str | None = None


@dataclass
class SearchOut:
    hits: list[Hit]
    total: int
    cursor: str | None = None
    meta: Window | None = None


def search_handler(ctx: codemode.CallContext, subject: authz.Subject, args: SearchIn) -> SearchOut:
    return SearchOut(hits=[], total=0)


@dataclass
class StatusOut:
    ok: bool


async def status_handler(ctx: codemode.CallContext, subject: authz.Subject) -> StatusOut:
    return StatusOut(ok=True)


def cap(name: str = "records.search", **kw: Any) -> codemode.Capability:
    kw.setdefault("summary", "Search records.")
    kw.setdefault("handler", search_handler)
    return codemode.Capability(name=name, **kw)


def build(*caps: codemode.Capability, **kw: Any) -> codemode.Server:
    kw.setdefault("authorizer", authz.allow_all())
    return codemode.Builder(**kw).register(*caps).build()


def problems_of(*caps: codemode.Capability, **kw: Any) -> list[str]:
    kw.setdefault("authorizer", authz.allow_all())
    with pytest.raises(codemode.InvalidRegistration) as info:
        codemode.Builder(**kw).register(*caps).build()
    return info.value.problems


# --- describe notation -------------------------------------------------------------------------


def test_signature_and_describe_nested_optional() -> None:
    server = build(cap(), cap("records.status", summary="Status.", handler=status_handler))
    d = server.describe("records.search").to_dict()
    assert d["signature"] == (
        "records.search(*, filter: {owner: str, window: {start: int, end: int | None}, "
        "labels: dict[str, str] | None}, tags: list[str], scores: list[dict[str, float | None]], "
        "limit: int | None)"
    )
    assert d["input"] == [
        {
            "name": "filter",
            "type": "{owner: str, window: {start: int, end: int | None}, labels: dict[str, str] | None}",
            "required": True,
        },
        {"name": "tags", "type": "list[str]", "required": True},
        {"name": "scores", "type": "list[dict[str, float | None]]", "required": True},
        {"name": "limit", "type": "int | None", "required": False},
    ]
    assert d["output"] == [
        {"name": "hits", "type": "list[{id: int, note?: str}]", "required": True},
        {"name": "total", "type": "int", "required": True},
        {"name": "cursor", "type": "str", "required": False},
        {"name": "meta", "type": "{start: int, end?: int}", "required": False},
    ]
    assert d["description"] == d["summary"] == "Search records."
    assert set(d) == {"name", "signature", "summary", "description", "input", "output"}
    status = server.describe("records.status").to_dict()
    assert status["signature"] == "records.status()"
    assert status["input"] == []
    assert status["output"] == [{"name": "ok", "type": "bool", "required": True}]


def test_describe_is_exact_and_hides_disabled_and_ids() -> None:
    server = build(
        cap(id="records.entry.search"),
        cap("records.status", summary="Status.", handler=status_handler, id="status.v1"),
        disabled=["status.v1"],
    )
    for name in ["Records.search", " records.search", "records.search ", "records.status", "records"]:
        with pytest.raises(codemode.NotFound) as info:
            server.describe(name)
        assert str(info.value) == "capability not found"
    text = str(server.describe("records.search").to_dict())
    assert "records.entry.search" not in text
    assert [c.name for c in server.capabilities] == ["records.search"]


def test_non_identifier_nested_keys_are_quoted_by_the_shared_renderer() -> None:
    from codemode_worker.shapes import render

    shape = {"t": "record", "fields": [{"name": "a-b", "shape": {"t": "int"}}]}
    assert render(shape) == '{"a-b": int}'


# --- type model ----------------------------------------------------------------------------------


@dataclass
class Node:
    child: Node | None = None


@pytest.mark.parametrize(
    ("tp", "fragment"),
    [
        (object, "unsupported type"),  # typing.Any is the JSON-any type (test_json_any_shape.py)
        (int | str, "unsupported union"),
        (dict[int, str], "keys must be str"),
        (set[int], "unsupported type"),
        (bytes, "unsupported type"),
        (tuple[int, int], "unsupported type"),
        (Node, "recursive type Node"),
    ],
)
def test_unsupported_types(tp: Any, fragment: str) -> None:
    with pytest.raises(TypeProblem, match=fragment):
        compile_type(tp)


def test_supported_types_and_optional_spellings() -> None:
    assert compile_type(Optional[int]) == {"t": "opt", "of": {"t": "int"}}  # noqa: UP045
    assert compile_type(int | None) == {"t": "opt", "of": {"t": "int"}}
    assert compile_type(list[int]) == {"t": "list", "of": {"t": "int"}}


def test_construct_builds_exact_typed_input_with_floats() -> None:
    canonical = {
        "filter": {"owner": "a", "window": {"start": 1}},
        "tags": ["x"],
        "scores": [{"s": 1.0, "t": None}],
    }
    value = construct(SearchIn, canonical)
    assert value == SearchIn(
        filter=Filter(owner="a", window=Window(start=1, end=None)),
        tags=["x"],
        scores=[{"s": 1.0, "t": None}],
        limit=None,
    )
    assert isinstance(value.scores[0]["s"], float)


@dataclass
class Tree:
    label: str
    weight: float | None = None
    children: list[Tree] | None = None


def test_constructor_is_planned_once_per_type_and_follows_self_reference() -> None:
    assert constructor(SearchIn) is constructor(SearchIn)
    value = constructor(Tree)({"label": "a", "weight": 2, "children": [{"label": "b", "weight": None}]})
    assert value == Tree("a", 2.0, [Tree("b", None, None)])
    assert isinstance(value.weight, float)


def _first_calls_from_threads(outer: Any, value: dict[str, Any], n: int = 8) -> list[object]:
    barrier = threading.Barrier(n)
    results: list[object] = []

    def first_call() -> None:
        barrier.wait()
        try:
            results.append(constructor(outer)(value))
        except Exception as exc:  # a half-built plan raises TypeError here
            results.append(exc)

    threads = [threading.Thread(target=first_call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_a_plan_being_built_is_never_seen_by_another_thread() -> None:
    # Found by review: the plan of a dataclass was published before its fields were planned, so a
    # second thread's first call could build the value without them.
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch inside the planning, as they may under load
    try:
        for trial in range(40):
            inner = dataclasses.make_dataclass(f"Inner{trial}", [("v", float)])
            fields = [(f"f{i}", list[dict[str, inner]]) for i in range(60)]  # type: ignore[valid-type]
            outer = dataclasses.make_dataclass(f"Outer{trial}", fields)
            value = {f"f{i}": [{"a": {"v": 1}}] for i in range(60)}
            results = _first_calls_from_threads(outer, value, n=2)
            expected = outer(*([{"a": inner(1.0)}] for _ in range(60)))
            assert results == [expected] * 2, (trial, results)
    finally:
        sys.setswitchinterval(previous)


def test_to_plain_output_conversion_and_failures() -> None:
    shape = compile_type(SearchOut)
    out = to_plain(shape, SearchOut(hits=[Hit(1), Hit(2, "n")], total=2, meta=Window(1, None)))
    assert out == {"hits": [{"id": 1}, {"id": 2, "note": "n"}], "total": 2, "meta": {"start": 1}}
    with pytest.raises(OutputError):
        to_plain(shape, SearchOut(hits=[], total=2**63))
    with pytest.raises(OutputError):
        to_plain(compile_type(dict[str, float]), {"x": float("nan")})
    with pytest.raises(OutputError):
        to_plain(compile_type(dict[str, float]), {"x": float("inf")})
    with pytest.raises(OutputError):
        to_plain(shape, {"hits": [], "total": 1})
    with pytest.raises(OutputError):
        to_plain(compile_type(int), True)
    assert to_plain(compile_type(float), 3) == 3.0


# --- registration validation ---------------------------------------------------------------------


def test_all_problems_collected_and_named() -> None:
    problems = problems_of(
        cap("single"),
        cap("json.encode2"),
        cap("records.if"),
        cap("records.search"),
        cap("records.search"),
        cap("records.search.more"),
        cap("a.b", summary=" padded "),
        cap("a.c", summary=""),
        cap("a.d", description="  "),
        cap("a.e", search_terms=["t"] * 17),
        cap("a.f", search_terms=["x" * 600, "y" * 600]),
        cap("a.g", id="dup"),
        cap("a.h", id="dup"),
        cap("a.i", summary="two\nlines"),
        disabled=["nope"],
    )
    joined = "\n".join(problems)
    for fragment in [
        "'single': name must have at least two dotted segments",
        "'json.encode2': name root 'json' is reserved",
        "'records.if': name segment 'if' is a reserved word",
        "'records.search': duplicate name",
        "'records.search': name is also the namespace of 'records.search.more'",
        "'a.b': summary must not have leading or trailing whitespace",
        "'a.c': summary must not be blank",
        "'a.d': description must not be blank",
        "'a.e': at most 16 search terms",
        "'a.f': search terms exceed 1024 bytes together",
        "'a.h': duplicate id 'dup'",
        "'a.i': summary must be one line",
        "disabled id 'nope' is not a registered capability",
    ]:
        assert fragment in joined, fragment


@pytest.mark.parametrize("root", ["len", "sum", "math", "json", "print", "attempt", "True", "struct", "set"])
def test_reserved_roots(root: str) -> None:
    assert any("reserved" in p for p in problems_of(cap(f"{root}.x")))


@dataclass
class BadIn:
    x: complex


def test_unsupported_handler_types_name_the_capability() -> None:
    def bad(ctx: Any, subject: Any, args: BadIn) -> StatusOut:
        return StatusOut(True)

    def untyped(ctx, subject, args):  # type: ignore[no-untyped-def]
        return None

    problems = problems_of(cap("a.bad", handler=bad), cap("a.untyped", handler=untyped))
    assert any(p.startswith("capability 'a.bad': handler types:") and "BadIn.x" in p for p in problems)
    assert any(p.startswith("capability 'a.untyped': handler types:") for p in problems)


def test_missing_authorizer_and_negative_limits() -> None:
    problems = problems_of(cap(), authorizer=None, limits=codemode.Limits(max_native_calls=-1))
    assert any(p.startswith("authorizer:") for p in problems)
    assert any("max_native_calls must be at least 1" in p for p in problems)


def test_limits_left_out_take_their_defaults() -> None:
    server = build(cap(), limits=codemode.Limits(max_execution_time=2.0))
    assert server.limits.max_execution_time == 2.0
    assert server.limits.max_native_calls == 100
    assert server.limits.max_value_depth == 32
    assert server.limits.max_value_bytes == 1024 * 1024


def test_capability_count_cap() -> None:
    caps = [cap(f"ns.op{i}") for i in range(4097)]
    _, problems = validate_catalog(caps, [])
    assert any("at most 4096 capabilities" in p for p in problems)
    enabled, problems = validate_catalog(caps[:4096], [])
    assert problems == [] and len(enabled) == 4096


def test_builder_is_one_shot() -> None:
    b = codemode.Builder(authorizer=authz.allow_all()).register(cap())
    b.build()
    with pytest.raises(codemode.InvalidRegistration):
        b.build()
    with pytest.raises(codemode.InvalidRegistration):
        b.register(cap("x.y"))


# --- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "text"),
    [
        (codemode.Unauthenticated, "unauthenticated"),
        (codemode.NotFound, "capability not found"),
        (codemode.InvalidProgram, "invalid program"),
        (codemode.InvalidArguments, "invalid capability arguments"),
        (codemode.PermissionDenied, "permission denied"),
        (codemode.PolicyFailure, "authorization policy failure"),
        (codemode.ResourceLimit, "resource limit exceeded"),
        (codemode.CapabilityFailure, "capability failed"),
        (codemode.Internal, "internal failure"),
    ],
)
def test_error_texts_are_coarse(cls: type[codemode.CodeModeError], text: str) -> None:
    err = cls("secret detail")
    assert str(err) == text
    assert isinstance(err, codemode.CodeModeError)


def test_client_text_suffix_only_for_approved_kinds() -> None:
    assert client_text(codemode.InvalidProgram("<codemode>:1:2: x")) == "invalid program: <codemode>:1:2: x"
    assert client_text(codemode.CapabilityFailure("boom")) == "capability failed: boom"
    assert client_text(codemode.PolicyFailure("rule allow")) == "authorization policy failure"
    assert client_text(codemode.ResourceLimit("max 100")) == "resource limit exceeded"
    assert client_text(codemode.ResourceLimit("memory")) == "resource limit exceeded: memory"
    assert client_text(codemode.ResourceLimit()) == "resource limit exceeded"


def test_timeout_is_resource_limit_and_timeout_error() -> None:
    from codemode.common.errors import ExecutionTimeout

    err = ExecutionTimeout()
    assert isinstance(err, codemode.ResourceLimit) and isinstance(err, TimeoutError)
    assert str(err) == "resource limit exceeded"
    assert client_text(err) == "resource limit exceeded: time"


def test_sanitize_disclosure() -> None:
    assert sanitize_disclosure("a\nb\x00c") == "a b c"
    long = "é" * 300
    out = sanitize_disclosure(long)
    assert out.endswith("...") and len(out.encode()) <= 256
    assert sanitize_disclosure("x" * 256) == "x" * 256
    assert len(sanitize_disclosure("x" * 257).encode()) == 256
    assert AgentError("m").message == "m"
