"""``codemode serve --stdio|--http``: settings from flags, environment and TOML, then one front end."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from typing import Any

from ..startup.config import CONFIG_ENV, ConfigError, Settings, load_settings
from .flags import Mode, add_settings_flags, overrides

__all__ = ["add_serve", "run_serve"]

log = logging.getLogger("codemode.cli")


def add_serve(sub: Any) -> argparse.ArgumentParser:
    """Add ``codemode serve`` and its flags (one per setting).

    Args:
        sub: the top-level parser's subparsers.

    Returns:
        The ``serve`` parser.
    """
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="serve MCP over stdio or HTTP",
        description=(
            "Serve the three code-mode tools (search_api, describe_api, execute). Every option also "
            "reads CODEMODE_<OPTION> from the environment and the TOML file of --config; flags win, "
            "repeatable flags add to the comma-separated environment lists. See docs/configuration.md."
        ),
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true", help="serve one local client on stdin/stdout")
    mode.add_argument("--http", action="store_true", help="serve authenticated streamable HTTP at /mcp")
    p.add_argument("--config", metavar="FILE", help=f"TOML settings file ({CONFIG_ENV})")
    add_settings_flags(p)
    return p


def _mode(args: argparse.Namespace) -> Mode:
    if args.stdio:
        return "stdio"
    if args.http:
        return "http"
    transport = os.environ.get("CODEMODE_TRANSPORT", "").strip().lower()
    if transport in ("stdio", "http"):
        return "stdio" if transport == "stdio" else "http"
    raise ConfigError("choose a transport: serve --stdio or serve --http (or CODEMODE_TRANSPORT)")


def _configure_logging(level: str) -> None:
    """Logging of ``serve --stdio`` (``serve --http``'s is the service's own)."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ConfigError(f"--log-level / CODEMODE_LOG_LEVEL: unknown level {level!r}")
    logging.basicConfig(
        level=numeric, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("codemode").setLevel(numeric)


async def _serve_stdio(settings: Settings, server: Any) -> None:
    from mcp.server.stdio import stdio_server

    from ..mcp.adapter import StaticSubject, create_server
    from ..startup.bootstrap import check_runtime

    app = create_server(server, StaticSubject(settings.subject_id))
    try:
        # The start-up rule: a runtime that cannot work stops serve --stdio now, in one line, not at
        # the first execute.
        problem = await check_runtime(server, settings)
        if problem is not None:
            raise ConfigError(problem.detail)
        print(f"codemode: {_catalog_line(server)}", file=sys.stderr, flush=True)
        async with stdio_server() as (read_stream, write_stream):
            await app.run(read_stream, write_stream, app.create_initialization_options())
    finally:
        await server.aclose()


def _catalog_line(server: Any) -> str:
    """What the catalog holds, by namespace: ``serving 11 capabilities over stdio: records (5),
    time (2), memory (4)`` (stdout is the MCP stream; this goes to stderr at start)."""
    counts: dict[str, int] = {}
    for cap in server.capabilities:
        root = cap.name.split(".", 1)[0]
        counts[root] = counts.get(root, 0) + 1
    parts = ", ".join(f"{root} ({n})" for root, n in counts.items())
    total = sum(counts.values())
    return f"serving {total} capabilit{'y' if total == 1 else 'ies'} over stdio" + (
        f": {parts}" if parts else ""
    )


def run_serve(args: argparse.Namespace) -> int:
    """``codemode serve``: load the settings, then serve over stdio or HTTP until stopped.

    Args:
        args: the parsed flags.

    Returns:
        The exit status: 0 when stopped, 1 when serving failed, 2 on a configuration error.
    """
    mode: str | None = None
    try:
        mode = _mode(args)
        settings = load_settings(config_file=args.config, **overrides(args, mode))
        if mode == "http":
            # The service checks its settings and configures logging itself, once
            # (codemode.service.serve_async), before it binds a port.
            return _run_http(settings)
        _configure_logging(settings.log_level if args.log_level else "warning")
        from ..startup.bootstrap import build_server

        server = build_server(settings)
    except ConfigError as exc:
        return _refuse(f"codemode: {exc}", 2, stdio=mode == "stdio")
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve_stdio(settings, server))
    except ConfigError as exc:
        return _refuse(f"codemode: {exc}", 2, stdio=True)
    except Exception as exc:
        log.debug("serve failed", exc_info=True)
        return _refuse(f"codemode: serve failed: {type(exc).__name__}: {exc}", 1, stdio=True)
    return 0


def _refuse(line: str, status: int, *, stdio: bool) -> int:
    """The start-up problem: one line on stderr and, over stdio, the answer to the MCP client's
    requests (codemode.cli._stdio_refusal); ``status`` is the exit status."""
    print(line, file=sys.stderr, flush=True)
    if stdio:
        from ._stdio_refusal import refuse_client

        refuse_client(line)
    return status


def _run_http(settings: Settings) -> int:
    from ..service import serve

    try:
        with contextlib.suppress(KeyboardInterrupt):
            serve(settings)
    except ConfigError:
        raise
    except Exception as exc:
        log.debug("serve --http failed", exc_info=True)
        print(f"codemode: serve --http failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
