"""Startup wiring: the one settings model (``config``) and settings → packs, authorizer, runtime and
a built ``Server`` (``bootstrap``). See docs/configuration.md."""
