"""Configured credentials cut out of text an upstream sends back: whole spellings, never parts.

A careless backend may repeat the credential the host gave it (``{"detail": "key sk-live-... is
not valid"}``, a redirect URL carrying ``?api_key=...``, ``/headers`` answering the
``Authorization`` header). :class:`Redactor` knows the operator's secret values and replaces, in
any text, every whole occurrence of a *spelling* of one:

* the *plain forms* (:func:`spellings`): the value as configured; after a scheme
  (``Bearer <token>``, ``token <t>``) the credential part; for ``Basic`` the decoded
  ``user:password`` and the password;
* each plain form percent- and form-encoded (``/`` kept or not), JSON-escaped (non-ASCII escaped
  or not, ``/`` escaped or not), HTML-escaped, and base64-encoded (standard and URL-safe alphabet)
  at each of the three byte alignments it can have inside a longer encoded text (the characters
  that encode only its own bits, and then also the one character on each side that encodes part
  of them, and ``=`` padding after);
* all of these in any mix of ASCII upper and lower case.

Each occurrence becomes :data:`MARK`. A spelling shorter than :data:`MIN_SECRET` characters counts
only where it stands alone (between non-alphanumerics), so a short secret does not shred words.

**Never a part.** Text a backend returns often repeats the caller's own values (``invalid value
'x'``), and the caller is the tenant's program. A rule that also cut *parts* of a credential (any
run of 8 of its characters, once) answered the question "is this string part of the
credential?" for any string a program chose, one character at a time (issue 31 §1). Matching a
whole spelling answers only "is this the entire secret?", which tells a program only what it
already knew. A backend that echoes a truncated credential is therefore shown as it is.

**The same work whatever the text shares with a credential.** Matching does not compare
characters one by one against a credential (as a regular expression or ``str.find`` does, taking
longer the more of it a text repeats): each spelling of length ``L`` has *anchors*, the blocks of
``B`` characters inside its last ``2B - 1``, ``B`` the largest power of two up to
``min(16, L // 3)`` (any occurrence covers one of them at a text offset that is a multiple of
``B``), and the text's blocks at those offsets are looked up in a hash table. Only a block equal
to an anchor leads to more work (the whole candidate, looked up the same way): a text must hold
``B`` characters of the credential's last two thirds, all at once, where a known prefix
(``Bearer``, ``sk_live_``, a user name) is never.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import re
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import compress
from typing import Any
from urllib.parse import quote, quote_plus

__all__ = ["MARK", "MIN_SECRET", "Matcher", "Redactor", "encodings", "matcher_of", "replaced", "spellings"]

MARK = "[redacted]"
#: Spellings shorter than this count only where they stand alone.
MIN_SECRET = 6
_BLOCK = 16
_FOLD = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_ALNUM = frozenset(string.ascii_letters + string.digits)
_B64 = frozenset(string.ascii_letters + string.digits + "+/-_")


def spellings(value: str) -> set[str]:
    """The plain forms of one configured credential a backend might echo.

    Args:
        value: the credential as configured (a header value such as ``Bearer <token>``).

    Returns:
        As configured, its credential part after a scheme, and for ``Basic`` the decoded
        ``user:password`` and password.
    """
    forms = {value.strip()}
    scheme, _, rest = value.strip().partition(" ")
    rest = rest.strip()
    if rest:
        forms.add(rest)
        if scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(rest, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                decoded = ""
            if decoded:
                forms.add(decoded)
                forms.add(decoded.partition(":")[2])
    return {f for f in forms if f}


def _base64_middles(form: str) -> set[str]:
    """For each alignment of ``form``'s bytes in a longer base64 text and each alphabet, the
    characters that encode only bits of ``form``."""
    data = form.encode("utf-8")
    out = set()
    for lead in range(3):
        start, end = (8 * lead + 5) // 6, (8 * lead + 8 * len(data)) // 6
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            out.add(encode(b"\0" * lead + data).decode("ascii")[start:end])
    return out


def encodings(form: str) -> tuple[set[str], set[str]]:
    """The spellings of one plain form.

    Args:
        form: a plain form (:func:`spellings`).

    Returns:
        The text spellings (itself, percent-, form-, JSON- and HTML-escaped) and the base64 ones
        (see the module text).
    """
    texts = {form, html.escape(form)}
    for safe in ("", "/"):
        texts |= {quote(form, safe=safe), quote_plus(form, safe=safe)}
    for ascii_only in (True, False):
        escaped = json.dumps(form, ensure_ascii=ascii_only)[1:-1]
        texts |= {escaped, escaped.replace("/", "\\/")}
    middles = _base64_middles(form) if len(form) >= MIN_SECRET else set()
    return texts, {m for m in middles if m}


@dataclass(frozen=True)
class _Spelling:
    folded: str
    base64: bool
    alone: bool  # counts only where it stands alone


class Matcher:
    """Finds whole occurrences of a fixed set of spellings (see the module text: anchored blocks
    looked up by hash, so the work does not depend on how much of a spelling a text repeats).

    Args (of the constructor):
        texts: spellings matched as they are (in any ASCII case).
        base64: base64 spellings: an occurrence also takes the character on each side that
            encodes part of its bits, and ``=`` padding after.
        alone_below: spellings shorter than this count only where they stand alone.
    """

    def __init__(
        self, texts: Iterable[str], base64: Iterable[str] = (), alone_below: int = MIN_SECRET
    ) -> None:
        found: dict[str, _Spelling] = {}
        for items, is_b64 in ((base64, True), (texts, False)):  # a text spelling wins a tie
            for item in items:
                if item:
                    folded = item.translate(_FOLD)
                    found[folded] = _Spelling(folded, is_b64, len(folded) < alone_below)
        self._whole = found
        self._groups: dict[int, dict[str, list[tuple[_Spelling, int]]]] = {}
        self._blocks: dict[int, re.Pattern[str]] = {}
        for spelling in found.values():
            size = len(spelling.folded)
            block = 1 << (max(1, min(_BLOCK, size // 3)).bit_length() - 1)  # 1, 2, 4, 8 or 16
            anchors = self._groups.setdefault(block, {})
            self._blocks.setdefault(block, re.compile(f".{{{block}}}", re.DOTALL))
            for at in range(max(0, size - 2 * block + 1), size - block + 1):
                anchors.setdefault(spelling.folded[at : at + block], []).append((spelling, at))
        #: The longest spelling's length (0: none).
        self.longest = max((len(s) for s in found), default=0)
        self._shortest = min((len(s) for s in found), default=0)

    def __bool__(self) -> bool:
        return bool(self._whole)

    def find(self, text: str) -> list[tuple[int, int]]:
        """Where the spellings occur.

        Args:
            text: the text.

        Returns:
            The (start, end) spans of every occurrence, sorted, overlapping ones merged.
        """
        if not self._whole or len(text) < self._shortest:  # the length only: fixed by the configuration
            return []
        folded = text.lower() if text.isascii() else text.translate(_FOLD)
        spans: list[tuple[int, int]] = []
        for block, anchors in self._groups.items():
            blocks = self._blocks[block].findall(folded)  # the text's blocks at offsets 0, B, 2B, ...
            if anchors.keys().isdisjoint(blocks):
                continue
            for q in compress(range(0, len(folded), block), map(anchors.__contains__, blocks)):
                for spelling, at in anchors[folded[q : q + block]]:
                    p = q - at
                    end = p + len(spelling.folded)
                    if p < 0 or self._whole.get(folded[p:end]) is not spelling:
                        continue
                    if spelling.alone and not _stands_alone(folded, p, end):
                        continue
                    spans.append(_widened(folded, p, end) if spelling.base64 else (p, end))
        return _merged(spans)


def _stands_alone(text: str, start: int, end: int) -> bool:
    return (start == 0 or text[start - 1] not in _ALNUM) and (end == len(text) or text[end] not in _ALNUM)


def _widened(text: str, start: int, end: int) -> tuple[int, int]:
    """A base64 occurrence with the characters that encode part of its bits, and padding."""
    if start > 0 and text[start - 1] in _B64:
        start -= 1
    if end < len(text) and text[end] in _B64:
        end += 1
    pad = 0
    while end < len(text) and text[end] == "=" and pad < 2:
        end, pad = end + 1, pad + 1
    return start, end


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def replaced(text: str, spans: list[tuple[int, int]], mark: str = MARK) -> str:
    """``text`` with each of ``spans`` (sorted, disjoint) replaced by ``mark``.

    Args:
        text: the text.
        spans: the (start, end) spans.
        mark: the replacement.

    Returns:
        The text.
    """
    out, at = [], 0
    for start, end in spans:
        out += [text[at:start], mark]
        at = end
    out.append(text[at:])
    return "".join(out)


def matcher_of(
    plain: Iterable[str], transform: Callable[[str], str] = lambda s: s, *, alone_below: int = MIN_SECRET
) -> Matcher:
    """The matcher of some plain forms and all their encodings.

    Args:
        plain: the plain forms (:func:`spellings`).
        transform: applied to every spelling (error_text's normal form; default none).
        alone_below: spellings shorter than this count only where they stand alone.

    Returns:
        The matcher.
    """
    texts: set[str] = set()
    b64: set[str] = set()
    for form in plain:
        t, b = encodings(form)
        texts |= {transform(x) for x in t}
        b64 |= {transform(x) for x in b}
    return Matcher(texts, b64, alone_below)


class Redactor:
    """Replaces every whole spelling of the given secret values (see the module text) in text and
    in JSON values.

    Args (of the constructor):
        secrets: the configured credential values (None and "" are skipped).
    """

    def __init__(self, secrets: Iterable[str | None]) -> None:
        plain: set[str] = set()
        for secret in secrets:
            if secret:
                plain |= spellings(secret)
        self.matcher = matcher_of(plain)

    def __bool__(self) -> bool:
        return bool(self.matcher)

    def redact(self, text: str) -> tuple[str, int]:
        """Replace every whole spelling of a secret.

        Args:
            text: the text.

        Returns:
            It, each spelling replaced by the mark, and how many were.
        """
        spans = self.matcher.find(text)
        return (replaced(text, spans), len(spans)) if spans else (text, 0)

    def exact(self, text: str) -> str:
        """:meth:`redact` without the count.

        Args:
            text: the text.

        Returns:
            It, each spelling replaced by the mark.
        """
        return self.redact(text)[0]

    def head(self, text: str, size: int) -> tuple[str, int]:
        """The first ``size`` characters of ``text``, redacted: a spelling that starts inside them
        is found whole (the text is read ``size`` plus the longest spelling's length far) and
        replaced; nothing past them is kept.

        Args:
            text: the text.
            size: how many characters to keep.

        Returns:
            The head, redacted, and how many spellings were replaced.
        """
        window = text[: size + self.matcher.longest]
        spans = [s for s in self.matcher.find(window) if s[0] < size]
        kept = max([size, *(end for _, end in spans)])
        return replaced(window[:kept], spans), len(spans)

    def value(self, value: Any) -> tuple[Any, int]:
        """Apply :meth:`exact` to every string of a JSON value (keys too).

        Args:
            value: the value.

        Returns:
            The redacted value and how many strings changed.
        """
        if not self:
            return value, 0
        changed = 0

        def walk(node: Any) -> Any:
            nonlocal changed
            if isinstance(node, str):
                cut, count = self.redact(node)
                changed += count > 0
                return cut
            if isinstance(node, list):
                return [walk(item) for item in node]
            if isinstance(node, dict):
                return {walk(k): walk(v) for k, v in node.items()}
            return node

        return walk(value), changed
