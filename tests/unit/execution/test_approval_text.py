"""The rendering of a call's arguments for the user who approves it
(docs/reference/authorization.md#asking-the-user): nothing a program writes can pass for the
rendering's syntax, nothing is hidden without saying exactly how much, every script stays readable.
The attacks through the MCP client are tests/integration/mcp/test_approval_rendering.py.
"""

from __future__ import annotations

import json
import re
import sys
import unicodedata

import pytest

from codemode.execution.approval import MAX_MESSAGE_BYTES, ApprovalRequest
from codemode.execution.approval_text import MAX_ARGUMENTS_TEXT, lookalike, render_arguments

CUT = re.compile(r"… \[([\d,]+) bytes not shown\]$")

#: Characters that read as a quotation mark, a bracket or a separator (a hand-made list, beyond the
#: categories: primes, ditto marks, modifier letters, fullwidth and small forms, ornaments, and the
#: comma, colon and equals look-alikes of other scripts).
LOOKALIKES = (
    "\u201c\u201d\u201e\u201f\u2018\u2019\u201a\u201b\u00ab\u00bb\u2039\u203a\u300c\u300d\u300e\u300f"
    "\u301d\u301e\u301f\u2033\u2036\u2034\u2032\u2035\u02ba\u02b9\u02bb\u02bc\u02c8\u02dd\u02ee\u3003"
    "\u05f4\u05f3\u055a\u055d\uff02\uff07\u275b\u275c\u275d\u275e\U0001f676\U0001f677\U0001f678\u00b4"
    "\u0374\u1fef\u1ffd\u1fbd\u1fbf\u1ffe"
    "\uff0c\ufe50\ufe51\ufe10\ufe11\u060c\u3001\u00b8\u060d\u066b\u066c\u2e32\u2e34\u2e41\ua4f9"
    "\uff1a\ufe55\ufe13\u2236\ua789\u02d0\u02f8\u0589\u05c3\u0703\u0704\u16ec\u1803\u1804\u1809\u205a"
    "\u205d\ufe30\ua4fd\u1361"
    "\uff1d\ufe66\u207c\u208c\ua78a\u1400\u2e40\u30a0\u2e17\u2550\ua4ff\u2a75"
    "\uff3b\uff3d\uff5b\uff5d\uff08\uff09\u2774\u2775\u2768\u2769\u3014\u3015\ufd3e\ufd3f\U0001d114"
    "\u2045\u2046\u23a1\u23a4\u23a7\u23ab\u239b\u239e"
    "\uff3c\ufe68\u2216\u29f5\u29f9\u27cd"
    "\u2026\u22ef\ufe19\u1801"
    # found by the review: a Vedic sign drawn as two ticks (confusable with ''), the
    # halfwidth voiced sound marks outside halfwidth katakana (drawn as " and °), a double backslash
    "\u1cd3\uff9e\uff9f\u244a"
)

#: Values in many scripts, shown as they are (right-to-left ones inside an isolate).
READABLE = (
    "Grüße aus Köln, Ærøskøbing: Ça va? Șase țări",
    "Привет, мир: всё хорошо",
    "Καλημέρα κόσμε",
    "你好，世界"[:2] + "世界",
    "コーヒーを飲みます",
    "안녕하세요 세계",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "שלום עולם",
    "مرحبا بالعالم",
    "don't stop",
    "price: 5 €, 10 $, ¥20 — 50% off (today) [really] {yes}",
    "emoji 🎉👍🏽❤️",
    "ｶﾞｲﾄﾞﾌﾞｯｸ ﾊﾟﾝ",
)


def shown(value: str) -> str:
    """The rendering of one string value, between its quotes and any isolate."""
    text = render_arguments({"v": value}, limit=10**8).text
    assert text.startswith('v: "') and text.endswith('"'), text
    return text[4:-1].removeprefix("\u2068").removesuffix("\u2069")


@pytest.mark.parametrize("ch", list(LOOKALIKES), ids=lambda c: f"U+{ord(c):04X}")
def test_a_lookalike_is_escaped_in_a_value_and_in_a_nested_key(ch: str) -> None:
    escaped = json.dumps(ch, ensure_ascii=True)[1:-1]
    assert shown(f"a{ch}b") == f"a{escaped}b"
    text = render_arguments({"v": {f"k{ch}": [f"x{ch}"]}}).text.replace("\u2068", "").replace("\u2069", "")
    assert ch not in text and f'"k{escaped}"' in text and f'"x{escaped}"' in text


