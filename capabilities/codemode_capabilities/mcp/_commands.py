"""Where a stdio upstream's command is found: codemode's own environment first.

An operator who installed an upstream server with codemode (``pip install mcp-server-time`` into
the same virtualenv) and runs ``.venv/bin/codemode`` without the venv on PATH (an MCP client starts
stdio servers with a minimal environment) would otherwise start the system's ``python3``, which does
not have the server, or find no ``mcp-server-time`` at all. So a bare ``python3`` or ``python`` is
the interpreter running codemode, and any other bare name is taken from that environment's scripts
folder when it is there; a name found in neither, and a command with a ``/``, are left to the PATH
lookup as before (docs/packs.md, "Upstream MCP servers").
"""

from __future__ import annotations

import os
import sys
import sysconfig

__all__ = ["INTERPRETER_NAMES", "resolve_command"]

#: Bare command names that mean "the Python running codemode".
INTERPRETER_NAMES = frozenset({"python", "python3", f"python3.{sys.version_info.minor}"})


def _scripts_dir() -> str | None:
    scripts = sysconfig.get_path("scripts")
    return scripts if scripts and os.path.isdir(scripts) else None


def resolve_command(command: str) -> str:
    """The program a stdio upstream's ``command`` starts.

    Args:
        command: the configured command (a bare name, or a path).

    Returns:
        ``sys.executable`` for a bare ``python``/``python3``; the file of that name in the running
        environment's scripts folder when it exists and can run; else ``command`` unchanged.
    """
    if os.sep in command or not command:
        return command
    if command in INTERPRETER_NAMES and sys.executable:
        return sys.executable
    scripts = _scripts_dir()
    if scripts is not None:
        candidate = os.path.join(scripts, command)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return command
