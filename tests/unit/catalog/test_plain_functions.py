"""Plain typed functions as capabilities (codemode.catalog.functions): inputs from the
parameters, the result from the return annotation, ctx and subject passed by annotation only; the
``(ctx, subject, args)`` form unchanged; one-line errors naming the function and the parameter."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

import pytest
from pydantic import BaseModel

import codemode
from codemode import authz
from codemode.catalog.capability import validate_catalog


@dataclass
class Forecast:
    city: str
    days: int


class Reading(TypedDict):
    city: str
    celsius: float
    note: NotRequired[str]


class Station(BaseModel):
    name: str
    height: int = 0


def lookup(city: str, days: int = 1) -> Forecast:
    """Daily forecast for a city.

    Up to seven days ahead."""
    return Forecast(city, days)


async def whoami(who: codemode.Subject, context: codemode.CallContext, loud: bool = False) -> str:
    """The caller's id."""
    assert context.remaining() > 0
    return who.id.upper() if loud else who.id


def readings(cities: list[str]) -> list[Reading]:
    """Readings of some cities."""
    return [{"city": c, "celsius": 20} for c in cities]


def station() -> Station:
    """The station."""
    return Station(name="Oslo-Blindern")


def forget(key: str) -> None:
    """Forget a key."""


def tags(extra: list[str] = ["a"]) -> list[str]:  # noqa: B006 - the default must not be shared
    """Tags."""
    extra.append("b")
    return extra


pack = codemode.CapabilityPack()
pack.capability("weather.lookup")(lookup)
pack.capability("me.whoami")(whoami)
pack.capability("weather.readings")(readings)
pack.capability("weather.station")(station)
pack.capability("keys.forget")(forget)
pack.capability("keys.tags")(tags)


def serve() -> codemode.Server:
    return codemode.Builder(authorizer=authz.allow_all()).add_pack(pack).build()


def test_the_shapes_come_from_the_signature_and_the_docstring() -> None:
    server = serve()
    doc = server.describe("weather.lookup").to_dict()
    assert doc["signature"] == "weather.lookup(*, city: str, days: int = 1)"
    assert doc["summary"] == "Daily forecast for a city."
    assert doc["input"] == [
        {"name": "city", "type": "str", "required": True},
        {"name": "days", "type": "int", "required": False, "default": 1},
    ]
    assert doc["output"] == [
        {"name": "city", "type": "str", "required": True},
        {"name": "days", "type": "int", "required": True},
    ]
    # ctx and subject are passed by annotation, never inputs
    assert server.describe("me.whoami").to_dict()["signature"] == "me.whoami(*, loud: bool = False)"
    assert server.describe("me.whoami").to_dict()["returns"] == "str"
    assert server.describe("weather.readings").to_dict()["returns"] == (
        "list[{city: str, celsius: float, note?: str}]"
    )
    assert server.describe("weather.station").to_dict()["output"] == [
        {"name": "name", "type": "str", "required": True},
        {"name": "height", "type": "int", "required": False},
    ]
    assert server.describe("keys.forget").to_dict()["output"] == []


async def test_calls_run_through_a_real_worker() -> None:
    source = """
def main():
    return {
        "lookup": weather.lookup(city="Oslo"),
        "three": weather.lookup(city="Oslo", days=3),
        "me": me.whoami(),
        "loud": me.whoami(loud=True),
        "readings": weather.readings(cities=["Oslo"]),
        "station": weather.station(),
        "forget": keys.forget(key="k"),
        "tags": [keys.tags(), keys.tags()],
    }
"""
    async with serve() as server:
        result = await server.execute(source, subject=authz.Subject("alice"))
    assert result == {
        "lookup": {"city": "Oslo", "days": 1},
        "three": {"city": "Oslo", "days": 3},
        "me": "alice",
        "loud": "ALICE",
        "readings": [{"city": "Oslo", "celsius": 20.0}],
        "station": {"name": "Oslo-Blindern", "height": 0},
        "forget": {},
        "tags": [["a", "b"], ["a", "b"]],  # the list default is fresh for every call
    }


