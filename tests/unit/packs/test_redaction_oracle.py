"""Redaction answers no question about a part of a credential.

A backend's error text or result often repeats what the tenant's program sent. Whatever that text
shares with a configured credential, short of a whole spelling of it, must make no difference to
what the client sees: the text, its length, the log. Checked here for every part of every
spelling the redaction knows (plain, percent-, JSON-, HTML-, base64-encoded, in any case), through
``Redactor`` (the OpenAPI pack) and ``upstream_error_text`` (the upstream MCP pack); and every
whole spelling is redacted with nothing of it left. The end-to-end attack, through real backends,
is tests/integration/capabilities/test_credential_oracle.py.
"""

from __future__ import annotations

import base64
import functools
import logging
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest

from codemode.packs.redaction import MARK, Redactor, encodings, spellings
from codemode.packs.upstream import upstream_error_text
from tests.support.escapes import read_out

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


# ------------------------------------------------------------------ review of the fix

#: Credentials of different lengths, and two of one length with a different count of the characters
#: their percent-encoded spellings escape (``/ + =``).
OTHER_CREDENTIALS = [
    "Bearer " + "q7Z" * 5 + "w",
    "Bearer " + "q7Z" * 8,
    "Bearer abc/def+ghi/jkl=mn",
    "Bearer abcadefaghiajklamn",
    CREDENTIALS["basic"],
    "Bearer " + "k" * 700,  # a long one (a JWT): its spellings reach past 1,024 characters
]


def _window_probes() -> list[str]:
    """Texts longer than what upstream_error_text reads whose normal form is much shorter than
    they are (invisible characters, percent-escapes, character references padded with zeros): the
    end of what is shown then tells how far the rule read and how much it dropped at the end."""
    letters = "abcdefghijklmnopqrstuvwxyz" * 200
    escaped = "".join(f"%{ord(c):02X}" for c in letters[:2000])
    referenced = "".join(f"&#{'0' * 20}{ord(c)};" for c in letters[:400])
    return [
        "\u200b" * 900 + escaped,
        "\u200b" * 1500 + escaped,
        referenced,
        "x" * 3000 + referenced,
        letters,
    ]


@pytest.mark.parametrize("value", OTHER_CREDENTIALS)
def test_how_far_an_upstream_error_text_is_read_does_not_depend_on_the_credential(value: str) -> None:
    """The read window was LOOK_AT plus the credential's longest spelling, and the normal form's last
    ``longest`` characters were dropped: with a text whose normal form is shorter than the text (a
    third for percent-escapes), what was left showed the length of the credential's longest spelling,
    which also counts its ``/ + =`` ('Bearer ' + 16, 20, 24 characters showed
    22, 18 and 14 letters; two 18-character tokens with and without '/ + =' 18 and 20)."""
    for text in _window_probes():
        shown = upstream_error_text("api", text, secrets=[value])
        assert shown == upstream_error_text("api", text), text[:40]


