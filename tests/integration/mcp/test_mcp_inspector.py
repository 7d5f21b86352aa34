"""Conformance with a client this project did not write: the MCP Inspector in CLI mode.

Runs ``npx @modelcontextprotocol/inspector --cli ... -- codemode serve --stdio ...`` against the
real stdio server. The package is installed once into a local cache directory
(``CODEMODE_INSPECTOR_DIR``, default ``~/.cache/codemode/inspector``) so later runs start quickly;
``CODEMODE_INSPECTOR_VERSION`` picks the version. Without ``npx`` the test is skipped with a visible
reason, except when ``CI=true``: then it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.environment import unavailable
from tests.support.mcp_client import RECORDS_PACK, child_env, cli_command

# The module's first run installs the Inspector from npm (up to 240 s) inside the fixture's time.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PACKAGE = "@modelcontextprotocol/inspector"
VERSION = os.environ.get("CODEMODE_INSPECTOR_VERSION", "2.12.0")


def _unavailable(reason: str) -> None:
    unavailable("MCP Inspector conformance", reason)


def _install_dir() -> Path:
    default = Path.home() / ".cache" / "codemode" / "inspector"
    return Path(os.environ.get("CODEMODE_INSPECTOR_DIR", str(default)))


@pytest.fixture(scope="module")
def inspector() -> list[str]:
    """The argv prefix that runs the Inspector CLI."""
    npx = shutil.which("npx")
    npm = shutil.which("npm")
    if npx is None or npm is None:
        _unavailable("npx/npm not found on PATH (install Node.js to run the MCP Inspector conformance test)")
    assert npx is not None and npm is not None
    where = _install_dir()
    marker = where / "node_modules" / "@modelcontextprotocol" / "inspector" / "package.json"
    installed = marker.exists() and json.loads(marker.read_text()).get("version") == VERSION
    if not installed:
        where.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [npm, "install", "--prefix", str(where), "--no-audit", "--no-fund", f"{PACKAGE}@{VERSION}"],
            capture_output=True,
            text=True,
            timeout=240,
        )
        if proc.returncode != 0:
            _unavailable(f"npm install {PACKAGE}@{VERSION} failed: {proc.stderr.strip()[-500:]}")
    binary = where / "node_modules" / ".bin" / "mcp-inspector"
    if binary.exists():
        return [str(binary), "--cli"]
    return [npx, "-y", "--prefix", str(where), f"{PACKAGE}@{VERSION}", "--cli"]


def run_inspector(prefix: list[str], tmp: Path, *method_args: str, expect_rc: int = 0) -> Any:
    """Run one Inspector CLI call against a fresh ``codemode serve --stdio``; returns its ``result``."""
    server = cli_command("serve", "--stdio", "--allow-all", "--pack", RECORDS_PACK)
    env = child_env(
        MCP_CATALOG_PATH=str(tmp / "catalog.json"),  # keep the Inspector's files out of $HOME
        MCP_CLIENT_CONFIG_PATH=str(tmp / "client.json"),
    )
    proc = subprocess.run(
        [*prefix, *method_args, "--format", "json", "--", *server],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == expect_rc, f"inspector exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout)["result"]


def test_inspector_tools_list_strict(inspector: list[str], tmp_path: Path) -> None:
    # --strict: the Inspector's tool-schema portability audit; any finding is printed on stderr
    # and an error-severity one fails the run.
    server = cli_command("serve", "--stdio", "--allow-all", "--pack", RECORDS_PACK)
    proc = subprocess.run(
        [*inspector, "--method", "tools/list", "--strict", "--format", "json", "--", *server],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(
            MCP_CATALOG_PATH=str(tmp_path / "c.json"), MCP_CLIENT_CONFIG_PATH=str(tmp_path / "k.json")
        ),
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr.lower(), proc.stderr
    tools = json.loads(proc.stdout)["result"]["tools"]
    assert [t["name"] for t in tools] == ["search_api", "describe_api", "execute"]
    for tool in tools:
        schema = tool["inputSchema"]
        assert schema["type"] == "object"
        assert schema["additionalProperties"] is False
        assert len(schema["required"]) == 1
        assert schema["properties"][schema["required"][0]]["type"] == "string"
        assert tool["outputSchema"]["type"] == "object"


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_inspector_search(inspector: list[str], tmp_path: Path, era: str) -> None:
    out = run_inspector(
        inspector,
        tmp_path,
        "--protocol-era",
        era,
        "--method",
        "tools/call",
        "--tool-name",
        "search_api",
        "--tool-arg",
        "query=create record",
    )
    assert out["isError"] is False
    assert out["structuredContent"]["results"][0]["name"] == "records.create"
    assert json.loads(out["content"][0]["text"]) == out["structuredContent"]


def test_inspector_errors(inspector: list[str], tmp_path: Path) -> None:
    # The Inspector exits 5 for an isError result and still prints it.
    out = run_inspector(
        inspector, tmp_path, "--method", "tools/call", "--tool-name", "describe_api",
        "--tool-arg", "name=records.nope", expect_rc=5,
    )  # fmt: skip
    assert out == {"content": [{"type": "text", "text": "capability not found"}], "isError": True}
    out = run_inspector(
        inspector, tmp_path, "--method", "tools/call", "--tool-name", "search_api",
        "--tool-args-json", '{"query": 5}', expect_rc=5,
    )  # fmt: skip
    assert out["isError"] is True
    assert out["content"][0]["text"].startswith("invalid tool arguments: search_api")


def test_inspector_execute(inspector: list[str], tmp_path: Path) -> None:
    source = (
        'def main():\n    r = records.create(title="from inspector")\n'
        '    return records.get(id=r["id"])["title"]\n'
    )
    out = run_inspector(
        inspector, tmp_path, "--method", "tools/call", "--tool-name", "execute",
        "--tool-args-json", json.dumps({"source": source}),
    )  # fmt: skip
    assert out["isError"] is False, out
    calls = [
        {"capability": "records.create", "outcome": "ok"},
        {"capability": "records.get", "outcome": "ok"},
    ]
    assert out["structuredContent"] == {"result": "from inspector", "calls": calls}
    assert [json.loads(block["text"]) for block in out["content"]] == [
        {"result": "from inspector"},
        {"calls": calls},
    ]
    # An error result with its ledger in structuredContent is accepted by a third-party client too.
    failing = 'def main():\n    records.create(title="x")\n    return records.get(id=999)\n'
    out = run_inspector(
        inspector, tmp_path, "--method", "tools/call", "--tool-name", "execute",
        "--tool-args-json", json.dumps({"source": failing}), expect_rc=5,
    )  # fmt: skip
    assert out["isError"] is True
    assert (
        out["content"][0]["text"]
        == out["structuredContent"]["error"]
        == "capability failed: record 999 not found"
    )
    assert out["structuredContent"]["calls"] == [
        {"capability": "records.create", "outcome": "ok"},
        {"capability": "records.get", "outcome": "failed"},
    ]
