"""Review attacks on the tenancy building blocks that FAILED (kept as regression tests): subject
keys and placeholders, subject directories, the relay's UTF-8 replacement against its size bound,
and subject ids the example Rego policy could confuse.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from codemode.authz import AuthorizationInput, PolicyError, Subject
from codemode.authz.rego import from_files
from codemode.capabilities.mcp_upstream import UpstreamMCPConfig, UpstreamMCPPack
from codemode.capabilities.stdio_relay import Relay
from codemode.capabilities.upstream_tenancy import SubjectDirs, expand, subject_key, subject_token

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


def test_invalid_utf8_that_grows_past_the_limit_is_answered_never_passed_whole() -> None:
    limit = 1024
    head = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"'
    line = head + b"\xff" * (limit - len(head) - 5) + b'"}]}}\n'
    relay = Relay(limit)
    out = b"".join(relay.feed(line[i : i + 1]) for i in range(len(line)))  # byte by byte
    message = json.loads(out)
    assert message["id"] == 7 and message["error"]["code"] == -32603
    assert relay.replaced == 1 and relay.dropped == 1


def test_a_split_multibyte_character_at_a_chunk_boundary_is_not_replaced() -> None:
    line = '{"jsonrpc":"2.0","id":1,"result":{"text":"caf\u00e9 \u2603"}}\n'.encode()
    relay = Relay(4096)
    out = b"".join(relay.feed(line[i : i + 1]) for i in range(len(line)))
    assert out == line and relay.replaced == 0


@pytest.mark.parametrize("subject", ["\ud800", "\udc00", "a\x00b"])
def test_ids_rego_cannot_represent_are_a_policy_failure_never_another_tenants_key(subject: str) -> None:
    """A lone surrogate could have been hashed as U+FFFD by the policy, colliding with the subject
    '\\ufffd' (and every other lone surrogate): regopy refuses such input instead."""
    authorizer = from_files(
        "data.codemode.tenant_dirs.allow",
        [Path(__file__).resolve().parents[2] / "examples" / "upstream_tenant_dirs.rego"],
    )
    try:
        for key in (subject_key("\ufffd"), subject_key(subject)):
            with pytest.raises(PolicyError):
                authorizer.decide(
                    AuthorizationInput(
                        Subject(subject),
                        "mcp:files:read_text_file",
                        "files.read_text_file",
                        {"path": f"/srv/tenants/{key}/x"},
                    )
                )
    finally:
        authorizer.close()
