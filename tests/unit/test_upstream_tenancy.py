"""What the host derives from a subject id for an upstream (``codemode.capabilities.upstream_tenancy``):
the key, the header token and the placeholders, for ids chosen to break them."""

from __future__ import annotations

import hashlib
import re
import urllib.parse

import pytest

from codemode.capabilities.upstream_tenancy import expand, placeholders_in, subject_key, subject_token

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
