"""The HTTP service: ``codemode serve --http``.

``create_app(settings)`` returns the FastAPI application: authenticated MCP streamable HTTP at
``/mcp``, ``/healthz`` and ``/readyz`` (also on the health port), and ``/metrics`` on a separate
(loopback by default) port. ``server_config(app)`` is the uvicorn configuration that bounds connections before
authentication (``serve()`` uses it). Settings come from :mod:`codemode.startup.config`
(``load_settings``). See docs/service.md.
"""

from __future__ import annotations

from .app import Service, create_app, serve, serve_async, server_config

__all__ = ["Service", "create_app", "serve", "serve_async", "server_config"]