def test_no_quotation_mark_bracket_line_break_or_lookalike_is_ever_shown_as_itself() -> None:
    """Every character of Unicode, after a letter: what is shown as itself is no quotation mark or
    bracket (Pi, Pf, Ps, Pe), cannot break the line, and does not become the rendering's syntax
    under compatibility normalization; a combining mark is never shown on a quote or a space."""
    syntax = set("\"'(),:=[\\]{}`")
    every = [chr(cp) for cp in range(0x80, sys.maxunicode + 1) if chr(cp).isprintable()]
    unprintable = "".join(chr(cp) for cp in range(0x80, 0x3000) if not chr(cp).isprintable())
    assert not set(shown(unprintable)) & set(unprintable), "a character that is not printable shown"
    raw: set[str] = set()
    for start in range(0, len(every), 4096):
        chunk = "".join("a" + ch for ch in every[start : start + 4096])
        raw |= set(render_arguments({"v": chunk}, limit=10**8).text)
    raw -= {"\u2068", "\u2069"}
    assert raw, "nothing shown as itself: the check would prove nothing"
    for ch in raw - set(map(chr, range(0x80))):
        cp, category = ord(ch), unicodedata.category(ch)
        assert ch.isprintable(), f"U+{cp:04X} shown raw but not printable"
        assert category not in ("Pi", "Pf", "Ps", "Pe"), f"U+{cp:04X}"
        assert not syntax & set(unicodedata.normalize("NFKC", ch)), f"U+{cp:04X}"
        name = unicodedata.name(ch, "")
        assert "QUOTATION" not in name and "APOSTROPHE" not in name and "PRIME" not in name, name
    marks = "".join(ch for ch in every if unicodedata.category(ch).startswith("M"))
    assert not set(shown(marks)) & set(marks), "a mark at the start of a string sits on its quote"
    assert not set(shown(" ".join(marks))) & set(marks), "a mark on a space"


@pytest.mark.parametrize("value", READABLE)
def test_every_script_stays_readable(value: str) -> None:
    text = shown(value)
    if any(unicodedata.bidirectional(c) in ("R", "AL") for c in value):
        assert render_arguments({"v": value}).text == f'v: "\u2068{value}\u2069"'
    assert text == value.replace("，", "\\uff0c")


def test_two_apostrophes_that_read_as_a_quote_are_escaped() -> None:
    assert shown("it's") == "it's"
    assert shown("home'',''paid") == "home\\u0027\\u0027,\\u0027\\u0027paid"
    assert shown("``quoted") == "\\u0060\\u0060quoted"


#: Letters and marks drawn as an apostrophe (Unicode's confusables of ``'``): the saltillo, the
#: West-Cree P, the runic short-twig-sol, the Armenian half ring and emphasis mark, the Miao signs,
#: the comma above right. Alone each is shown; two side by side read as a quotation mark.
APOSTROPHE_LIKE = "\ua78c\ua78b\u144a\u16cc\u0559\u055b\U00016f51\U00016f52\u0315"


@pytest.mark.parametrize("ch", list(APOSTROPHE_LIKE), ids=lambda c: f"U+{ord(c):04X}")
def test_two_apostrophe_lookalikes_side_by_side_are_escaped(ch: str) -> None:
    escaped = json.dumps(ch, ensure_ascii=True)[1:-1]
    assert shown(f"milk{ch}s") == f"milk{ch}s", "one alone is a letter or a mark: shown"
    for pair in (ch + ch, ch + "'", "'" + ch, ch + "\ua78c"):
        text = shown(f"Buy milk{pair}, body={pair}wire")
        assert not set(pair) & set(text), text
    assert shown(f"milk{ch}{ch}") == f"milk{escaped}{escaped}"


#: Printable characters drawn as nothing or as a blank: the Hangul fillers, the braille blank, the
#: musical null notehead, and the default-ignorable marks (combining grapheme joiner, Khmer inherent
#: vowels, Mongolian and other variation selectors, the Khitan filler).
INVISIBLE = (
    "\u115f\u1160\u3164\uffa0\u2800\U0001d159\U00016fe4"
    "\u034f\u17b4\u17b5\u180b\u180c\u180d\u180f\ufe00\ufe0e\ufe0f\U000e0100\U000e01ef"
)


