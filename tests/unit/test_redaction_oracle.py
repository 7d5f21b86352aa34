"""Redaction answers no question about a part of a credential (issue 31 §1).

A backend's error text or result often repeats what the tenant's program sent. Whatever that text
shares with a configured credential, short of a whole spelling of it, must make no difference to
what the client sees: the text, its length, the log. Checked here for every part of every
spelling the redaction knows (plain, percent-, JSON-, HTML-, base64-encoded, in any case), through
``Redactor`` (the OpenAPI pack) and ``upstream_error_text`` (the upstream MCP pack); and every
whole spelling is redacted with nothing of it left. The end-to-end attack, through real backends,
is tests/integration/test_credential_oracle.py.
"""

from __future__ import annotations

import base64
import functools
import logging

import pytest

from codemode.packs.redaction import MARK, Redactor, encodings, spellings
from codemode.packs.upstream import upstream_error_text

CREDENTIALS = {
    "bearer": "Bearer b8oYsfroDrsehrD5-x_Q",
    "basic": "Basic " + base64.b64encode(b"svc-reports:HAnLfhbX84zvm/+").decode(),
    "vendor": "sk_live_nvzxM9pnUnALQJd9",
}


def every_spelling(value: str) -> set[str]:
    out: set[str] = set()
    for form in spellings(value):
        texts, middles = encodings(form)
        out |= texts | middles
    return out


@functools.cache
def folded_spellings(value: str) -> tuple[str, ...]:
    return tuple(sorted({s.lower() for s in every_spelling(value)}, key=len))


def holds_a_whole_spelling(text: str, value: str) -> bool:
    text = text.lower()
    return any(s in text for s in folded_spellings(value) if len(s) <= len(text))


def parts(spelling: str) -> set[str]:
    """Every proper part of ``spelling`` (in three cases): every prefix and suffix, and every run of
    4 to 12 characters."""
    out = {spelling[:i] for i in range(1, len(spelling))} | {spelling[i:] for i in range(1, len(spelling))}
    out |= {spelling[i : i + n] for n in range(4, 13) for i in range(len(spelling) - n + 1)}
    return {variant for part in out for variant in (part, part.upper(), part.lower())}


@pytest.mark.parametrize("kind", sorted(CREDENTIALS))
def test_no_part_of_any_spelling_changes_what_the_redactor_returns(kind: str) -> None:
    value = CREDENTIALS[kind]
    r = Redactor([value])
    checked = 0
    for spelling in every_spelling(value):
        for part in parts(spelling):
            if holds_a_whole_spelling(part, value):
                continue
            text = f"!{part}!"
            assert r.redact(text) == (text, 0), (spelling, part)
            assert r.head(text, 3) == (text[:3], 0)
            checked += 1
    assert checked > 1000


@pytest.mark.parametrize("kind", sorted(CREDENTIALS))
def test_no_part_of_a_spelling_changes_an_upstream_error_text(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The text a client sees is the one it would see with no credential configured at all."""
    value = CREDENTIALS[kind]
    token = value.partition(" ")[2] or value
    checked = 0
    with caplog.at_level(logging.WARNING):
        for spelling in (value, token, *encodings(value)[1], *encodings(token)[0]):
            for part in {spelling[:i] for i in range(1, len(spelling))} | {
                spelling[i:] for i in range(1, len(spelling))
            }:
                for variant in (part, part.swapcase()):
                    if holds_a_whole_spelling(variant, value):
                        continue
                    text = f"Entity with name !{variant}! not found"
                    assert upstream_error_text("api", text, secrets=[value]) == upstream_error_text(
                        "api", text
                    )
                    checked += 1
    assert checked > 500
    assert not caplog.records


@pytest.mark.parametrize("kind", sorted(CREDENTIALS))
def test_every_whole_spelling_is_redacted_and_nothing_of_it_shown(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    value = CREDENTIALS[kind]
    r = Redactor([value])
    for spelling in every_spelling(value):
        for variant in (spelling, spelling.upper(), spelling.lower()):
            text = f"key {variant} refused"
            shown, count = r.redact(text)
            assert count >= 1 and MARK in shown, (variant, shown)
            assert not _pieces(variant) & _pieces(shown), (variant, shown)
            with caplog.at_level(logging.WARNING):
                caplog.clear()
                seen = upstream_error_text("api", text, secrets=[value])
            assert "[redacted]" in seen and not _pieces(variant) & _pieces(seen), (variant, seen)
            assert [rec.getMessage() for rec in caplog.records] == [
                "upstream 'api': its error text carried a configured credential: redacted"
            ]


def _pieces(text: str, size: int = 6) -> set[str]:
    return {text[i : i + size] for i in range(len(text) - size + 1)} - {MARK[i : i + size] for i in range(5)}


def test_base64_of_the_credential_inside_a_longer_encoded_text() -> None:
    """At each byte offset, the characters that encode any bit of the credential all go: the ones
    that encode only its bits, and the one on each side that encodes some of them."""
    value = CREDENTIALS["vendor"]
    r = Redactor([value])
    for lead in range(6):
        for trail in range(4):
            blob = base64.b64encode(b"{" * lead + value.encode() + b"}" * trail).decode()
            first, last = 8 * lead // 6, (8 * (lead + len(value)) - 1) // 6  # chars with its bits
            shown = r.exact(f"state={blob}&x=1")
            before, mark, after = shown.removeprefix("state=").partition(MARK)
            assert mark and len(before) <= first, (lead, trail, shown)
            kept_after = len(after.removesuffix("&x=1"))
            assert len(blob) - kept_after > last, (lead, trail, shown)
