"""Plain typed functions as capabilities, through the official MCP client: describe_api
shows the parameters as inputs (ctx and subject left out) and a non-object result's type under
``returns``; execute calls them with the trusted subject."""

from __future__ import annotations

from typing import TypedDict

import pytest
from mcp import Client

import codemode
from codemode import authz
from tests.support.mcp_client import CLIENT_MODES, call, execute_value, mcp_for, success_value

pytestmark = pytest.mark.parametrize("mode", CLIENT_MODES)

pack = codemode.CapabilityPack()


class Forecast(TypedDict):
    city: str
    days: int


@pack.capability("weather.lookup")
def lookup(city: str, days: int = 1) -> Forecast:
    """Daily forecast for a city."""
    return {"city": city, "days": days}


@pack.capability("me.whoami")
async def whoami(caller: codemode.Subject) -> str:
    """The caller's id."""
    return caller.id


def serve() -> codemode.Server:
    return codemode.Builder(authorizer=authz.allow_all()).add_pack(pack).build()


async def test_describe_and_execute_a_plain_function(mode: str) -> None:
    server = serve()
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            doc = success_value(await call(client, "describe_api", name="weather.lookup"))
            assert doc["signature"] == "weather.lookup(*, city: str, days: int = 1)"
            assert doc["summary"] == "Daily forecast for a city."
            assert "returns" not in doc
            me = success_value(await call(client, "describe_api", name="me.whoami"))
            assert (me["signature"], me["output"], me["returns"]) == ("me.whoami()", [], "str")
            source = 'def main():\n    return [weather.lookup(city="Oslo"), me.whoami()]\n'
            value = execute_value(await call(client, "execute", source=source))
    finally:
        await server.aclose()
    assert value == [{"city": "Oslo", "days": 1}, "alice"]  # StaticSubject("alice") of mcp_for
