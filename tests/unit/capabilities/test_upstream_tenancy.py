"""What the host derives from a subject id for an upstream (``codemode_capabilities.mcp.tenancy``):
the key, the header token, the placeholders and the subject directory, for ids chosen to break
them; what the server is given for its directory, and which values count as the fixed paths a
per-subject table may not share by accident; which credential values the host redacts from an
upstream's text."""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.parse
from pathlib import Path

import pytest

from codemode_capabilities.mcp.stdio_relay import VIEW_DIR
from codemode_capabilities.mcp.tenancy import (
    SubjectDirs,
    expand,
    fixed_paths,
    placeholders_in,
    subject_key,
    subject_token,
)
from codemode_capabilities.mcp.upstream import UpstreamMCPConfig, UpstreamMCPPack

HOSTILE_IDS = [
    "alice",
    "Alice",
    "../../etc",
    "a/b",
    "-rf",
    "--root=/",
    "x\r\nX-Admin: 1",
    "\u00e9",
    "e\u0301",
    "",
    "a" * 5000,
]


@pytest.mark.parametrize("subject_id", HOSTILE_IDS)
def test_the_key_is_always_32_lower_case_hex_digits_of_the_sha256(subject_id: str) -> None:
    key = subject_key(subject_id)
    assert re.fullmatch(r"[0-9a-f]{32}", key)
    assert key == hashlib.sha256(subject_id.encode()).hexdigest()[:32]


def test_different_ids_get_different_keys_and_tokens() -> None:
    assert len({subject_key(i) for i in HOSTILE_IDS}) == len(HOSTILE_IDS)  # case and NFC/NFD too
    assert len({subject_token(i) for i in HOSTILE_IDS}) == len(HOSTILE_IDS)


@pytest.mark.parametrize("subject_id", HOSTILE_IDS)
def test_the_header_token_is_one_safe_token_that_maps_back(subject_id: str) -> None:
    token = subject_token(subject_id)
    assert re.fullmatch(r"[A-Za-z0-9_.~%-]*", token)
    assert urllib.parse.unquote(token) == subject_id


def test_placeholders_expand_once_and_other_braces_stay() -> None:
    values = {"{subject_dir}": "/d/{subject_key}", "{subject_key}": "k"}
    assert expand("{subject_dir}/m.jsonl", values) == "/d/{subject_key}/m.jsonl"  # never expanded twice
    assert expand('{"a": 1} {subject} {subject_key}', values) == '{"a": 1} {subject} k'
    assert placeholders_in(["{subject_dir}x", "{subject_keys}", "{subject}"]) == {
        "{subject_dir}",
        "{subject}",
    }


ODD_IDS = [
    "",
    "..",
    "/",
    "a/../b",
    "a\x00b",
    "\ud800",
    "\udc00",
    "\ufffd",
    "A",
    "a",
    "é",
    "e\u0301",
    "x" * 100_000,
]


def test_odd_subject_ids_get_distinct_path_safe_keys_and_header_tokens() -> None:
    keys = [subject_key(i) for i in ODD_IDS]
    assert len(set(keys)) == len(ODD_IDS)
    assert all(len(k) == 32 and all(c in "0123456789abcdef" for c in k) for k in keys)
    tokens = [subject_token(i) for i in ODD_IDS]
    assert len(set(tokens)) == len(ODD_IDS)
    assert all(t.isascii() and not any(c in t for c in "\r\n\x00 /:,;") for t in tokens)


def test_a_placeholder_value_is_never_expanded_again_and_other_braces_stay() -> None:
    values = {"{subject_dir}": "/d/{subject_key}", "{subject_key}": "k"}
    assert expand("{subject_dir}", values) == "/d/{subject_key}"
    assert expand("{subject_{subject_key}}", values) == "{subject_k}"
    assert expand("{subject}{SUBJECT_DIR}{ subject_dir }", values) == "{subject}{SUBJECT_DIR}{ subject_dir }"


def test_placeholders_are_not_expanded_in_the_command_or_env_names(tmp_path: Path) -> None:
    cfg = UpstreamMCPConfig(
        name="x",
        command="/bin/{subject_key}",
        args=["{subject_dir}"],
        env={"{subject_key}": "v", "K": "{subject}"},
    )
    launch = UpstreamMCPPack([cfg], data_dir=tmp_path).launch(cfg, "alice")
    assert launch.command == "/bin/{subject_key}"
    assert launch.env == {"{subject_key}": "v", "K": "{subject}"}
    # the server sees its directory at /mnt, in a view of its own over the subject's host directory
    assert launch.args == (VIEW_DIR,) and launch.cwd is None
    assert launch.view == str(tmp_path / "upstreams" / "x" / subject_key("alice"))
    assert launch.relay_argv()[-4:] == [f"--view={launch.view}", "--", "/bin/{subject_key}", VIEW_DIR]
    host = UpstreamMCPConfig(name="x", command="y", args=["{subject_dir}"], subject_dir_view="host")
    launch = UpstreamMCPPack([host], data_dir=tmp_path).launch(host, "alice")
    assert launch.view is None and launch.args == (str(tmp_path / "upstreams" / "x" / subject_key("alice")),)


