"""Capability names derived from upstream tool names stay tied to their own tools, whatever the
order of the list (docs/packs.md, "Names")."""

from __future__ import annotations

import itertools
from typing import Any, cast

import mcp_types as types
import pytest

from codemode.packs.upstream import capability_names
from codemode_capabilities.mcp.upstream import UpstreamMCPConfig, UpstreamMCPPack, _compile_tools, _Tool


def tool(name: str, description: str | None = None, **properties: Any) -> types.Tool:
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in properties}}
    return types.Tool(name=name, description=description or f"I am {name}.", input_schema=schema)


def compiled(tools: list[types.Tool]) -> tuple[dict[str, tuple[str, str, str]], list[tuple[str, str]]]:
    """{capability name: (upstream tool it calls, its id, its description)} and the skip list."""
    config = UpstreamMCPConfig(name="up", command="unused")
    caps, report = _compile_tools(UpstreamMCPPack([config]), config, tools)
    assert all(isinstance(c.handler, _Tool) for c in caps)
    return {c.name: (cast(_Tool, c.handler).tool, str(c.id), c.description or "") for c in caps}, sorted(
        report.skipped
    )


THINGS = [tool("getThing"), tool("get_thing"), tool("get-thing"), tool("get_thing_2"), tool("GetThing")]
TWICE = [tool("twice", "First twice.", a="x"), tool("twice", "Second twice.", b="x")]


def test_every_order_of_the_list_gives_the_same_names_each_tied_to_its_own_tool() -> None:
    expected = {
        # a tool whose name is already its snake_case form keeps it
        "up.get_thing": ("get_thing", "mcp:up:get_thing", "I am get_thing."),
        "up.get_thing_2": ("get_thing_2", "mcp:up:get_thing_2", "I am get_thing_2."),
        # then names in lower case, then the rest, each in code-point order: the next free suffix
        "up.get_thing_3": ("get-thing", "mcp:up:get-thing", "I am get-thing."),
        "up.get_thing_4": ("GetThing", "mcp:up:GetThing", "I am GetThing."),
        "up.get_thing_5": ("getThing", "mcp:up:getThing", "I am getThing."),
    }
    skipped = [
        ("twice", "listed 2 times with different definitions (which one the upstream runs is unknown)")
    ]
    first, second = TWICE
    for order in itertools.permutations([*THINGS, first]):
        for listed in ([*order, second], [second, *order]):
            assert compiled(listed) == (expected, skipped), [t.name for t in listed]


def test_a_tool_listed_twice_the_same_way_is_kept_once() -> None:
    names, skipped = compiled([tool("same"), tool("same"), tool("other")])
    assert sorted(names) == ["up.other", "up.same"] and skipped == []


def test_a_skipped_tool_takes_no_name_from_another() -> None:
    # "get thing" is refused (a space); it must not push getThing off get_thing
    names, skipped = compiled([tool("get thing"), tool("getThing")])
    assert names == {"up.get_thing": ("getThing", "mcp:up:getThing", "I am getThing.")}
    assert [item for item, _ in skipped] == ["'get thing'"]


@pytest.mark.parametrize(
    ("originals", "expected"),
    [
        (["get-item", "getItem", "get_item", "list"], {"get_item": "get_item", "get-item": "get_item_2",
                                                       "getItem": "get_item_3", "list": "list"}),
        (["a_2", "a", "A", "a-2"], {"a": "a", "a_2": "a_2", "A": "a_3", "a-2": "a_2_2"}),
        (["For", "for"], {"For": "for__2", "for": "for_"}),
    ],
)  # fmt: skip
def test_capability_names_rule(originals: list[str], expected: dict[str, str]) -> None:
    for order in itertools.permutations(originals):
        names = capability_names("ns", order)
        assert names == {o: f"ns.{n}" for o, n in expected.items()}