@pytest.mark.parametrize("ch", list(INVISIBLE), ids=lambda c: f"U+{ord(c):04X}")
def test_an_invisible_character_is_escaped(ch: str) -> None:
    """ "to" and "to" with an invisible character look the same: a nested object showing
    ``{"amount":5000,"amount":5}`` would hide which one the handler reads."""
    assert ch not in shown(f"to{ch}") and ch not in shown(f"\u00e9{ch}") and ch not in shown(f"{ch}x")
    text = render_arguments({"v": {"amount": 5000, f"amount{ch}": 5}}).text
    escaped = json.dumps(ch, ensure_ascii=True)[1:-1]
    assert text == f'v: {{"amount":5000,"amount{escaped}":5}}'
    # nor can a mark sit on it: a double vertical line above a blank reads as a quotation mark
    assert shown(f"milk{ch}\u030e") == f"milk{escaped}\\u030e"


def test_an_emoji_keeps_its_presentation_selector() -> None:
    assert shown("\u2764\ufe0f \u263a\ufe0e \u00a9\ufe0f") == "\u2764\ufe0f \u263a\ufe0e \u00a9\ufe0f"
    assert shown("\u2764\ufe0f\ufe0f") == "\u2764\ufe0f\\ufe0f", "one selector per character"
    assert shown("a\ufe0f") == "a\\ufe0f", "no emoji there: the selector changes nothing visible"


def test_a_kana_voicing_mark_is_shown_only_on_kana() -> None:
    """A voiced sound mark (゛, combining) drawn beside a Latin letter reads as a closing quote."""
    assert shown("Buy milk\u3099, body: wire") == "Buy milk\\u3099, body: wire"
    assert shown("caf\u00e9\u309a") == "caf\u00e9\\u309a"
    assert shown("\u304b\u3099\u30cf\u309a\uff8a\u309a") == "\u304b\u3099\u30cf\u309a\uff8a\u309a"


def test_a_character_carries_at_most_four_marks() -> None:
    """Marks stacked without bound spill over the lines above and below (and can hide them); real
    text stacks a few (Vietnamese two, pointed and accented Hebrew four)."""
    text = shown("a" + "\u0336\u0301" * 50 + " b\u0301")
    assert text == "a" + "\u0336\u0301" * 2 + "\\u0336\\u0301" * 48 + " b\u0301"
    assert shown("\u05e9\u05c1\u05bc\u05b8\u05a3") == "\u05e9\u05c1\u05bc\u05b8\u05a3"
    assert shown("Vie\u0302\u0323t") == "Vie\u0302\u0323t"


def test_a_double_yod_among_latin_text_is_escaped() -> None:
    """Two yods, or the Yiddish double yod, are drawn as ``"``. Right-to-left isolation does not help
    when the rest of the value is Latin (the isolate is then left-to-right), so among ASCII letters
    they are escaped; in Hebrew and Yiddish text they stay."""
    for quote in ("\u05f2", "\u05d9\u05d9"):
        text = shown(f"Buy milk{quote}, body={quote}wire 5000 EUR")
        assert quote not in text, text
        assert shown("milk\u05d9s") == "milk\u05d9s", "one yod alone is a letter: shown"
    hebrew = (
        "\u05e2\u05e0\u05d9\u05d9\u05df, \u05d9\u05d9\u05ea\u05db\u05df: \u05f2\u05b4\u05d3\u05d9\u05e9 5"
    )
    assert shown(hebrew) == hebrew


def test_a_value_cannot_make_a_line_of_its_own() -> None:
    for brk in ("\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"):
        text = render_arguments({"title": f"a{brk}body: x", "body": "y"}).text
        assert text.count("\n") == 1 and brk not in text.replace("\n", "", 1), repr(text)


def test_a_call_that_fits_is_shown_whole() -> None:
    arguments = {"id": 7, "title": "t" * 1000, "tags": ["a", "b"], "meta": {"k": None, "n": 1.5, "ok": True}}
    rendering = render_arguments(arguments)
    assert rendering.hidden == 0
    assert rendering.text.split("\n") == [
        f"{k}: {json.dumps(v, separators=(',', ':'))}" for k, v in arguments.items()
    ]


