"""Configured credentials cut out of upstream text (codemode.packs.redaction)."""

from __future__ import annotations

import base64
from urllib.parse import quote

from codemode.packs.redaction import MARK, Redactor

TOKEN = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"


def test_whole_values_and_their_credential_part() -> None:
    r = Redactor([f"Bearer {TOKEN}"])
    assert r.exact(f"got 'Bearer {TOKEN}'") == f"got '{MARK}'"
    assert r.exact(f"token={TOKEN}!") == f"token={MARK}!"
    assert r.exact("Bearer is a scheme") == "Bearer is a scheme"


def test_basic_auth_is_decoded() -> None:
    value = "Basic " + base64.b64encode(b"ops:s3cr3t-pass").decode()
    r = Redactor([value])
    assert r.exact("user ops:s3cr3t-pass refused") == f"user {MARK} refused"
    assert r.exact("password s3cr3t-pass is wrong") == f"password {MARK} is wrong"


def test_url_encoded_spellings() -> None:
    key = "a/b+c=d&e"
    r = Redactor([key])
    assert r.exact(f"https://x/?k={quote(key, safe='')}") == f"https://x/?k={MARK}"
    assert r.exact("k=a%2Fb%2Bc%3Dd%26e") == f"k={MARK}"


def test_a_part_of_a_secret_is_never_redacted() -> None:
    """Cutting runs of 8 of its characters answered "is this part of the credential?"
    for any text a program had a backend repeat. A truncated key is shown as it is."""
    r = Redactor([TOKEN])
    assert r.exact(f"key {TOKEN[:12]}... is revoked") == f"key {TOKEN[:12]}... is revoked"
    assert r.exact(f"ends with {TOKEN[-9:]}") == f"ends with {TOKEN[-9:]}"
    assert r.exact(f"key {TOKEN} is revoked") == f"key {MARK} is revoked"


def test_short_secrets_only_where_they_stand_alone() -> None:
    r = Redactor(["abc"])
    assert r.exact("abc, abcdef, xabc") == f"{MARK}, abcdef, xabc"


def test_json_values_keys_included() -> None:
    r = Redactor([TOKEN])
    value, changed = r.value({"a": [TOKEN, 1, {TOKEN: f"x{TOKEN}"}], "b": None})
    assert value == {"a": [MARK, 1, {MARK: f"x{MARK}"}], "b": None}
    assert changed == 3


def test_nothing_configured() -> None:
    r = Redactor([None, ""])
    assert not r
    assert r.exact("anything") == "anything"
    assert r.value({"k": "v"}) == ({"k": "v"}, 0)
