"""How the host shows a call's bound arguments to the user it asks
(docs/reference/authorization.md#asking-the-user, "What the user sees").

The values are the program's, so nothing in them may look like the rendering's own syntax:

- one argument per line, ``name: value``, the value as JSON; every character that is not printable
  is escaped, so a value cannot make a line of its own;
- inside a string (a value, an element, a key of a nested object) a character that could pass for
  a quotation mark, a bracket or a separator is escaped as ``\\uXXXX`` (:func:`lookalike`: Unicode's
  categories Pi, Pf, Ps, Pe, modifier symbols and letters, compatibility forms of the syntax, names
  such as QUOTATION or COMMA, a short list of others); so is a run of two apostrophes or letters
  drawn as one (``''`` and ``ꞌꞌ`` read as ``"``), a character drawn as nothing or as a blank
  (a Hangul filler, a variation selector), and a combining mark that does not follow a character
  shown as itself, the fifth mark on one character, or a kana voicing mark on a letter that is not
  kana. Letters and digits of every script stay as they are, so a non-Latin value stays readable;
- a string holding right-to-left text is wrapped in a first-strong isolate (U+2068 … U+2069), so
  it cannot reorder the rendering around it;
- a call whose lines fit in :data:`MAX_ARGUMENTS_TEXT` bytes is shown whole; a longer one is cut,
  each cut value ending with ``… [N bytes not shown]`` (N: bytes of its compact JSON), and
  :class:`Rendering` says how many bytes are hidden in all (the question then says so in its first
  line).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = ["MAX_ARGUMENTS_TEXT", "Rendering", "lookalike", "render_arguments"]

#: UTF-8 bytes of all the argument lines together; a call that needs more is cut.
MAX_ARGUMENTS_TEXT = 4000
#: The fewest bytes of a value shown when a call is cut (before its note).
_MIN_SHOWN = 24
#: Bytes kept for a cut value's ``… [N bytes not shown]`` (N up to ten digits with commas).
_NOTE_ROOM = 40
_CUT = "…"
_FSI, _PDI = "\u2068", "\u2069"

#: What a look-alike may not pass for: the rendering's ASCII syntax and the quote-like ASCII marks.
_SYNTAX = frozenset("\"'(),:=[\\]{}`")
#: What reads as an apostrophe: shown as itself alone, escaped in a run of two or more (``''`` reads
#: as ``"``). The ASCII ones, and the letters and marks Unicode lists as confusable with ``'``: the
#: saltillo, the West-Cree P, the runic short-twig-sol, the Armenian half ring and emphasis mark, the
#: Miao signs, the combining comma above right. (The Hebrew yod is not here: its pairs spell
#: Hebrew words, and right-to-left text is isolated.)
_APOSTROPHES = frozenset("'`\ua78b\ua78c\u144a\u16cc\u0559\u055b\U00016f51\U00016f52\u0315")
#: Words of a character's Unicode name that make it a look-alike (whole words: a semicolon is not
#: a colon).
_NAMED = re.compile(
    r"\b(QUOTATION|APOSTROPHE|PRIME|DITTO|GERESH|GERSHAYIM|COMMA|COLON|EQUALS|ELLIPSIS|BRACKET"
    r"|PARENTHESIS|BRACE|REVERSE SOLIDUS|BACKSLASH|SET MINUS|DOUBLE HYPHEN)\b"
)
#: Look-alikes that none of the rules above catches: of a comma, a colon or an equals sign; the
#: Vedic sign nihshvasa (two ticks, confusable with ``''``); the halfwidth katakana voiced sound
#: marks (drawn as ``"`` and ``°``; shown as themselves only on a halfwidth katakana letter).
_OTHERS = frozenset(
    "\u0589\u05c3\u060d\u066b\u066c\u1361\u1400\u16ec\u1803\u1809\u205a\u205d\u205e\u2236"
    "\u2550\u268c\u27cd\u2e17\u3013\u31d4\ufe30\u1cd3\uff9e\uff9f"
    + "".join(map(chr, range(0xA4F8, 0xA500)))  # Lisu tone letters and punctuation
)
#: The emoji skin-tone modifiers (modifier symbols that only change an emoji's colour).
_SKIN_TONES = frozenset(map(chr, range(0x1F3FB, 0x1F400)))
_HALFWIDTH_VOICING = frozenset("\uff9e\uff9f")
#: Printable characters drawn as nothing or as a blank, always escaped (``"to"`` and ``"to"`` with
#: one of them look the same, and a mark on a blank stands alone): the Hangul fillers, the braille
#: blank, the musical null notehead, the Khitan filler, and the default-ignorable marks (combining
#: grapheme joiner, Khmer inherent vowels, the Mongolian and the other variation selectors but the
#: two emoji presentation selectors, below).
_INVISIBLE = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u2800\u3164\uffa0\U00016fe4\U0001d159"
    + "".join(map(chr, range(0xFE00, 0xFE0E)))
    + "".join(map(chr, range(0xE0100, 0xE01F0)))
)
#: The text and emoji presentation selectors: shown as themselves only right after a symbol (``❤️``).
_PRESENTATION = frozenset("\ufe0e\ufe0f")
#: The Hebrew yod and the Yiddish double yod: two yods side by side, or the ligature, are drawn as
#: ``"``. Escaped in a string that holds an ASCII letter (a fake argument needs them, and the
#: isolate then runs left to right, as such a fake needs); in Hebrew and Yiddish text they stay.
_YODS = frozenset("\u05d9\u05f2")
_ASCII_LETTER = re.compile("[A-Za-z]")
#: The combining voiced sound marks (drawn beside their letter: on a Latin one they read as ``"``),
#: shown as themselves only on kana.
_KANA_VOICING = frozenset("\u3099\u309a")
_KANA = re.compile("[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9d\U0001b000-\U0001b16f]")
#: Marks shown on one character at most (more are escaped): stacked without bound they spill over
#: the lines above and below; real text stacks a few (Vietnamese two, accented Hebrew four).
_MAX_MARKS = 4
_LETTERS_AND_DIGITS = frozenset({"Lu", "Ll", "Lt", "Lo", "Nd", "Nl", "No"})


@lru_cache(maxsize=4096)
def lookalike(ch: str) -> bool:
    """Whether ``ch``, shown inside a string, could pass for a quotation mark, a bracket or a
    separator of the rendering (then it is escaped). ASCII is never a look-alike: it is shown as
    JSON shows it.

    Args:
        ch: one character.

    Returns:
        True for a non-ASCII quotation mark, bracket, separator, their look-alikes, and every
        modifier letter or modifier symbol.
    """
    if ch.isascii():
        return False
    category = unicodedata.category(ch)
    if category in ("Pi", "Pf", "Ps", "Pe") or ch in _OTHERS:
        return True
    if (category == "Sk" and ch not in _SKIN_TONES) or (category == "Lm" and 0x2B0 <= ord(ch) <= 0x2FF):
        return True  # accents, tone and phonetic marks standing alone: ´ ˝ ˈ ʺ ː ꞉ ꞊
    compat = unicodedata.normalize("NFKC", ch)
    if compat != ch and any(c in _SYNTAX or lookalike(c) for c in compat):
        return True
    if category in _LETTERS_AND_DIGITS:
        return False  # a letter named "... WITH COMMA BELOW" is a letter
    return _NAMED.search(unicodedata.name(ch, "")) is not None


def _escape(ch: str) -> str:
    """``ch`` as a JSON escape: ``\\"``, ``\\n`` and the like, else ``\\uXXXX`` (a surrogate pair
    beyond the BMP)."""
    if ch in '"\\' or ord(ch) < 0x20:
        return json.dumps(ch)[1:-1]
    data = ch.encode("utf-16-be")
    return "".join(f"\\u{int.from_bytes(data[i : i + 2], 'big'):04x}" for i in range(0, len(data), 2))


#: Where right-to-left text lives (the default bidirectional class of these blocks is R, AL or AN;
#: a test checks every such character is inside).
_RTL = re.compile("[\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufefc\U00010800-\U00010fff\U0001e800-\U0001efff]")

#: One shown piece of a value: its text, and the UTF-8 bytes of the value's compact JSON it stands for.
_Token = tuple[str, int]


def _json_size(ch: str) -> int:
    """UTF-8 bytes of ``ch`` inside a compact JSON string (``json.dumps(..., ensure_ascii=False)``)."""
    if ch in '"\\':
        return 2
    if ord(ch) < 0x20:
        return 2 if ch in "\b\f\n\r\t" else 6
    return len(ch.encode("utf-8"))


def _paired(text: str, i: int, pairs: frozenset[str] = _APOSTROPHES) -> bool:
    """``text[i]`` is an apostrophe (of ``pairs``) beside another one (the two read as ``"``)."""
    return text[i] in pairs and ((i > 0 and text[i - 1] in pairs) or text[i + 1 : i + 2] in pairs)


def _double_yod(text: str, i: int) -> bool:
    """``text[i]`` is the Yiddish double yod, or a yod beside another."""
    return text[i] == "\u05f2" or _paired(text, i, _YODS)


def _escaped_here(text: str, i: int, latin: bool) -> bool:
    """``text[i]`` is escaped whatever precedes it: JSON's own escapes, what is not printable or is
    drawn as nothing, an apostrophe beside another, a double yod among ASCII letters (``latin``)."""
    ch = text[i]
    return (
        ch in '"\\'
        or ch in _INVISIBLE
        or not ch.isprintable()
        or _paired(text, i)
        or (latin and _double_yod(text, i))
    )


def _string_tokens(text: str) -> Iterator[_Token]:
    """A JSON string as shown: one token per character (a cut falls only between them)."""
    isolate = _RTL.search(text) is not None  # right-to-left text cannot reorder what is around it
    yield ('"' + _FSI if isolate else '"'), 1
    previous_raw = False  # the previous character is shown as itself and carries a mark well
    symbol = False  # the previous character is a symbol shown as itself (a presentation selector's)
    base, marks = "", 0  # the last character that is not a mark, and the marks after it
    latin = isolate and _ASCII_LETTER.search(text) is not None  # a double yod would read as a quote
    for i, ch in enumerate(text):
        category = unicodedata.category(ch)
        mark = category[0] == "M"
        marks = marks + 1 if mark else 0
        if _escaped_here(text, i, latin):
            raw = False
        elif ch in _PRESENTATION:
            raw = symbol
        elif mark:
            raw = (
                previous_raw and marks <= _MAX_MARKS and (ch not in _KANA_VOICING or bool(_KANA.match(base)))
            )
        elif ch in _HALFWIDTH_VOICING:
            raw = previous_raw and "\uff66" <= text[i - 1] <= "\uff9d"  # on a halfwidth katakana letter
        else:
            raw = not lookalike(ch)
        yield (ch if raw else _escape(ch)), _json_size(ch)
        previous_raw = raw and (not ch.isascii() or ch.isalnum())
        symbol = raw and not ch.isascii() and category[0] == "S"
        base = base if mark else ch
    yield (_PDI + '"' if isolate else '"'), 1


def _tokens(value: Any) -> Iterator[_Token]:
    """``value`` as compact JSON, in tokens: each character of a string or a number, each piece of
    syntax."""
    if isinstance(value, str):
        yield from _string_tokens(value)
    elif isinstance(value, dict):
        yield "{", 1
        for n, (key, item) in enumerate(value.items()):
            if n:
                yield ",", 1
            yield from _string_tokens(str(key))
            yield ":", 1
            yield from _tokens(item)
        yield "}", 1
    elif isinstance(value, list | tuple):
        yield "[", 1
        for n, item in enumerate(value):
            if n:
                yield ",", 1
            yield from _tokens(item)
        yield "]", 1
    else:  # a number, true, false, null: ASCII, cut anywhere
        for ch in json.dumps(value, allow_nan=False):
            yield ch, 1


def _json_bytes(value: Any) -> int:
    """UTF-8 bytes of ``value``'s compact JSON: the measure of ``max_value_bytes``."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def _key(key: str) -> str:
    """A top-level key as shown: bare when it is a plain identifier, else a JSON string."""
    if key.isidentifier() and key.isascii():
        return key
    return "".join(token for token, _ in _string_tokens(key))


@dataclass(frozen=True)
class Rendering:
    """``text``: the argument lines the user reads (``name: value``, one per line); ``hidden``: the
    UTF-8 bytes of the arguments' compact JSON they leave out (0: the call is shown whole)."""

    text: str
    hidden: int


class _Line:
    """One argument's line, its value read lazily: at most as many tokens as a question can show."""

    def __init__(self, key: str, value: Any) -> None:
        self.head = _key(key) + ": "
        self.value = value
        self.stream = _tokens(value)
        self.tokens: list[_Token] = []
        self.shown = 0  # bytes of the tokens read so far
        self.ended = False

    def size(self, cap: int) -> int:
        """The value's shown size, read no further than ``cap`` bytes past which it does not matter."""
        while not self.ended and self.shown <= cap:
            token = next(self.stream, None)
            if token is None:
                self.ended = True
            else:
                self.tokens.append(token)
                self.shown += len(token[0].encode("utf-8"))
        return self.shown

    def whole(self) -> str:
        return self.head + "".join(token for token, _ in self.tokens)

    def cut(self, room: int) -> tuple[str, int]:
        """The line with its value in at most ``room`` bytes, then its note; the bytes it hides."""
        self.size(room)
        shown, used, covered = [], 0, 0
        for token, measure in self.tokens:
            size = len(token.encode("utf-8"))
            if used + size > room:
                break
            shown.append(token)
            used += size
            covered += measure
        text = "".join(shown)
        if text.rfind(_FSI) > text.rfind(_PDI):
            text += _PDI  # the cut string's isolate ends before the host's note
        hidden = _json_bytes(self.value) - covered
        return f"{self.head}{text}{_CUT} [{hidden:,} bytes not shown]", hidden


def _share(lines: list[_Line], budget: int) -> int:
    """The fair share: the largest ``t`` with every value shown whole if it needs at most ``t``
    bytes, the others cut to ``t`` (note included), all within ``budget``. Values are read only as
    far as the search needs (about twice the share each)."""

    def used(t: int) -> int:
        return sum(min(line.size(t), t) for line in lines)

    low = max(budget // len(lines), _MIN_SHOWN + _NOTE_ROOM)  # the caller left room for this much
    high = low
    while used(high) <= budget:
        if high >= budget:
            return high
        low, high = high, min(2 * high, budget)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if used(middle) <= budget else (low, middle)
    return low


def render_arguments(arguments: dict[str, Any], limit: int = MAX_ARGUMENTS_TEXT) -> Rendering:
    """The bound arguments as the host shows them, in the capability's order (bounded).

    Args:
        arguments: the bound canonical arguments.
        limit: UTF-8 bytes of all the lines together, their ``\\n`` included.

    Returns:
        The lines, and the bytes they leave out: 0 when the whole call fits in ``limit``; otherwise
        each value too long for its share ends with ``… [N bytes not shown]`` (N: UTF-8 bytes of
        its compact JSON left out) and, when even that leaves no room, the last line says how many
        more arguments, and bytes of their values, are not shown.
    """
    lines = [_Line(str(key), value) for key, value in arguments.items()]
    heads = [len(line.head.encode("utf-8")) + 1 for line in lines]  # and its "\n"
    room = limit + 1 - sum(heads)
    for line in lines:
        room -= line.size(room)
    if room >= 0 and all(line.ended for line in lines):
        return Rendering("\n".join(line.whole() for line in lines), 0)
    # Too long: every argument keeps its line while each can show _MIN_SHOWN bytes; past that the
    # last ones are dropped, and one line (at most 2 * _NOTE_ROOM bytes) says how many.
    kept, needed = len(lines), sum(heads) + len(lines) * (_MIN_SHOWN + _NOTE_ROOM)
    while kept and needed + (2 * _NOTE_ROOM if kept < len(lines) else 0) > limit:
        kept -= 1
        needed -= heads[kept] + _MIN_SHOWN + _NOTE_ROOM
    dropped = lines[kept:]
    budget = limit - sum(heads[:kept]) - (2 * _NOTE_ROOM if dropped else 0)
    share = _share(lines[:kept], budget) if kept else 0
    out, hidden = [], 0
    for line in lines[:kept]:
        if line.size(share) <= share and line.ended:
            out.append(line.whole())
        else:
            text, cut = line.cut(share - _NOTE_ROOM)
            out.append(text)
            hidden += cut
    if dropped:
        rest = sum(_json_bytes(line.value) for line in dropped)
        out.append(f"{_CUT} [{len(dropped):,} more arguments, {rest:,} bytes, not shown]")
        hidden += rest
    return Rendering("\n".join(out), hidden)
