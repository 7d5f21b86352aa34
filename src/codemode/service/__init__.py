"""The HTTP service: ``codemode serve --http``.

``create_app(settings)`` returns the FastAPI application: authenticated MCP streamable HTTP at
``/mcp``, ``/healthz`` and ``/readyz``, and ``/metrics`` on a separate (loopback by default)
port. Settings come from :mod:`codemode.startup.config`
(``load_settings``). See docs/service.md.
"""

from __future__ import annotations

from .app import Service, create_app, serve, serve_async

__all__ = ["Service", "create_app", "serve", "serve_async"]
