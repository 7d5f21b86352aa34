"""What the host derives from a subject id for an upstream (``codemode_capabilities.mcp.tenancy``):
the key, the header token, the placeholders and the subject directory, for ids chosen to break
them; how the subject's directory is shown to its programs; which credential values the host
redacts from an upstream's text."""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.parse
from pathlib import Path

import pytest

from codemode_capabilities.mcp.tenancy import (
    DirAlias,
    SubjectDirs,
    expand,
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
    assert launch.args == (str(tmp_path / "upstreams" / "x" / subject_key("alice")),)


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


def test_the_subject_dir_is_shown_as_its_placeholder_both_ways(tmp_path: Path) -> None:
    """Out: every string of a result, the configured and the resolved spelling of the directory
    (a data dir reached through a link); in: every string of the arguments."""
    real = tmp_path / "real"
    (real / "upstreams" / "x").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    where = SubjectDirs(tmp_path / "link", "x").path_of("bob")
    resolved = SubjectDirs(real, "x").path_of("bob")
    alias = DirAlias(where)
    result = {"a": [f"{where}/x", {"b": f"in {resolved}/y"}], "n": 3, "t": True}
    assert alias.outward(result) == {"a": ["{subject_dir}/x", {"b": "in {subject_dir}/y"}], "n": 3, "t": True}
    assert alias.inward({"path": "{subject_dir}/x", "list": ["{subject_dir}"]}) == {
        "path": f"{where}/x",
        "list": [str(where)],
    }
    nothing = DirAlias(None)
    assert nothing.outward(result) is result and nothing.inward("{subject_dir}") == "{subject_dir}"


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
