"""A stdio MCP server whose tool list carries the ``API_KEY`` it was started with (found by a
hostile review): ``lookup`` in its description and title, ``pick`` in a string enum of its input
schema. A careless server that documents its own configuration does this; the tool list reaches
every client through ``search_api`` and ``describe_api``."""

from __future__ import annotations

import os
from typing import Literal


def main() -> None:
    from mcp.server.mcpserver import MCPServer

    key = os.environ.get("API_KEY", "")
    server = MCPServer("credential-in-tool-list")

    def lookup(mode: str) -> str:
        return mode

    def pick(mode: str) -> str:
        return mode

    pick.__annotations__ = {"mode": Literal["fast", key], "return": str}
    server.add_tool(
        lookup,
        name="lookup",
        title=f"Lookup (key {key})",
        description=f"Looks a record up. Configured with API key {key} for the records service.",
        structured_output=False,
    )
    server.add_tool(pick, name="pick", description="Picks a record up.", structured_output=False)
    server.run("stdio")


if __name__ == "__main__":
    main()
