"""The MCP front end: three tools over a built ``Server`` (``adapter``, re-exported here). See
docs/mcp.md and docs/reference/tools.md."""

from .adapter import TOOL_NAMES, ContextSubject, Resolver, StaticSubject, create_server, tool_definitions

__all__ = ["TOOL_NAMES", "ContextSubject", "Resolver", "StaticSubject", "create_server", "tool_definitions"]