def test_a_long_call_is_cut_fairly_and_says_exactly_how_much_it_hides() -> None:
    arguments = {"id": 7, "title": "short", "body": "b" * 20_000, "note": "n" * 3_000, "tags": ["x"] * 50}
    rendering = render_arguments(arguments)
    assert len(rendering.text.encode()) <= MAX_ARGUMENTS_TEXT
    lines = dict(line.split(": ", 1) for line in rendering.text.split("\n"))
    assert lines["id"] == "7" and lines["title"] == '"short"'
    assert lines["tags"] == json.dumps(["x"] * 50, separators=(",", ":")), "a value within its share is whole"
    total = 0
    for key in ("body", "note"):
        cut = CUT.search(lines[key])
        assert cut is not None, lines[key]
        whole = json.dumps(arguments[key])
        visible = lines[key][: cut.start()]
        assert whole.startswith(visible) and len(visible) > 1000
        hidden = int(cut.group(1).replace(",", ""))
        assert hidden == len(whole) - len(visible)
        total += hidden
    assert rendering.hidden == total


def test_a_cut_never_splits_an_escape() -> None:
    rendering = render_arguments({"body": "\u201c" * 5000})
    (line,) = rendering.text.split("\n")
    cut = CUT.search(line)
    assert cut is not None
    visible = line[len('body: "') : cut.start()]
    assert re.fullmatch(r"(\\u201c)+", visible), visible[-20:]
    # the hidden bytes are the value's own (compact JSON, UTF-8: three for each mark), not the escapes'
    assert rendering.hidden == len(json.dumps("\u201c" * 5000, ensure_ascii=False).encode()) - 1 - 3 * (
        len(visible) // 6
    )


def test_too_many_arguments_are_counted_not_dropped_silently() -> None:
    arguments = {f"a{n}": "y" * 100 for n in range(200)}
    rendering = render_arguments(arguments)
    assert len(rendering.text.encode()) <= MAX_ARGUMENTS_TEXT
    lines = rendering.text.split("\n")
    last = re.fullmatch(r"… \[([\d,]+) more arguments, ([\d,]+) bytes, not shown\]", lines[-1])
    assert last is not None, lines[-1]
    kept = len(lines) - 1
    assert int(last.group(1)) == 200 - kept and kept > 10
    dropped = (200 - kept) * 102  # each value's compact JSON
    assert int(last.group(2).replace(",", "")) == dropped
    cuts = [CUT.search(line) for line in lines[:-1]]
    per_value = sum(int(cut.group(1).replace(",", "")) if cut else 0 for cut in cuts)
    assert all(cuts)
    assert rendering.hidden == per_value + dropped


def test_the_question_says_in_its_first_line_when_part_of_the_call_is_hidden() -> None:
    whole = ApprovalRequest("records.delete", "Delete one record.", "id: 1")
    assert whole.message.split("\n")[0].startswith("A program running for you")
    rendering = render_arguments({"body": "x" * 100_000})
    cut = ApprovalRequest("records.update", "s" * 10_000, rendering.text, rendering.hidden)
    first = cut.message.split("\n")[0]
    assert first.startswith(f"This call is too long to show whole: {rendering.hidden:,} bytes")
    assert len(cut.message.encode()) <= MAX_MESSAGE_BYTES
    assert ApprovalRequest("util.now", "The time.", "").message.count("Arguments: none\n") == 1


def test_a_top_level_key_that_is_not_a_plain_name_is_quoted() -> None:
    assert render_arguments({"to\u201d": 1, "ok": 2}).text == '"to\\u201d": 1\nok: 2'
    assert lookalike("a") is False and lookalike("\u201c") is True


def test_right_to_left_text_is_isolated_and_the_isolate_ends_before_a_cut() -> None:
    every = "".join(
        chr(cp) for cp in range(sys.maxunicode + 1) if unicodedata.bidirectional(chr(cp)) in ("R", "AL", "AN")
    )
    for start in range(0, len(every), 512):
        text = render_arguments({"v": f"x{every[start : start + 512]}y"}, limit=10**8).text
        assert text.startswith('v: "\u2068x') and text.endswith('y\u2069"'), every[start]
    rendering = render_arguments({"v": "שלום " * 2000})
    assert rendering.text.startswith('v: "\u2068שלום') and "\u2069… [" in rendering.text


def test_a_long_number_is_cut_like_a_string() -> None:
    number = int("7" * 4000)
    rendering = render_arguments({"id": 1, "n": number, "s": "x" * 4000})
    line = rendering.text.split("\n")[1]
    cut = CUT.search(line)
    assert cut is not None and line.startswith("n: 777") and len(line) > 1000
    assert int(cut.group(1).replace(",", "")) == 4000 - len(line[len("n: ") : cut.start()])