def _python_steps(fn: Callable[[], object]) -> int:
    """Python bytecode instructions run by ``fn`` in codemode.packs (redaction and error_text)."""
    steps = 0

    def local(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal steps
        if event == "opcode":
            steps += 1
        return local

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if "codemode/packs/" not in frame.f_code.co_filename:
            return None
        frame.f_trace_opcodes = True
        return local

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return steps


def _redact_steps(r: Redactor, text: str) -> int:
    return _python_steps(lambda: r.redact(text))


def _credential_steps(text: str, value: str) -> int:
    """The Python steps a configured credential adds to upstream_error_text on ``text``."""
    return _python_steps(lambda: upstream_error_text("api", text, secrets=[value])) - _python_steps(
        lambda: upstream_error_text("api", text)
    )


def _look_alike(text: str) -> str:
    """``text`` with every letter and digit replaced by another of its kind (the same shape)."""
    swap = str.maketrans(  # hex letters to hex letters: the text's own rules treat them alike
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
        "fedcbazyxwvutsrqponmlkjihgFEDCBAZYXWVUTSRQPONMLKJIHG7531902468",
    )
    return text.translate(swap)


@pytest.mark.parametrize("kind", sorted(CREDENTIALS))
def test_the_work_of_the_redaction_does_not_depend_on_what_a_text_shares_with_a_credential(kind: str) -> None:
    """A text made of copies of a part of a spelling (every part of 2 to 16 characters of its end,
    where the earlier matcher's anchors were, and every prefix but the whole) takes exactly as many
    Python steps to redact as a text of the same shape that shares nothing with it. Before, a block
    of a text equal to an anchor led to more work (the whole candidate looked up): timing told a
    program which 4-character parts of the credential's last third it had guessed (a review
    measured 2.4 s more for 8 echoes of 512 KiB through an OpenAPI backend)."""
    value = CREDENTIALS[kind]
    r = Redactor([value])
    checked = 0
    for spelling in sorted(every_spelling(value)):
        size = len(spelling)
        ends = {spelling[-n:] for n in (2, 3, 4, 6, 8, 12, 16)}
        starts = {spelling[:n] for n in (size // 3, size // 2, 2 * size // 3, size - 1)}
        for part in sorted(ends | starts):
            if not part or len(part) >= size:
                continue
            shared = ("!" + part) * (4096 // (len(part) + 1))
            other = _look_alike(shared)
            if holds_a_whole_spelling(shared, value) or holds_a_whole_spelling(other, value):
                continue
            assert r.redact(shared) == (shared, 0)
            assert _redact_steps(r, shared) == _redact_steps(r, other), (spelling, part)
            short, other = shared[:2300], other[:2300]  # past what upstream_error_text reads
            assert _credential_steps(short, value) == _credential_steps(other, value), (spelling, part)
            checked += 1
    assert checked > 40


MIXED = "Bearer q7Zx+Lm/9Kp=Aa+Rt/Uv0Yw8"


def _escaped_mixes(token: str) -> set[str]:
    """``token`` with every subset of its ``+ / =`` percent-escaped (upper- or lower-case hex), and
    with its first or second half escaped: how a backend that escapes only some characters (Go's
    url.PathEscape keeps ``+`` and ``=``) or only part of a value echoes it."""
    specials = [i for i, ch in enumerate(token) if ch in "+/="]
    out = set()
    for mask in range(1 << len(specials)):
        chars = list(token)
        for bit, i in enumerate(specials):
            if mask >> bit & 1:
                chars[i] = f"%{ord(token[i]):02X}"
        mixed = "".join(chars)
        out |= {mixed, mixed.replace("%2F", "%2f").replace("%2B", "%2b").replace("%3D", "%3d")}
    half = len(token) // 2
    out |= {quote(token[:half], safe="") + token[half:], token[:half] + quote(token[half:], safe="")}
    return out - {token}


def test_a_credential_echoed_with_some_of_its_characters_percent_escaped_shows_none_of_it() -> None:
    """Before, only the whole value escaped one way (``quote`` with and
    without ``/`` kept, ``quote_plus``) was a spelling: 'q7Zx+Lm%2F9Kp=Aa+Rt%2FUv0Yw8' (Go's
    url.PathEscape), only ``=`` or only ``+`` escaped, or half of it escaped, came back as they
    were through an OpenAPI backend's result or error reason."""
    r = Redactor([MIXED])
    token = MIXED.partition(" ")[2]
    mixes = _escaped_mixes(token)
    assert len(mixes) > 30
    for mixed in sorted(mixes):
        for text in (f"key {mixed} refused", f"key Bearer%20{mixed}&x=1", f"key Bearer {mixed}"):
            shown, count = r.redact(text)
            assert count >= 1 and not _pieces(token) & _pieces(unquote(shown)), (text, shown)
            seen = upstream_error_text("api", text, secrets=[MIXED])
            assert "[redacted]" in seen and not _pieces(token) & _pieces(seen), (text, seen)


def _turkish_lower(text: str) -> str:
    return text.replace("I", "\u0131").lower()


def _turkish_upper(text: str) -> str:
    return text.replace("i", "\u0130").upper()


def test_a_credential_echoed_in_a_turkish_case_shows_none_of_it() -> None:
    """A backend that changes case by the rules of a Turkish locale (Java's ``toLowerCase()`` with
    no locale, on a server set to ``tr_TR``) makes ``I`` a dotless ``ı`` and ``i`` a dotted ``İ``.
    Before, only ASCII case was folded: the echo came back as it was."""
    value = "Bearer Ik9iLmIq7ZiWxI4pTi"
    r = Redactor([value])
    for change in (_turkish_lower, _turkish_upper):
        for echoed in (change(value), change(value.partition(" ")[2])):
            shown, count = r.redact(f"key {echoed} refused")
            assert count == 1 and shown == "key [redacted] refused", (echoed, shown)
            seen = upstream_error_text("api", f"key {echoed} refused", secrets=[value])
            assert seen == "api: key [redacted] refused", (echoed, seen)


def test_a_numeric_credential_echoed_as_a_json_number_shows_none_of_it() -> None:
    """An all-digit credential (an account number, a numeric API key) that a backend echoes as a
    JSON number. Before, only strings were looked at: ``{"key":
    83920571164528}`` came back as it was."""
    value = "83920571164528"
    r = Redactor([value])
    shown, changed = r.value({"key": 83920571164528, "list": [1, 83920571164528.0, True], "n": 7})
    assert changed == 2 and shown == {"key": "[redacted]", "list": [1, "[redacted].0", True], "n": 7}, shown


def test_a_spelling_across_the_parts_a_long_text_is_scanned_in_is_found() -> None:
    """Matching takes a long text in parts of 65,536 window starts (its memory stays bounded): a
    spelling that starts just before, at or after a part's end is found whole."""
    value = CREDENTIALS["vendor"]
    r = Redactor([value])
    for at in range(65536 - len(value) - 2, 65536 + 3):
        text = "x" * at + value + "y" * 70000
        shown, count = r.redact(text)
        assert count == 1 and shown == "x" * at + "[redacted]" + "y" * 70000, at
        escaped = "x" * at + value.replace("_", "%5F") + "y" * 70000  # through the decoded pass
        assert r.redact(escaped) == (shown, 1), at


def _every_character_escaped(text: str) -> str:
    return "".join(f"%{ord(ch):02X}" for ch in text)


def test_an_openapi_reason_cut_where_the_program_puts_an_escaped_credential_shows_none_of_it() -> None:
    """The error reason is read 4,096 characters far (plus the longest spelling) and collapsed, so a
    program that pads the value a backend quotes before the credential with spaces moves the
    credential to the end of what is read. A backend that escapes every character of it
    (``%73%6B%5F...``, three characters for one) then had it cut inside the window: before (found
    by a review) the reason showed all of the credential but its last characters, escaped."""
    from codemode_capabilities.openapi.calls import reason

    value = CREDENTIALS["vendor"]
    r = Redactor([value])
    escaped = _every_character_escaped(value)
    for pad in range(4096 - len(escaped) - 4, 4096 + 2):
        said = " " * pad + "key " + escaped + " refused"
        response = httpx.Response(400, json={"detail": said})
        shown, _ = reason(response, response.content, r)
        assert not _pieces(value) & _pieces(unquote(shown)), (pad, shown)


# ------------------------------------------ escapes no whole spelling has (last gap)

ESCAPED = "Token Kq7&zR/p+W x=d1lwinj1Yybf"  # a space, and characters every encoding escapes


def _unicode(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


#: Escapings of every character that no encoding of the whole value gives.
ESCAPINGS: dict[str, Callable[[str], str]] = {
    "json-unicode": _unicode,
    "html-decimal": lambda t: "".join(f"&#{ord(c)};" for c in t),
    "html-hex": lambda t: "".join(f"&#X{ord(c):x};" for c in t),
    "html-padded": lambda t: "".join(f"&#{ord(c):07d};" for c in t),
    "percent-json": lambda t: quote(_unicode(t), safe=""),
    "html-json": lambda t: "".join(f"&#92;u{ord(c):04x}" for c in t),
    "json-json": lambda t: _unicode(t).replace("\\", "\\\\"),
    "form": lambda t: "".join("+" if c == " " else f"%{ord(c):02x}" for c in t),
}


def _shows_none_of(shown: str, value: str) -> bool:
    token = value.partition(" ")[2] or value
    return not _pieces(token.replace("+", " ")) & _pieces(read_out(shown))


def _reason(text: str, r: Redactor) -> str:
    from codemode_capabilities.openapi.calls import reason

    response = httpx.Response(400, json={"detail": text})
    return reason(response, response.content, r)[0]


@pytest.mark.parametrize("how", sorted(ESCAPINGS))
def test_a_credential_echoed_with_every_character_escaped_shows_none_of_it(how: str) -> None:
    """Before, none of these was a spelling: the text came back as it was (and an OpenAPI reason
    showed its first 120 characters, the credential's first characters among them)."""
    r = Redactor([ESCAPED])
    for echoed in (ESCAPINGS[how](ESCAPED), ESCAPINGS[how](ESCAPED.partition(" ")[2])):
        text = f"key {echoed} refused"
        shown, count = r.redact(text)
        assert (shown, count) == ("key [redacted] refused", 1), (how, shown)
        assert _reason(text, r) == "key [redacted] refused", how
        seen = upstream_error_text("api", text, secrets=[ESCAPED])
        assert "[redacted]" in seen and _shows_none_of(seen, ESCAPED), (how, seen)


@pytest.mark.parametrize("how", sorted(ESCAPINGS))
def test_no_part_of_an_escaped_credential_changes_what_the_client_sees(how: str) -> None:
    """Decoding adds views, never a rule for parts: a part of the escaped credential comes back as
    it would with no credential configured, and takes as many Python steps as the same escaping of
    another string of its shape (the views' work is the text's, never the credential's)."""
    r, nothing = Redactor([ESCAPED]), Redactor([])
    token = ESCAPED.partition(" ")[2]
    checked = 0
    for part in {token[:n] for n in range(1, len(token))} | {token[n:] for n in range(1, len(token))}:
        text = f"key {ESCAPINGS[how](part)} refused"
        other = f"key {ESCAPINGS[how](_look_alike(part))} refused"
        assert r.redact(text) == (text, 0), (how, part)
        assert _reason(text, r) == _reason(text, nothing), (how, part)
        assert upstream_error_text("api", text, secrets=[ESCAPED]) == upstream_error_text("api", text)
        if len(text) == len(other):
            assert _redact_steps(r, text) == _redact_steps(r, other), (how, part)
            checked += 1
    assert checked > 20


def _cut_probes(value: str) -> list[str]:
    """The credential with every character a character reference padded with zeros: its first 12
    ten characters long (what a client is shown holds them whole), the others 300 (longer than the
    window read past what is kept), after padding that the reason's whitespace collapse removes, so
    that it starts anywhere near the end of what is kept."""
    padded = "".join(f"&#{ord(c):0{7 if i < 12 else 297}d};" for i, c in enumerate(value))
    return [" " * pad + "key " + padded + " refused" for pad in (0, 100, 3000, 3900, 4000, 4090, 5000)]


def test_an_openapi_reason_cut_inside_a_credential_longer_than_what_is_read_shows_none_of_it() -> None:
    """An escape can be as long as a backend likes (``&#000...0115;``), so a spelling that starts in
    what is kept can end past what is read. Before, the reason showed the references of the
    credential's first characters; now what starts where the last 1,024 characters of the most
    decoded view begin is dropped, for any credential alike."""
    value = CREDENTIALS["vendor"]
    r = Redactor([value])
    for text in _cut_probes(value):
        shown = _reason(text, r)
        assert _shows_none_of(shown, value), shown[:80]
    for text in _cut_probes(_look_alike(value)):  # where the cut falls is the text's alone
        assert _reason(text, r) == _reason(text, Redactor([])) == _reason(text, Redactor(OTHER_CREDENTIALS))


def _nested(text: str, times: int) -> str:
    for _ in range(times):
        text = quote(text, safe="")
    return text


def test_escapes_nested_deeper_than_the_views_decode_show_nothing() -> None:
    """A value percent-encoded seven times is still escaped in the fourth view: the reason is then not
    shown at all (with a credential configured or not), nor an upstream error text whose normal
    form (three rounds of percent-decoding already) is still escaped in the fourth view (eight
    times); four times is found and redacted. Five and six times are found too (each view is read
    once more with its ``%XX`` decoded; the token has no character to escape), and whether the rest
    settles is read on the redacted text (on the text as sent, a
    credential's first characters decided it)."""
    value = CREDENTIALS["bearer"]
    r = Redactor([value])
    deep = f"key {_nested(value, 7)} refused"
    assert _reason(deep, r) == "" == _reason(deep, Redactor([]))
    for times in (5, 6):
        assert _reason(f"key {_nested(value, times)} refused", r) == "key [redacted] refused"
    deeper = f"key {_nested(value, 8)} refused"
    assert upstream_error_text("api", deeper, secrets=[value]) == "" == upstream_error_text("api", deeper)
    four = f"key {_nested(value, 4)} refused"
    assert _reason(four, r) == "key [redacted] refused"
    assert upstream_error_text("api", four, secrets=[value]) == "api: key [redacted] refused"


def test_the_views_take_no_python_step_for_each_escape() -> None:
    """A backend that returns what a program stored hands the host a text the program chose: a
    Python step for each escape made a megabyte of ``%41`` take 15.6 s of the host's loop against
    0.9 s without the views (the first version of the views, on this loaded machine); split by the
    regular expression, each distinct escape decoded once and the map made with numpy, the steps
    are the same for 1,000 escapes as for 60,000 (and the megabyte took 2.3 s)."""
    r = Redactor([CREDENTIALS["vendor"]])
    few, many = "%41&amp;\\u0042" * 50, "%41&amp;\\u0042" * 3000
    assert len(many) < 65536  # one part of the scan (more parts take a few steps more each)
    assert _redact_steps(r, few) == _redact_steps(r, many)
