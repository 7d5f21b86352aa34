"""The HTTP service (SPEC §9): ``codemode serve --http``.

``create_app(settings)`` returns the FastAPI application: authenticated MCP streamable HTTP at
``/mcp``, ``/healthz``, ``/readyz`` and ``/metrics``. ``Settings`` come from ``CODEMODE_*``
environment variables and an optional TOML file (``load_settings``). See docs/service.md.
"""

from __future__ import annotations

from .app import Service, create_app, serve, serve_async
from .settings import ConfigError, Settings, load_settings

__all__ = ["ConfigError", "Service", "Settings", "create_app", "load_settings", "serve", "serve_async"]
