"""The README's service quick start, as written: ``codemode token new`` makes a token, ``codemode serve
--http`` serves the records pack, and the README's client snippet (official MCP SDK) reaches it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def _snippet() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Running as a service") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_readme_token_serve_and_client(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEMODE_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # the default token file lives here
    env["XDG_DATA_HOME"] = str(tmp_path / "data")  # and the records database
    env["CODEMODE_METRICS_PORT"] = "0"  # any free port: the README's own service may hold 9464
    env["CODEMODE_HEALTH_PORT"] = "0"  # ... and 8001
    cli = [sys.executable, "-m", "codemode.cli"]
    made = subprocess.run(
        [*cli, "token", "new", "alice"], env=env, capture_output=True, text=True, timeout=60
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert (tmp_path / "config" / "codemode" / "codemode.tokens").is_file()
    port = _free_port()
    argv = [
        *cli,
        "serve",
        "--http",
        "--port",
        str(port),
        "--allow-all",
        "--pack",
        "codemode_capabilities.records:pack",
    ]
    server = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, server.communicate()[1]
            assert time.monotonic() < deadline, "service did not start"
            time.sleep(0.2)
        code = _snippet().replace("http://127.0.0.1:8080/mcp", f"http://127.0.0.1:{port}/mcp")
        code = code.replace("<the token>", token)
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert "records.create" in run.stdout
        wrong = code.replace(token, "not-the-token")
        denied = subprocess.run([sys.executable, "-c", wrong], capture_output=True, text=True, timeout=120)
        assert denied.returncode != 0 and "records.create" not in denied.stdout
    finally:
        server.terminate()
        server.communicate(timeout=30)  # reaps it and closes both pipes
