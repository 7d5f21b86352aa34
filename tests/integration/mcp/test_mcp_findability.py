"""What a model types finds what it means, through the official MCP client:
search_api matches other inflections, describe_api of a near miss names the closest capability,
and a Python builtin the dialect lacks gets the tool's advice instead of Starlark's nearest spelling."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from mcp import Client

import codemode
from codemode import authz
from tests.support.mcp_client import (
    CLIENT_MODES,
    assert_coarse,
    build,
    call,
    error_text,
    mcp_for,
    success_value,
)

pytestmark = pytest.mark.parametrize("mode", CLIENT_MODES)


@dataclass
class Listing:
    count: int


def _list(ctx: codemode.CallContext, subject: authz.Subject) -> Listing:
    return Listing(0)


ENTITIES = [
    codemode.Capability(name="hass.list_entities", summary="List the entities of the home.", handler=_list),
    codemode.Capability(name="hass.list_areas", summary="List the areas of the home.", handler=_list),
    codemode.Capability(name="hass.secret_entities", summary="List hidden entities.", handler=_list),
]


def _names(result: object) -> list[str]:
    return [r["name"] for r in success_value(result)["results"]]  # type: ignore[arg-type]


async def test_search_finds_other_inflections(mode: str) -> None:
    server = build(ENTITIES, disabled=["hass.secret_entities"])
    async with Client(mcp_for(server), mode=mode) as client:
        assert _names(await call(client, "search_api", query="entity")) == ["hass.list_entities"]
        assert _names(await call(client, "search_api", query="creating records"))[0] == "records.create"
        assert _names(await call(client, "search_api", query="deleted record"))[0] == "records.delete"


async def test_describe_of_a_near_miss_names_the_closest_visible_capability(mode: str) -> None:
    server = build(ENTITIES, disabled=["hass.secret_entities"])
    async with Client(mcp_for(server), mode=mode) as client:
        text = error_text(await call(client, "describe_api", name="records.creat"))
        assert text == "capability not found: did you mean records.create?"
        assert_coarse(text)
        # the disabled capability is the closest name, but no caller may see it
        hidden = error_text(await call(client, "describe_api", name="hass.secret_entitie"))
        assert "secret" not in hidden
        assert error_text(await call(client, "describe_api", name="billing.refund")) == "capability not found"


async def test_a_missing_python_builtin_gets_the_tools_advice(mode: str) -> None:
    server = build(records=False)
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            source = "def main():\n    seen = set([1, 2])\n    return len(seen)\n"
            text = error_text(await call(client, "execute", source=source))
    finally:
        await server.aclose()
    assert text.startswith("invalid program: <codemode>:2:12: `set` is not available: use dict keys"), text
    assert "did you mean" not in text
