"""Helpers for the upstream tests: our test MCP server, and the npm reference servers.

``@modelcontextprotocol/server-everything`` is installed once into a cache directory
(``CODEMODE_EVERYTHING_DIR``, default ``~/.cache/codemode/server-everything``), version
``CODEMODE_EVERYTHING_VERSION`` (default pinned below); ``server-memory`` and
``server-filesystem`` the same way (``CODEMODE_SERVER_MEMORY_*``,
``CODEMODE_SERVER_FILESYSTEM_*``). Without npm the tests that need it are
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
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.support import environment

SERVER_SCRIPT = Path(__file__).resolve().parent / "servers" / "upstream_mcp_server.py"
EVERYTHING = "@modelcontextprotocol/server-everything"
EVERYTHING_VERSION = os.environ.get("CODEMODE_EVERYTHING_VERSION", "2026.8.31")


def unavailable(reason: str) -> None:
    environment.unavailable("the upstream MCP test server", reason)


def npm_package(name: str, version: str, env_dir: str, default_dir: str) -> Path:
    """The folder of npm package ``name@version``, installed once into a cache folder (``env_dir``
    names the variable that moves it; default ``~/.cache/codemode/<default_dir>``)."""
    npm = shutil.which("npm")
    if npm is None:
        unavailable(f"npm not found on PATH (install Node.js to test against {name})")
    assert npm is not None
    where = Path(os.environ.get(env_dir, str(Path.home() / ".cache" / "codemode" / default_dir)))
    package = where / "node_modules" / name
    marker = package / "package.json"
    if not (marker.exists() and json.loads(marker.read_text()).get("version") == version):
        where.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [npm, "install", "--prefix", str(where), "--no-audit", "--no-fund", f"{name}@{version}"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            unavailable(f"npm install {name}@{version} failed: {proc.stderr.strip()[-500:]}")
    return package


def npm_pack(name: str, version: str, env_dir: str, default_dir: str) -> Path:
    """The files of npm package ``name@version`` as published (``npm pack``: no dependencies, no
    install scripts), unpacked once into a cache folder (``env_dir`` names the variable that moves
    it; default ``~/.cache/codemode/<default_dir>``)."""
    npm = shutil.which("npm")
    if npm is None:
        unavailable(f"npm not found on PATH (install Node.js to fetch {name})")
    assert npm is not None
    where = Path(os.environ.get(env_dir, str(Path.home() / ".cache" / "codemode" / default_dir)))
    folder = where / f"{name.replace('/', '+')}@{version}"
    marker = folder / "package" / "package.json"
    if marker.exists() and json.loads(marker.read_text()).get("version") == version:
        return folder / "package"
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        proc = subprocess.run(
            [npm, "pack", f"{name}@{version}", "--pack-destination", tmp, "--silent"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            unavailable(f"npm pack {name}@{version} failed: {proc.stderr.strip()[-500:]}")
        tarball = Path(tmp) / proc.stdout.strip().splitlines()[-1]
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(tarball) as tar:
            tar.extractall(unpacked, filter="data")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(unpacked, folder)
    return folder / "package"


MEMORY = "@modelcontextprotocol/server-memory"
MEMORY_VERSION = os.environ.get("CODEMODE_SERVER_MEMORY_VERSION", "2026.8.31")
FILESYSTEM = "@modelcontextprotocol/server-filesystem"
FILESYSTEM_VERSION = os.environ.get("CODEMODE_SERVER_FILESYSTEM_VERSION", "2026.8.31")


def node_server_command(name: str, version: str, env_dir: str, default_dir: str) -> list[str]:
    """argv (``node`` and the package's bin script) of npm server ``name@version``, installed once."""
    node = shutil.which("node")
    if node is None:
        unavailable(f"node not found on PATH (install Node.js to test against {name})")
    assert node is not None
    package = npm_package(name, version, env_dir, default_dir)
    entry = json.loads((package / "package.json").read_text())["bin"]
    script = entry if isinstance(entry, str) else next(iter(entry.values()))
    return [node, str(package / script)]


def everything_command() -> list[str]:
    """argv that starts server-everything (without its transport argument), installing it once."""
    return node_server_command(EVERYTHING, EVERYTHING_VERSION, "CODEMODE_EVERYTHING_DIR", "server-everything")


def memory_command() -> list[str]:
    """argv of ``@modelcontextprotocol/server-memory`` (``CODEMODE_SERVER_MEMORY_DIR``)."""
    return node_server_command(MEMORY, MEMORY_VERSION, "CODEMODE_SERVER_MEMORY_DIR", "server-memory")


def filesystem_command() -> list[str]:
    """argv of ``@modelcontextprotocol/server-filesystem`` (``CODEMODE_SERVER_FILESYSTEM_DIR``),
    without its directory arguments."""
    return node_server_command(
        FILESYSTEM, FILESYSTEM_VERSION, "CODEMODE_SERVER_FILESYSTEM_DIR", "server-filesystem"
    )


@contextlib.contextmanager
def uvicorn_in_thread(app: Any) -> Iterator[str]:
    """``app`` served by a real uvicorn on 127.0.0.1 in a thread (for module-scoped fixtures);
    yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def start_http_upstream(
    port: int, token_file: Path, markers: Path, *, json_response: bool = False
) -> Iterator[subprocess.Popen[bytes]]:
    """Our test server over streamable HTTP under uvicorn on 127.0.0.1:port (a child process);
    answers come as server-sent event streams, or JSON bodies with ``json_response``."""
    env = {
        **os.environ,
        "UPSTREAM_MARKERS": str(markers),
        "UPSTREAM_JSON_RESPONSE": "1" if json_response else "0",
    }
    proc = subprocess.Popen(
        [sys.executable, str(SERVER_SCRIPT), "http", str(port), str(token_file)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_listening(
            proc,
            port,
            20,
            lambda: f"upstream exited: {proc.stderr.read().decode()[-800:] if proc.stderr else ''}",
        )
        yield proc
    finally:
        stop(proc, 5)
        if proc.stderr is not None:
            proc.stderr.close()


def wait_listening(proc: subprocess.Popen[Any], port: int, seconds: float, exited: Callable[[], str]) -> None:
    """Until ``proc`` accepts connections on 127.0.0.1:port; ``RuntimeError(exited())`` if it exits
    first, ``RuntimeError`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            raise RuntimeError(exited())
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args!r} did not start listening within {seconds:g} s")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[Any], grace: float) -> None:
    """Terminate ``proc``, killing it after ``grace`` seconds; reaped either way."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


OCTOKIT = "@octokit/openapi"
OCTOKIT_VERSION = os.environ.get("CODEMODE_OCTOKIT_OPENAPI_VERSION", "23.0.2")


def octokit_openapi_document() -> tuple[Path, str]:
    """GitHub's REST description from the npm package ``@octokit/openapi`` (installed once into
    ``CODEMODE_OCTOKIT_OPENAPI_DIR``, default ``~/.cache/codemode/octokit-openapi``)."""
    package = npm_package(OCTOKIT, OCTOKIT_VERSION, "CODEMODE_OCTOKIT_OPENAPI_DIR", "octokit-openapi")
    return package / "generated" / "api.github.com.json", OCTOKIT_VERSION
