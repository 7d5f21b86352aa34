"""docs/service.md's MCP Inspector command over HTTP with a token: the Inspector
version the page names takes ``--header``, and lists the three tools of a served codemode; without
the header it is refused."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.mcp.test_mcp_inspector import VERSION, inspector  # noqa: F401  (the fixture)
from tests.support.mcp_client import RECORDS_PACK, child_env, cli_command
from tests.support.service import write_token_file

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]


def _page_command() -> list[str]:
    page = (ROOT / "docs" / "service.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"^```sh\n(.*?)^```", page, re.M | re.S) if "inspector@" in b]
    return shlex.split(block.replace("\\\n", " "))


def test_the_page_names_the_tested_version() -> None:
    assert f"@modelcontextprotocol/inspector@{VERSION}" in _page_command()


def test_inspector_lists_tools_over_http_with_a_token(inspector: list[str], tmp_path: Path) -> None:  # noqa: F811
    tokens = write_token_file(tmp_path, ["alice"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = cli_command(
        "serve", "--http", "--allow-all", "--pack", RECORDS_PACK, "--port", str(port),
        "--health-port", "0", "--metrics-port", "0", "--token-file", str(tokens.path),
        "--data-dir", str(tmp_path / "data"),
    )  # fmt: skip
    server = subprocess.Popen(argv, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, "the service exited"
            time.sleep(0.1)
        page = _page_command()
        args = page[page.index("--cli") + 1 :]
        args = [a.replace("8080", str(port)).replace("$TOKEN", tokens["alice"]) for a in args]
        env = child_env(
            MCP_CATALOG_PATH=str(tmp_path / "c.json"), MCP_CLIENT_CONFIG_PATH=str(tmp_path / "k.json")
        )
        listed = subprocess.run(
            [*inspector, *args, "--format", "json"], capture_output=True, text=True, timeout=120, env=env
        )
        assert listed.returncode == 0, listed.stderr
        tools = [t["name"] for t in json.loads(listed.stdout)["result"]["tools"]]
        assert tools == ["search_api", "describe_api", "execute"]
        without = [a for a in args if not a.startswith("Authorization") and a != "--header"]
        refused = subprocess.run(
            [*inspector, *without, "--format", "json"], capture_output=True, text=True, timeout=120, env=env
        )
        assert refused.returncode != 0
    finally:
        server.terminate()
        server.wait(timeout=60)
