"""Helpers for the upstream tests: our test MCP server, and the npm reference server.

``@modelcontextprotocol/server-everything`` is installed once into a cache directory
(``CODEMODE_EVERYTHING_DIR``, default ``~/.cache/codemode/server-everything``), version
``CODEMODE_EVERYTHING_VERSION`` (default pinned below). Without npm the tests that need it are
skipped with a visible reason, except when ``CI=true``: then they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests import environment

SERVER_SCRIPT = Path(__file__).with_name("upstream_mcp_server.py")
EVERYTHING = "@modelcontextprotocol/server-everything"
EVERYTHING_VERSION = os.environ.get("CODEMODE_EVERYTHING_VERSION", "2026.8.31")


def unavailable(reason: str) -> None:
    environment.unavailable("the upstream MCP test server", reason)


def everything_dir() -> Path:
    default = Path.home() / ".cache" / "codemode" / "server-everything"
    return Path(os.environ.get("CODEMODE_EVERYTHING_DIR", str(default)))


def everything_command() -> list[str]:
    """argv that starts server-everything (without its transport argument), installing it once."""
    npm = shutil.which("npm")
    node = shutil.which("node")
    if npm is None or node is None:
        unavailable("node/npm not found on PATH (install Node.js to test against server-everything)")
    assert npm is not None and node is not None
    where = everything_dir()
    marker = where / "node_modules" / "@modelcontextprotocol" / "server-everything" / "package.json"
    if not (marker.exists() and json.loads(marker.read_text()).get("version") == EVERYTHING_VERSION):
        where.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                npm,
                "install",
                "--prefix",
                str(where),
                "--no-audit",
                "--no-fund",
                f"{EVERYTHING}@{EVERYTHING_VERSION}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            unavailable(f"npm install {EVERYTHING}@{EVERYTHING_VERSION} failed: {proc.stderr.strip()[-500:]}")
    entry = json.loads(marker.read_text())["bin"]
    script = entry if isinstance(entry, str) else next(iter(entry.values()))
    return [node, str(marker.parent / script)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def start_http_upstream(port: int, token_file: Path, markers: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Our test server over streamable HTTP under uvicorn on 127.0.0.1:port (a child process)."""
    env = {**os.environ, "UPSTREAM_MARKERS": str(markers)}
    proc = subprocess.Popen(
        [sys.executable, str(SERVER_SCRIPT), "http", str(port), str(token_file)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"upstream exited: {proc.stderr.read().decode()[-800:] if proc.stderr else ''}"
                )
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("upstream did not start listening within 20 s")
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


OCTOKIT = "@octokit/openapi"
OCTOKIT_VERSION = os.environ.get("CODEMODE_OCTOKIT_OPENAPI_VERSION", "23.0.2")


def octokit_openapi_document() -> tuple[Path, str]:
    """GitHub's REST description from the npm package ``@octokit/openapi`` (installed once into
    ``CODEMODE_OCTOKIT_OPENAPI_DIR``, default ``~/.cache/codemode/octokit-openapi``)."""
    npm = shutil.which("npm")
    if npm is None:
        unavailable("npm not found on PATH (install Node.js to test against @octokit/openapi)")
    assert npm is not None
    default = Path.home() / ".cache" / "codemode" / "octokit-openapi"
    where = Path(os.environ.get("CODEMODE_OCTOKIT_OPENAPI_DIR", str(default)))
    package = where / "node_modules" / "@octokit" / "openapi"
    marker = package / "package.json"
    if not (marker.exists() and json.loads(marker.read_text()).get("version") == OCTOKIT_VERSION):
        where.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                npm,
                "install",
                "--prefix",
                str(where),
                "--no-audit",
                "--no-fund",
                f"{OCTOKIT}@{OCTOKIT_VERSION}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            unavailable(f"npm install {OCTOKIT}@{OCTOKIT_VERSION} failed: {proc.stderr.strip()[-500:]}")
    return package / "generated" / "api.github.com.json", OCTOKIT_VERSION