@pytest.mark.parametrize("planted", ["upstreams", "upstreams/x", "upstreams/x/KEY"])
def test_a_symlink_planted_on_the_way_to_a_subject_dir_is_refused(tmp_path: Path, planted: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = tmp_path / "data" / planted.replace("KEY", subject_key("bob"))
    where.parent.mkdir(parents=True, exist_ok=True)
    where.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(OSError, match="symbolic link"):
        SubjectDirs(tmp_path / "data", "x").of("bob")
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize(
    ("value", "fixed"),
    [
        ("/data/memory.jsonl", ["/data/memory.jsonl"]),
        ("--db=/srv/x.db", ["/srv/x.db"]),
        ("file:///srv/x", ["///srv/x"]),
        ("a,./b,c", ["./b"]),
        ("/usr/bin:/bin", ["/usr/bin", "/bin"]),
        ("~/.config/app", ["~/.config/app"]),
        ("..", [".."]),
        ("rel/dir", ["rel/dir"]),
        ("Europe/Paris", ["Europe/Paris"]),
        ("memory.jsonl", []),
        ("stdio", []),
        ("--level=debug", []),
        ("https://api.example/v1", []),
        ("--url=wss://x.example/a/b", []),
        ("{subject_dir}/memory.jsonl", []),
        ("/data/{subject_key}/m.jsonl", []),
        ("--root={subject_dir}", []),
        ("{subject_dir}/../x", ["{subject_dir}/../x"]),
        ("/data/{subject}/x", ["/data/{subject}/x"]),  # not a placeholder of args
    ],
)
def test_which_values_name_a_fixed_path(value: str, fixed: list[str]) -> None:
    """The rule docs/packs.md states, piece by piece, for an argument and an env value alike."""
    assert [piece for _, piece in fixed_paths({}, [value], None, ())] == fixed
    assert [piece for _, piece in fixed_paths({"V": value}, [], None, ())] == fixed


def test_cwd_is_always_a_path_and_shared_paths_match_whole_segments() -> None:
    assert fixed_paths({}, [], "app", ()) == [("cwd", "app")]
    assert fixed_paths({}, [], "{subject_dir}/work", ()) == []
    shared = ["/opt/mcp", "/srv/docs/", "Europe/Paris"]
    values = ["/opt/mcp/x/index.js", "/opt/mcpx/y", "/srv/docs", "/srv/docs/../secret", "Europe/Paris"]
    found = fixed_paths({"B": "/b", "A": "/a"}, values, "/opt/mcp", shared)
    assert found == [
        ("env A", "/a"),
        ("env B", "/b"),
        ("args[1]", "/opt/mcpx/y"),
        ("args[3]", "/srv/docs/../secret"),
    ]


def test_a_path_under_the_view_is_refused_with_the_view() -> None:
    with pytest.raises(ValueError, match=r"args\[1\] names '/mnt/tools', under /mnt, where the server sees"):
        UpstreamMCPConfig(name="x", command="y", args=["{subject_dir}", "/mnt/tools"])
    with pytest.raises(ValueError, match=r"command names '/mnt/bin/server'"):
        UpstreamMCPConfig(name="x", command="/mnt/bin/server", args=["{subject_dir}"])
    # no view, or the host path: /mnt is the host's
    UpstreamMCPConfig(name="x", command="y", args=["/mnt/tools"])
    UpstreamMCPConfig(name="x", command="y", args=["{subject_dir}", "/mnt/tools"], subject_dir_view="host")


def test_shared_state_is_only_for_per_subject_stdio_tables() -> None:
    table = {"name": "x", "command": "y", "env": {"MEMORY_FILE_PATH": "/data/m.jsonl"}}
    assert UpstreamMCPConfig(**table).shared_state() == [("env MEMORY_FILE_PATH", "/data/m.jsonl")]
    assert UpstreamMCPConfig(**table, tenancy="shared").shared_state() == []
    assert UpstreamMCPConfig(**table, shared_paths=["/data"]).shared_state() == []
    with pytest.raises(ValueError, match="shared_paths/subject_dir_view are for stdio"):
        UpstreamMCPConfig(name="x", url="http://x.example/mcp", shared_paths=["/a"])


def test_every_configured_credential_value_is_known_for_redaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """env_from_host (stdio); headers_from_env, headers_from_file and the subject's own headers
    (HTTP); never the literal ``headers`` or ``env`` (not secrets)."""
    monkeypatch.setenv("CM_TEST_KEY", "env-secret-1")
    monkeypatch.setenv("CM_TEST_TOKEN", "Bearer env-token-2")
    (tmp_path / "auth").write_text("file-secret-3\n")
    (tmp_path / "tenants.json").write_text(json.dumps({"bob": "bob-secret-4"}))
    stdio = UpstreamMCPConfig(
        name="s", command="x", env={"PLAIN": "literal"}, env_from_host={"API_KEY": "CM_TEST_KEY"}
    )
    http = UpstreamMCPConfig(
        name="h",
        url="https://mcp.example.internal/mcp",
        headers={"User-Agent": "codemode"},
        headers_from_env={"Authorization": "CM_TEST_TOKEN"},
        headers_from_file={"X-Key": str(tmp_path / "auth")},
        subject_headers={"X-Tenant": "tenant-{subject}"},
        subject_headers_from_file={"X-Tenant-Key": str(tmp_path / "tenants.json")},
    )
    assert stdio.secret_values("bob") == ("env-secret-1",)
    assert http.secret_values(None) == ("Bearer env-token-2", "file-secret-3")
    assert set(http.secret_values("bob")) == {
        "Bearer env-token-2",
        "file-secret-3",
        "tenant-bob",
        "bob-secret-4",
    }
    pack = UpstreamMCPPack([stdio, http], data_dir=tmp_path)
    assert pack.launch(http, "bob").secrets == http.secret_values("bob")
    assert pack.launch(stdio, None).secrets == ("env-secret-1",)
