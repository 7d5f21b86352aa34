"""Upstream MCP servers and OpenAPI documents from one TOML file: ``[[upstream_mcp]]`` and
``[[openapi]]`` tables (each table is exactly a :class:`~codemode_capabilities.mcp.upstream.
UpstreamMCPConfig` or :class:`~codemode_capabilities.openapi.OpenAPIConfig`).

Serve it with ``--pack codemode_capabilities.upstreams:pack --pack-option
CODEMODE_UPSTREAMS_FILE=upstreams.toml`` (or the ``CODEMODE_UPSTREAMS_FILE`` environment variable).
:func:`upstream_packs` builds the same packs from already-parsed tables (what a settings loader
calls).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from codemode import Capability
from codemode.packs import PackError, PackSettings, did_you_mean

from .mcp import UpstreamMCPConfig, UpstreamMCPPack
from .openapi import OpenAPIConfig, OpenAPIPack

__all__ = ["FILE_OPTION", "UpstreamsPack", "pack", "table_packs", "upstream_packs"]

#: The pack option (or environment variable) naming the TOML file.
FILE_OPTION = "CODEMODE_UPSTREAMS_FILE"
_KEYS = ("upstream_mcp", "openapi")


def upstream_packs(
    upstream_mcp: Sequence[Mapping[str, Any]] = (), openapi: Sequence[Mapping[str, Any]] = ()
) -> tuple[UpstreamMCPPack, OpenAPIPack]:
    """Validate the tables and build the packs.

    Args:
        upstream_mcp: the ``[[upstream_mcp]]`` tables.
        openapi: the ``[[openapi]]`` tables.

    Returns:
        The upstream MCP pack and the OpenAPI pack.

    Raises:
        PackError: a table is invalid (every problem listed, each naming its table:
            ``upstream_mcp[2].url: ...``).
    """
    problems: list[str] = []

    def validated(key: str, tables: Sequence[Mapping[str, Any]], model: type[Any]) -> list[Any]:
        out = []
        for i, table in enumerate(tables):
            try:
                out.append(model.model_validate(table))
            except ValidationError as exc:
                for err in exc.errors():
                    where = ".".join(str(p) for p in err["loc"])
                    message = err["msg"]
                    if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:
                        message = "unknown key" + did_you_mean(str(err["loc"][0]), model.model_fields)
                    problems.append(f"{key}[{i}]{'.' + where if where else ''}: {message}")
        return out

    mcp_configs: list[UpstreamMCPConfig] = validated("upstream_mcp", upstream_mcp, UpstreamMCPConfig)
    api_configs: list[OpenAPIConfig] = validated("openapi", openapi, OpenAPIConfig)
    if problems:
        raise PackError("upstreams: invalid configuration:\n" + "\n".join(f"- {p}" for p in problems))
    return UpstreamMCPPack(mcp_configs), OpenAPIPack(api_configs)


def table_packs(
    upstream_mcp: Sequence[Mapping[str, Any]] = (), openapi: Sequence[Mapping[str, Any]] = ()
) -> list[tuple[str, str, Any]]:
    """One pack per table, so each upstream starts, or fails to, on its own: what the host's settings
    load their ``[[upstream_mcp]]`` and ``[[openapi]]`` tables through (by the pack loader, as
    ``codemode_capabilities.upstreams:table_packs``).

    Args:
        upstream_mcp: the ``[[upstream_mcp]]`` tables.
        openapi: the ``[[openapi]]`` tables.

    Returns:
        ``(kind, name, pack)`` for each table, kind ``upstream_mcp`` or ``openapi``, in table order.

    Raises:
        PackError: a table is invalid (every problem listed, as :func:`upstream_packs` lists them).
    """
    mcp, api = upstream_packs(upstream_mcp, openapi)
    return [
        *(("upstream_mcp", c.name, UpstreamMCPPack([c])) for c in mcp.configs),
        *(("openapi", c.name, OpenAPIPack([c])) for c in api.configs),
    ]


class UpstreamsPack:
    """The pack behind ``codemode_capabilities.upstreams:pack``: an upstream MCP pack and an OpenAPI
    pack from the tables of one TOML file; its ``open()`` and ``aclose()`` are theirs."""

    def __init__(self) -> None:
        self.packs: tuple[UpstreamMCPPack, OpenAPIPack] | None = None

    def capabilities(self, settings: PackSettings) -> list[Capability]:
        """Read the file the ``CODEMODE_UPSTREAMS_FILE`` option names and build both packs.

        Args:
            settings: the host's pack settings (the option, the data dir, the answer bounds).

        Returns:
            The upstream MCP tools' capabilities, then the OpenAPI operations'.

        Raises:
            PackError: no file, an unreadable file, invalid TOML or tables.
            UpstreamBuildError: an upstream cannot be reached or listed.
        """
        location = settings.get(FILE_OPTION)
        if not location:
            raise PackError(
                f"upstreams: set the TOML file with --pack-option {FILE_OPTION}=PATH or the {FILE_OPTION} "
                "environment variable"
            )
        try:
            data = tomllib.loads(Path(location).read_text(encoding="utf-8"))
        except OSError as exc:
            raise PackError(f"upstreams: cannot read {location}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise PackError(f"upstreams: {location} is not valid TOML: {exc}") from None
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise PackError(f"upstreams: {location}: unknown tables {unknown} (expected {list(_KEYS)})")
        self.packs = upstream_packs(data.get("upstream_mcp", []), data.get("openapi", []))
        return [*self.packs[0].capabilities(settings), *self.packs[1].capabilities(settings)]

    async def open(self) -> None:
        """Open the upstream MCP servers' pack (the OpenAPI pack has no open step)."""
        if self.packs is not None:
            await self.packs[0].open()

    async def aclose(self) -> None:
        """Close both inner packs, the OpenAPI one first (the reverse of their order)."""
        if self.packs is not None:
            for one in reversed(self.packs):
                await one.aclose()


pack = UpstreamsPack()
