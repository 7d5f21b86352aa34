"""Upstream MCP servers (stdio or streamable HTTP) as typed capabilities: the pack is
:mod:`codemode_capabilities.mcp.upstream`, re-exported here; its parts are the other modules of this
package. See docs/packs.md, "Upstream MCP servers"."""

from .upstream import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_TOOLS,
    TEXT_OUTPUT,
    UpstreamCallFailed,
    UpstreamMCPConfig,
    UpstreamMCPPack,
    UpstreamSession,
    upstream_mcp_pack,
)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_TOOLS",
    "TEXT_OUTPUT",
    "UpstreamCallFailed",
    "UpstreamMCPConfig",
    "UpstreamMCPPack",
    "UpstreamSession",
    "upstream_mcp_pack",
]
