"""``codemode_capabilities.upstreams``: one TOML file with [[upstream_mcp]] and [[openapi]] tables,
and the TOML examples in docs/packs.md (validated against the config models)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest

import codemode
from codemode.packs import PackError, PackSettings
from codemode_capabilities.upstreams import UpstreamsPack, upstream_packs
from tests.support.servers import openapi_app
from tests.support.upstreams import SERVER_SCRIPT

REPO = Path(__file__).resolve().parents[3]


def test_one_toml_file_serves_both_kinds(tmp_path: Path) -> None:
    doc = tmp_path / "inventory.json"
    doc.write_text(json.dumps(openapi_app.app.openapi()))
    config = tmp_path / "upstreams.toml"
    config.write_text(
        f"""
[[upstream_mcp]]
name = "test"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(SERVER_SCRIPT))}, "stdio"]
include = ["addNumbers", "shout"]

[[openapi]]
name = "inventory"
document = {json.dumps(str(doc))}
base_url = "http://127.0.0.1:9"
include_tags = ["items"]
"""
    )
    pack = UpstreamsPack()
    try:
        caps = pack.capabilities(PackSettings(environ={}, options={"CODEMODE_UPSTREAMS_FILE": str(config)}))
        assert sorted(str(c.id) for c in caps) == [
            "mcp:test:addNumbers",
            "mcp:test:shout",
            "openapi:inventory:createItem",
            "openapi:inventory:deleteItem",
            "openapi:inventory:getItem",
            "openapi:inventory:listItems",
        ]
        codemode.Builder(authorizer=codemode.allow_all()).register(*caps).build()
    finally:  # discovery keeps its upstream session for the first call: the test ends it
        asyncio.run(pack.aclose())


def test_errors_name_the_table_and_the_option(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="CODEMODE_UPSTREAMS_FILE"):
        UpstreamsPack().capabilities(PackSettings(environ={}, options={}))
    with pytest.raises(PackError) as info:
        upstream_packs([{"name": "a", "command": "x"}, {"name": "b"}], [{"name": "c", "document": "d"}])
    text = str(info.value)
    assert (
        "upstream_mcp[1]: Value error, upstream 'b': set exactly one of command (stdio) or url (HTTP)" in text
    )
    assert "openapi[0].base_url: Field required" in text
    bad = tmp_path / "bad.toml"
    bad.write_text("[[mcp]]\nname = 'x'\n")
    with pytest.raises(PackError, match=r"unknown tables \['mcp'\]"):
        UpstreamsPack().capabilities(PackSettings(environ={}, options={"CODEMODE_UPSTREAMS_FILE": str(bad)}))


def test_docs_toml_examples_are_valid() -> None:
    text = (REPO / "docs" / "packs.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    seen = 0
    for block in blocks:
        data = tomllib.loads(block)
        mcp_pack, api_pack = upstream_packs(data.get("upstream_mcp", []), data.get("openapi", []))
        seen += len(mcp_pack.configs) + len(api_pack.configs)
    assert seen >= 3


def test_the_config_form_and_the_start_line(tmp_path: Path) -> None:
    """docs/packs.md's simplest form: the tables in the settings file (--config); serve --stdio says
    what it serves on stderr before it answers on stdout."""
    import json
    import shutil
    import subprocess

    from tests.support.mcp_client import child_env, cli_command

    command = shutil.which("mcp-server-time") or str(Path(sys.executable).with_name("mcp-server-time"))
    config = tmp_path / "upstreams.toml"
    config.write_text(f'[[upstream_mcp]]\nname = "time"\ncommand = {json.dumps(command)}\n')
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    proc = subprocess.run(
        [*cli_command("serve", "--stdio", "--allow-all", "--config", str(config))],
        input=json.dumps(init) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(HOME=str(tmp_path)),
    )
    assert json.loads(proc.stdout.splitlines()[0])["id"] == 1, proc.stderr
    assert "codemode: serving 2 capabilities over stdio: time (2)" in proc.stderr.splitlines(), proc.stderr
