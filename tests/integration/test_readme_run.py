"""The README's run command serves MCP on stdout and nothing else."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
# On a fresh checkout `make run` first creates .venv and installs everything (up to 300 s).
@pytest.mark.timeout(600)
def test_make_run_speaks_only_mcp_on_stdout() -> None:
    proc = subprocess.run(
        ["make", "--no-print-directory", "run"],
        cwd=ROOT,
        input=json.dumps(INITIALIZE) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, proc.stderr[-2000:]
    first = json.loads(lines[0])  # any make or pip chatter on stdout would break this
    assert first["id"] == 1 and first["result"]["serverInfo"]["name"] == "codemode"
    assert all(json.loads(line)["jsonrpc"] == "2.0" for line in lines)
