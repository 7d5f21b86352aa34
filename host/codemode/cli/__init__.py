"""The ``codemode`` command: ``serve``, ``token``, ``image audit``, ``quotas tune`` and ``bench``.

It is the composition root of the command line: it parses flags, loads :mod:`codemode.startup.config`
settings and starts a front end (the stdio MCP server, the HTTP service) or an operator tool
(:mod:`codemode.ops`). Exit codes: 0 success, 1 a run-time failure, 2 a configuration or usage error.
"""

from __future__ import annotations

from .main import build_parser, main

__all__ = ["build_parser", "main"]
