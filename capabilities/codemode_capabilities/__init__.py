"""Capability packs that ship with codemode.

Each module exposes a ``pack`` object usable as ``--pack codemode_capabilities.<module>:pack``
(see ``codemode.packs`` for the pack protocol):

- ``records``: a SQLite-backed records store (create, get, search, update, delete), each record owned
  by the subject that created it.
- ``mcp``: tools of upstream MCP servers (stdio or streamable HTTP) as typed capabilities
  (``upstream_mcp_pack(configs)``); a sub-package.
- ``openapi``: operations of OpenAPI 3.x documents as typed capabilities (``openapi_pack(configs)``);
  a sub-package.
- ``upstreams``: both, from one TOML file of ``[[upstream_mcp]]`` / ``[[openapi]]`` tables
  (``--pack codemode_capabilities.upstreams:pack --pack-option CODEMODE_UPSTREAMS_FILE=PATH``).

See ``docs/packs.md``.
"""
