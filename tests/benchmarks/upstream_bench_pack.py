"""The pack ``bench_upstream`` serves: upstream MCP servers from ``BENCH_UPSTREAM_MCP`` (a JSON list of
``UpstreamMCPConfig`` tables). Served as ``codemode serve --stdio --pack <this file>:pack``."""

from __future__ import annotations

import json
import os

from codemode_capabilities.mcp.upstream import upstream_mcp_pack

pack = upstream_mcp_pack(json.loads(os.environ.get("BENCH_UPSTREAM_MCP", "[]")))
