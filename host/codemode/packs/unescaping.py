"""A text's escapes decoded, round after round, each decoded character mapped back to the text.

A backend can spell a credential with escapes that no encoding of the whole value produces: every
character a JSON ``\\u0073`` escape or an HTML character reference (``&#115;``, ``&#x73;``,
``&sol;``), some of them percent-escaped and some not, or one encoding inside another (a JSON
string inside a JSON string, percent-escaped ``\\u`` escapes). :func:`decoded_views` gives the
matcher (``codemode.packs.redaction``) the text's *views*: in each round every escape of the
previous view is decoded by the standard library (``json`` for ``\\uXXXX`` (a surrogate pair as
one) and ``\\" \\\\ \\/ \\b \\f \\n \\r \\t``, ``html.unescape`` for ``&#NNN;``, ``&#xHH;`` and named
references, ``urllib.parse.unquote`` for ``%XX``, a run of non-ASCII bytes decoded together as
UTF-8), at most :data:`ROUNDS` rounds, until a round changes nothing. Each character of a view
keeps the span of the text it came from (a character decoded from an escape: the whole escape), so
a spelling found in a view is cut out of the text *as shown*: the client never sees the decoded
form.

The views are for finding only, so decoding errs towards decoding more (``&copy=1`` in a query
string is read as ``©=1``): that can only add spans, and only where a whole spelling stands.

Whether decoding *settled* (a further round would change nothing) is a property of the text
alone; so is the work: in each round one regular-expression split, each distinct escape decoded
once, and the map made with numpy, whatever a credential is (a megabyte of ``%41`` costs about two
scans more than a megabyte without escapes).
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np

__all__ = ["ROUNDS", "View", "decoded_views", "long_references_decoded"]

#: Rounds of decoding: a JSON string inside a JSON string, percent-escaped ``\\u`` escapes inside
#: HTML and the like take two or three.
ROUNDS = 4

_Index = np.ndarray[Any, np.dtype[np.intp]]

_ESCAPE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # a surrogate pair: one character
    r"|\\u[0-9a-fA-F]{4}|\\[\"\\/bfnrt]"  # JSON
    r"|&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);?"  # HTML character references
    r"|%[0-7][0-9a-fA-F]|(?:%[89a-fA-F][0-9a-fA-F])+"  # percent: ASCII, or a run of UTF-8 bytes
)


def _decode_json(escape: str) -> str:
    return str(json.loads('"' + escape + '"'))


def _decode_percent(escape: str) -> str:
    return unquote(escape, errors="replace")


def _decode_html(escape: str) -> str:
    if len(escape) > 40 and escape[1:2] == "#":  # a long number: its leading zeros count for nothing
        escape = _LEADING_ZEROS.sub("", escape)
    try:
        return html.unescape(escape)
    except ValueError:  # more digits than Python converts: out of range, no character (as a browser)
        return "\ufffd"


_LEADING_ZEROS = re.compile(r"(?<=^&#)0+(?=[0-9])|(?<=^&#[xX])0+(?=[0-9a-fA-F])")
#: A numeric character reference of more than 40 characters, for :func:`long_references_decoded`.
_LONG_REFERENCE = re.compile(r"&#(?:[xX][0-9a-fA-F]{38,}|[0-9]{38,});?")


def long_references_decoded(text: str) -> str:
    """``text`` with each numeric character reference of more than 40 characters decoded as
    ``html.unescape`` would decode it, leading zeros ignored (``html.unescape`` raises ValueError
    for one of more than 4,300 digits; out of range is U+FFFD).

    Args:
        text: the text.

    Returns:
        The text.
    """
    return _LONG_REFERENCE.sub(lambda m: _decode_html(m.group()), text)


_DECODERS = {"\\": _decode_json, "&": _decode_html, "%": _decode_percent}
#: The same expression as one group: ``re.split`` then keeps the escapes between the plain runs.
_SPLIT = re.compile(f"({_ESCAPE.pattern})")


@dataclass(frozen=True)
class View:
    """A text with escapes decoded.

    Attributes:
        text: the decoded text.
        starts: for each of its characters, where the text it came from starts in the original.
        ends: and where that ends.
    """

    text: str
    starts: _Index
    ends: _Index


def _round(text: str) -> tuple[str, _Index, _Index] | None:
    """One round: ``text`` with every escape decoded, and for each character the span of ``text``
    it came from; None when the round changes nothing.

    The text is split at its escapes in one pass of the regular expression (plain runs at even
    places, escapes at odd ones); each distinct escape is decoded once, and the map is made with
    numpy: no Python step for each escape, so a text of a million escapes costs about what its
    regular-expression pass does."""
    parts = _SPLIT.split(text)
    if len(parts) == 1:
        return None
    escapes = parts[1::2]
    decoded_of = {escape: _DECODERS[escape[0]](escape) for escape in set(escapes)}
    out = parts.copy()
    out[1::2] = map(decoded_of.__getitem__, escapes)
    decoded = "".join(out)
    if decoded == text:
        return None
    source = np.fromiter(map(len, parts), dtype=np.intp, count=len(parts))
    count = np.fromiter(map(len, out), dtype=np.intp, count=len(out))
    begins = np.cumsum(source) - source  # where each part starts in text
    segment = np.repeat(np.arange(len(count)), count)
    offset = np.arange(len(decoded)) - np.repeat(np.cumsum(count) - count, count)
    plain = segment % 2 == 0
    first = begins[segment] + np.where(plain, offset, 0)
    after = np.where(plain, first + 1, (begins + source)[segment])
    return decoded, first, after


def decoded_views(text: str, rounds: int = ROUNDS) -> tuple[list[View], bool]:
    """The views of ``text``, one for each round of decoding that changed something.

    Args:
        text: the text.
        rounds: the most rounds.

    Returns:
        The views (none when the text has no escape), and whether decoding settled: a round after
        the last changes nothing.
    """
    views: list[View] = []
    current = text
    starts = np.arange(len(text), dtype=np.intp)
    ends = starts + 1
    for _ in range(rounds):
        step = _round(current)
        if step is None:
            return views, True
        current, first, after = step
        starts, ends = starts[first], ends[after - 1]
        views.append(View(current, starts, ends))
    return views, _round(current) is None