@dataclass
class In:
    text: str


@dataclass
class Out:
    text: str


def test_the_handler_form_stays_as_it_was() -> None:
    def echo(ctx: codemode.CallContext, subject: authz.Subject, args: In) -> Out:
        return Out(args.text)

    def loose(ctx, subject, args: In) -> Out:  # type: ignore[no-untyped-def]
        return Out(args.text)

    def status(ctx: Any, subject: Any) -> Out:
        return Out("ok")

    caps = [
        codemode.Capability(name="a.echo", summary="Echo.", handler=echo),
        codemode.Capability(name="a.loose", summary="Echo.", handler=loose),
        codemode.Capability(name="a.status", summary="Status.", handler=status),
    ]
    compiled, problems = validate_catalog(caps, [])
    assert problems == []
    assert [c.handler for c in compiled] == [echo, loose, status]  # called as they are
    assert [c.signature for c in compiled] == ["a.echo(*, text: str)", "a.loose(*, text: str)", "a.status()"]


def test_a_parameter_named_ctx_is_an_input_unless_annotated_as_the_context() -> None:
    def find(ctx: str, subject: str) -> str:
        return ctx + subject

    cap = codemode.Capability(name="a.find", summary="F.", handler=find)
    compiled, problems = validate_catalog([cap], [])
    assert problems == []
    assert compiled[0].signature == "a.find(*, ctx: str, subject: str)"


def when(at: datetime.datetime) -> str:
    return ""


def untyped(city) -> str:  # type: ignore[no-untyped-def]
    return ""


def star(*cities: str) -> str:
    return ""


def bad_default(days: int = "one") -> str:  # type: ignore[assignment]
    return ""


def bad_result(city: str) -> datetime.date:
    return datetime.date.today()


def typed_input(reading: Reading) -> str:
    return ""


@pytest.mark.parametrize(
    ("fn", "problem"),
    [
        (when, "when(): parameter 'at': unsupported type datetime"),
        (untyped, "untyped(): parameter 'city' has no type annotation"),
        (star, "star(): parameter 'cities': *args and **kwargs are not supported"),
        (bad_default, "bad_default(): parameter 'days': the default 'one' is not a value of its type"),
        (bad_result, "bad_result(): result: unsupported type date"),
        (typed_input, "typed_input(): parameter 'reading': Reading is accepted only as a result type"),
    ],
)
def test_an_unsupported_annotation_is_one_line_naming_the_function_and_the_parameter(
    fn: Any, problem: str
) -> None:
    _, problems = validate_catalog([codemode.Capability(name="a.op", summary="Op.", handler=fn)], [])
    assert len(problems) == 1 and "\n" not in problems[0], problems
    assert problems[0].startswith(f"capability 'a.op': handler types: {problem}"), problems


def maybe_subject(who: authz.Subject | None = None) -> str:
    return who.id if who is not None else ""


@dataclass
class AsIn:
    on_behalf_of: authz.Subject


def legacy_subject_field(ctx: codemode.CallContext, subject: authz.Subject, args: AsIn) -> Out:
    return Out(args.on_behalf_of.id)


@pytest.mark.parametrize("fn", [maybe_subject, legacy_subject_field])
def test_a_subject_is_never_an_input_a_program_could_fill(fn: Any) -> None:
    # Only a parameter annotated exactly Subject receives the trusted caller; `Subject | None`, or a
    # Subject inside an input, would be an argument the program writes: who={"id": "bob"}.
    _, problems = validate_catalog([codemode.Capability(name="a.op", summary="Op.", handler=fn)], [])
    assert len(problems) == 1 and "Subject is passed by the host, never an input" in problems[0], problems


async def test_a_program_cannot_pass_the_subject_as_an_argument() -> None:
    source = 'def main():\n    return me.whoami(who={"id": "bob"})\n'
    async with serve() as server:
        with pytest.raises(codemode.InvalidArguments):
            await server.execute(source, subject=authz.Subject("alice"))
