"""A dataclass field's default is honoured: the field may be omitted, describe shows the default,
the handler gets it when the call omits the field (or passes None), and the wire shape the worker
gets is the one the protocol always had."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import pytest

import codemode
from codemode import authz
from codemode.catalog.types import compile_type, construct, without_defaults
from codemode_worker.shapes import ShapeError, bind_arguments, validate_shape


@dataclass
class In:
    city: str
    days: int = 1
    units: str = "metric"
    tags: list[str] = field(default_factory=lambda: ["daily"])
    limit: int | None = None


@dataclass
class Out:
    text: str


def forecast(ctx: codemode.CallContext, subject: authz.Subject, args: In) -> Out:
    return Out(f"{args.city}|{args.days}|{args.units}|{args.tags}|{args.limit}")


def server() -> codemode.Server:
    cap = codemode.Capability(id="weather.forecast", name="weather.forecast", summary="F.", handler=forecast)
    return codemode.Builder(authorizer=authz.allow_all()).register(cap).build()


def test_describe_shows_the_defaults_and_the_fields_are_optional() -> None:
    d = server().describe("weather.forecast").to_dict()
    assert d["signature"] == (
        'weather.forecast(*, city: str, days: int = 1, units: str = "metric", tags: list[str] = ["daily"], '
        "limit: int | None)"
    )
    assert d["input"][1] == {"name": "days", "type": "int", "required": False, "default": 1}
    assert d["input"][3] == {"name": "tags", "type": "list[str]", "required": False, "default": ["daily"]}
    assert d["input"][4] == {"name": "limit", "type": "int | None", "required": False}
    assert d["input"][0] == {"name": "city", "type": "str", "required": True}


def test_an_omitted_field_gets_its_default_and_a_given_one_its_value() -> None:
    shape = compile_type(In, inputs=True)
    assert construct(In, bind_arguments(shape, {"city": "Oslo"})) == In("Oslo")
    given = construct(In, bind_arguments(shape, {"city": "Oslo", "days": 3, "tags": [], "limit": 2}))
    assert given == In("Oslo", 3, "metric", [], 2)
    # None means "use the default" (an optional field given None is absent after binding).
    assert construct(In, bind_arguments(shape, {"city": "Oslo", "days": None})) == In("Oslo")
    # default_factory gives each call its own value.
    a, b = (construct(In, bind_arguments(shape, {"city": "x"})) for _ in range(2))
    assert a.tags == b.tags and a.tags is not b.tags


async def test_through_a_real_worker() -> None:
    async with server() as srv:
        value = await srv.execute(
            "def main():\n    return weather.forecast(city='Oslo')\n", subject=authz.Subject("a")
        )
        assert value == {"text": "Oslo|1|metric|['daily']|None"}
        value = await srv.execute(
            "def main():\n    return weather.forecast(city='Oslo', days=5)\n", subject=authz.Subject("a")
        )
        assert value == {"text": "Oslo|5|metric|['daily']|None"}
        with pytest.raises(codemode.InvalidArguments):
            await srv.execute(
                "def main():\n    return weather.forecast(days=5)\n", subject=authz.Subject("a")
            )


def test_the_worker_gets_the_wire_shape_without_defaults() -> None:
    shape = compile_type(In, inputs=True)
    wire = without_defaults(shape)
    assert "default" not in json.dumps(wire)
    assert [f["shape"]["t"] for f in wire["fields"]] == ["str", "opt", "opt", "opt", "opt"]
    validate_shape(wire)
    validate_shape(shape)  # the host's shape with defaults is valid too


def test_a_default_that_is_no_value_of_its_type_is_refused_at_registration() -> None:
    @dataclass
    class Bad:
        ratio: float = float("nan")

    with pytest.raises(
        codemode.catalog.types.TypeProblem, match=r"Bad.ratio: the default nan is not a value"
    ):
        compile_type(Bad, inputs=True)


@pytest.mark.parametrize(
    ("field_", "problem"),
    [
        ({"name": "a", "shape": {"t": "int"}, "default": 1}, "needs an opt shape"),
        ({"name": "a", "shape": {"t": "opt", "of": {"t": "int"}}, "default": None}, "other than None"),
        ({"name": "a", "shape": {"t": "opt", "of": {"t": "int"}}, "default": "x"}, "does not fit"),
        ({"name": "a", "shape": {"t": "opt", "of": {"t": "str"}}, "default": "x" * 300}, "longer than 256"),
        ({"name": "a", "shape": {"t": "int"}, "other": 1}, "exactly 'name' and 'shape'"),
    ],
)
def test_validate_shape_checks_defaults(field_: dict[str, object], problem: str) -> None:
    with pytest.raises(ShapeError, match=problem):
        validate_shape({"t": "record", "fields": [field_]})


@dataclass
class Window:
    start: int
    size: int = 10


@dataclass
class Query:
    window: Window


def test_nested_records_honour_defaults_too() -> None:
    shape = compile_type(Query, inputs=True)
    assert construct(Query, bind_arguments(shape, {"window": {"start": 1}})) == Query(Window(1, 10))
    assert dataclasses.fields(Window)[1].default == 10
