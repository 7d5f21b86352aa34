"""Configured credentials cut out of text an upstream sends back: whole spellings, never parts.

A careless backend may repeat the credential the host gave it (``{"detail": "key sk-live-... is
not valid"}``, a redirect URL carrying ``?api_key=...``, ``/headers`` answering the
``Authorization`` header). :class:`Redactor` knows the operator's secret values and replaces, in
any text, every whole occurrence of a *spelling* of one:

* the *plain forms* (:func:`spellings`): the value as configured; after a scheme
  (``Bearer <token>``, ``token <t>``) the credential part; for ``Basic`` the decoded
  ``user:password`` and the password;
* each plain form percent- and form-encoded (``/`` kept or not), JSON-escaped (non-ASCII escaped
  or not, ``/`` escaped or not), HTML-escaped, its UTF-8 bytes in hex (a debug dump), and
  base64-encoded (standard and URL-safe alphabet)
  at each of the three byte alignments it can have inside a longer encoded text (the characters
  that encode only its own bits, and then also the one character on each side that encodes part
  of them, and ``=`` padding after);
* all of these in any mix of ASCII upper and lower case (and with ``ı`` or ``İ`` for ``i``: a
  Turkish locale's case change);
* and each of them again in the text with its ``%XX`` escapes decoded once, so that a value with
  only some characters escaped (Go's ``url.PathEscape`` keeps ``+`` and ``=``), or only part of
  it, counts too (the span then covers the escapes);
* and in each *view* of the text (``codemode.packs.unescaping``: JSON ``\\u`` escapes, HTML
  character references and ``%XX`` escapes decoded by the standard library, up to four rounds),
  so that every character escaped, one encoding inside another, or several mixed, count too; a
  span found in a view is the span of the text its characters came from, so the text is shown as
  it is, with the escapes of the spelling cut out. A space and ``+`` count as one character (form
  encoding).

Each occurrence becomes :data:`MARK`. A spelling shorter than :data:`MIN_SECRET` characters counts
only where it stands alone (between non-alphanumerics), so a short secret does not shred words.

**Never a part.** Text a backend returns often repeats the caller's own values (``invalid value
'x'``), and the caller is the tenant's program. A rule that also cut *parts* of a credential (any
run of 8 of its characters, once) answered the question "is this string part of the
credential?" for any string a program chose, one character at a time. Matching a
whole spelling answers only "is this the entire secret?", which tells a program only what it
already knew. A backend that echoes a truncated credential is therefore shown as it is.

**The same work whatever the text shares with a credential.** Matching never compares a part of
a text with a part of a spelling (as a regular expression or ``str.find`` does, taking longer the
more of it a text repeats; nor looks up blocks of a spelling, which costs more when a block is
guessed): for each spelling length ``L``, every window of ``L`` characters of the text gets a
fingerprint (a polynomial hash modulo 2**64 with a random key of the process, computed for all
windows at once with numpy), and each is compared with every spelling's fingerprint of that
length. The number of operations and their operands' sizes follow the text's length and the
configuration only; only a window whose fingerprint is a spelling's (a whole spelling, or a rare
look-alike, which the whole comparison then sets aside) leads to more work. The views' work is the
text's alone too: a regular-expression split a round, each distinct escape decoded once. A
review measured the earlier anchored blocks: 8 echoes of 512 KiB of a 4-character
part of a credential's last third took 3.7 s against 1.4 s for other characters, one execute
enough to tell them apart.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import html
import json
import secrets
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, quote_plus

# numpy after regopy: codemode/__init__.py loads regopy first (else RegoAuthorizer aborts the
# process in rego_bundle_save once numpy has loaded the system's libstdc++).
import numpy as np

from .off_loop import off_loop
from .unescaping import View, decoded_views

__all__ = [
    "MARK",
    "MIN_SECRET",
    "Found",
    "Matcher",
    "Redactor",
    "encodings",
    "matcher_of",
    "replaced",
    "spellings",
]

T = TypeVar("T")

MARK = "[redacted]"
#: Spellings shorter than this count only where they stand alone.
MIN_SECRET = 6
#: ASCII case, the dotless and dotted i of a Turkish locale's case change (``I`` lower-cased to
#: ``ı``, ``i`` upper-cased to ``İ``), and a space and ``+`` (form encoding writes a space as
#: ``+``): one character each, as ``_folded`` does.
_FOLD = str.maketrans(string.ascii_uppercase + "\u0130\u0131 ", string.ascii_lowercase + "ii+")
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
        The text spellings (itself, percent-, form-, JSON- and HTML-escaped, its UTF-8 bytes in
        hex) and the base64 ones (see the module text).
    """
    texts = {form, html.escape(form), form.encode("utf-8").hex()}  # hex: a dump of its bytes
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


#: The key of the window fingerprints: random for each process, so that no text can be made to
#: look like a spelling's fingerprint without holding the spelling.
_MASK = (1 << 64) - 1
_BASE = secrets.randbits(64) | 1
_SCALE = secrets.randbits(64) | 1
#: Windows fingerprinted at once: a text is scanned in parts of this many window starts (each part
#: read with the longest spelling's length less one more), so the memory a scan takes is bounded
#: whatever the text's length.
_CHUNK = 1 << 16
_Array = np.ndarray[Any, np.dtype[np.uint64]]


def _make_powers(size: int) -> tuple[_Array, _Array]:
    """``_BASE`` to the powers 0 to ``size - 1``, and its inverse's (modulo 2**64)."""
    made = []
    for base in (_BASE, pow(_BASE, -1, 1 << 64)):
        steps = np.full(size, base, dtype=np.uint64)
        steps[0] = 1
        made.append(np.cumprod(steps, dtype=np.uint64))  # wraps modulo 2**64, as meant
    return made[0], made[1]


_POWERS = _make_powers(_CHUNK + 4096)


def _powers(n: int) -> tuple[_Array, _Array]:
    """The powers for parts of ``n`` characters (made again, larger, only for a configuration
    whose spellings are longer than 4,096 characters: never for a text)."""
    global _POWERS
    if len(_POWERS[0]) < n:
        _POWERS = _make_powers(n)
    return _POWERS


def _folded(codes: _Array) -> _Array:
    """Code points with ASCII upper case made lower case, the Turkish ``İ`` and ``ı`` an ``i`` and a
    space a ``+`` (as ``_FOLD``), every one the same way."""
    codes = codes + ((codes >= 65) & (codes <= 90)).astype(np.uint64) * np.uint64(32)
    codes = np.where((codes == 0x130) | (codes == 0x131), np.uint64(0x69), codes)
    return np.where(codes == 32, np.uint64(43), codes)


def _hex_values(codes: _Array) -> _Array:
    """The value of each folded code point as a hex digit; 16 where it is none."""
    digit = (codes >= 48) & (codes <= 57)
    letter = (codes >= 97) & (codes <= 102)
    return np.where(digit, codes - np.uint64(48), np.where(letter, codes - np.uint64(87), np.uint64(16)))


def _escapes(codes: _Array) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """True at each ``%`` that starts a ``%XX`` escape (two escapes never overlap)."""
    out = np.zeros(len(codes), dtype=bool)
    if len(codes) >= 3:
        digits = _hex_values(codes) < 16
        out[:-2] = (codes[:-2] == 37) & digits[1:-1] & digits[2:]
    return out


def _decoded(
    codes: np.ndarray[Any, np.dtype[np.uint64]], escapes: np.ndarray[Any, np.dtype[np.bool_]]
) -> tuple[
    np.ndarray[Any, np.dtype[np.uint64]],
    np.ndarray[Any, np.dtype[np.intp]],
    np.ndarray[Any, np.dtype[np.intp]],
]:
    """``codes`` with each ``%XX`` one character (the byte's value, folded), and for each character
    where it starts in ``codes`` and where it ends."""
    values = _hex_values(codes)
    byte = np.zeros(len(codes), dtype=np.uint64)
    byte[:-2] = values[1:-1] * np.uint64(16) + values[2:]
    dropped = np.zeros(len(codes), dtype=bool)
    dropped[1:] |= escapes[:-1]
    dropped[2:] |= escapes[:-2]
    kept = ~dropped
    decoded = _folded(np.where(escapes, byte, codes)[kept])
    first = np.flatnonzero(kept)
    return decoded, first, first + np.where(escapes[kept], 3, 1)


def _fingerprint(folded: str) -> int:
    """The window fingerprint of a folded spelling (what :meth:`Matcher.find` computes for each
    window of a text)."""
    h = 0
    for ch in folded:
        h = (h * _BASE + (ord(ch) + 1) * _SCALE) & _MASK
    return h


@dataclass(frozen=True)
class Found:
    """What :meth:`Matcher.search` found in a text.

    Attributes:
        spans: the (start, end) spans of every spelling, sorted, overlapping ones merged.
        settled: whether decoding the text's escapes settled within the rounds it takes (see
            ``codemode.packs.unescaping``); when not, the text may hold escapes no view decoded.
        last: the text's most decoded view (None: the text has no escape).
        length: the text's length.
    """

    spans: list[tuple[int, int]]
    settled: bool
    last: View | None
    length: int

    def tail_start(self, count: int) -> int:
        """Where, in the text, the last ``count`` characters of its most decoded view start: a
        spelling that a cut at the text's end left incomplete starts there or later, whatever the
        encoding that makes it longer than itself.

        Args:
            count: how many characters (at least the longest spelling's length).

        Returns:
            The position (0 when the view has no more than ``count`` characters).
        """
        size = self.length if self.last is None else len(self.last.text)
        if size <= count:
            return 0
        return size - count if self.last is None else int(self.last.starts[size - count])


class Matcher:
    """Finds whole occurrences of a fixed set of spellings, doing the same work whatever a text
    shares with them (see the module text: a fingerprint of every window of each spelling length,
    compared with the spellings' fingerprints; nothing looks at a part of a spelling).

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
        by_length: dict[int, list[int]] = {}
        for folded in sorted(found):
            by_length.setdefault(len(folded), []).append(_fingerprint(folded))
        self._lengths = sorted(by_length.items())
        #: The longest spelling's length (0: none).
        self.longest = max((len(s) for s in found), default=0)
        self._shortest = min((len(s) for s in found), default=0)

    def __bool__(self) -> bool:
        return bool(self._whole)

    def find(self, text: str) -> list[tuple[int, int]]:
        """Where the spellings occur (:meth:`search`'s spans).

        Args:
            text: the text.

        Returns:
            The (start, end) spans of every occurrence, sorted, overlapping ones merged.
        """
        return self.search(text).spans if self._whole else []

    def search(self, text: str) -> Found:
        """Where the spellings occur: in the text as it is, in the text with its percent-escapes
        decoded (a backend may escape only some characters of a value, or only part of it), and in
        each view of ``codemode.packs.unescaping`` (every character a JSON ``\\u`` escape or an
        HTML character reference, one encoding inside another), a span found in a view being the
        span of the text its characters came from. The views are made whether or not anything is
        configured: whether decoding settled is the text's alone.

        Args:
            text: the text.

        Returns:
            The spans, whether decoding settled, and where the most decoded view's characters came
            from (:meth:`Found.tail_start`).
        """
        views, settled = decoded_views(text)
        spans = self._find_plain(text)
        for view in views:
            for a, b in self._find_plain(view.text):
                spans.append((int(view.starts[a]), int(view.ends[b - 1])))
        return Found(_merged(spans), settled, views[-1] if views else None, len(text))

    def _find_plain(self, text: str) -> list[tuple[int, int]]:
        """Where the spellings occur in ``text`` as it is and with its percent-escapes decoded once."""
        if not self._whole or len(text) < self._shortest:  # the length only: fixed by the configuration
            return []
        codes = _folded(
            np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4").astype(np.uint64)
        )
        spans = self._scan(codes, lambda start, end: self._confirmed(text, start, end))
        escapes = _escapes(codes)
        if escapes.any():  # whether the text has a %XX: the text alone tells
            decoded, first, after = _decoded(codes, escapes)
            plain: list[str] = []  # made only when a window's fingerprint is a spelling's

            def confirmed(start: int, end: int) -> list[tuple[int, int]]:
                if not plain:
                    plain.append(decoded.astype("<u4").tobytes().decode("utf-32-le", "surrogatepass"))
                return [(int(first[a]), int(after[b - 1])) for a, b in self._confirmed(plain[0], start, end)]

            spans += self._scan(decoded, confirmed)
        return _merged(spans)

    def _scan(
        self, codes: _Array, confirmed: Callable[[int, int], list[tuple[int, int]]]
    ) -> list[tuple[int, int]]:
        """The spans ``confirmed`` gives for each window whose fingerprint is a spelling's, the
        text taken in parts of :data:`_CHUNK` window starts."""
        n = len(codes)
        spans: list[tuple[int, int]] = []
        for begin in range(0, n - self._shortest + 1, _CHUNK):
            part = codes[begin : begin + _CHUNK + self.longest - 1]
            for start, size in self._hits(part):
                spans += confirmed(begin + start, begin + start + size)
        return spans

    def _hits(self, codes: _Array) -> list[tuple[int, int]]:
        """(start, length) of each window starting among the first :data:`_CHUNK` characters of
        ``codes`` whose fingerprint is a spelling's of that length."""
        n = len(codes)
        powers, inverse = _powers(n)
        weighted = (codes + np.uint64(1)) * np.uint64(_SCALE) * inverse[:n]
        sums = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(weighted, out=sums[1:])
        found: list[tuple[int, int]] = []
        hit = np.empty(min(n, _CHUNK), dtype=bool)
        seen = np.empty(min(n, _CHUNK), dtype=bool)
        for size, prints in self._lengths:
            count = min(n - size + 1, _CHUNK)
            if count <= 0:
                break
            windows = (sums[size : size + count] - sums[:count]) * powers[size - 1 : size - 1 + count]
            seen[:count] = False
            for value in prints:  # the same comparisons for every window, whatever it holds
                np.equal(windows, np.uint64(value), out=hit[:count])
                seen[:count] |= hit[:count]
            found += [(p, size) for p in np.flatnonzero(seen[:count]).tolist()]  # whole (or, rarely, alike)
        return found

    def find_each(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        """:meth:`find` for many texts at once: one pass over them all, joined by NUL characters,
        so that many short texts (the strings of a JSON value) cost one pass, not one each.

        Args:
            texts: the texts.

        Returns:
            For each text, the (start, end) spans of every occurrence in it, sorted, merged.
        """
        if not self._whole or not texts:
            return [[] for _ in texts]
        starts = []
        at = 0
        for text in texts:
            starts.append(at)
            at += len(text) + 1
        out: list[list[tuple[int, int]]] = [[] for _ in texts]
        for start, end in self.find("\0".join(texts)):
            which = bisect.bisect_right(starts, start) - 1
            first = starts[which]
            if end <= first + len(texts[which]):  # never across a NUL that joins two of them
                out[which].append((start - first, end - first))
        return out

    def _confirmed(self, text: str, start: int, end: int) -> list[tuple[int, int]]:
        """The span of the spelling at ``start:end`` of ``text`` (empty if there is none)."""
        folded = text[max(0, start - 1) : end + 3].translate(_FOLD)
        at = 1 if start > 0 else 0
        spelling = self._whole.get(folded[at : at + end - start])
        if spelling is None:
            return []
        if spelling.alone and not _stands_alone(folded, at, at + end - start):
            return []
        if spelling.base64:  # widened on the text as it is (its spaces are no base64)
            first, last = _widened(text[max(0, start - 1) : end + 3], at, at + end - start)
            return [(start - at + first, start - at + last)]
        return [(start, end)]


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


def _marked(text: str, spans: list[tuple[int, int]]) -> tuple[str, list[tuple[int, int]]]:
    """``text`` with each of ``spans`` (sorted, disjoint) the mark, and where each mark is in it."""
    out, marks, at, shift = [], [], 0, 0
    for start, end in spans:
        out += [text[at:start], MARK]
        marks.append((start + shift, start + shift + len(MARK)))
        shift += len(MARK) - (end - start)
        at = end
    out.append(text[at:])
    return "".join(out), marks


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
        shortest: plain forms shorter than this are left out (default: none is).
    """

    def __init__(self, secrets: Iterable[str | None], *, shortest: int = 1) -> None:
        plain: set[str] = set()
        for secret in secrets:
            if secret:
                plain |= {form for form in spellings(secret) if len(form) >= shortest}
        self.matcher = matcher_of(plain)

    def __bool__(self) -> bool:
        return bool(self.matcher)

    @staticmethod
    async def off_loop(subject: str, size: int, job: Callable[..., T], *args: Any) -> T:
        """Run a redaction (``job(*args)``, any of this module's or ``upstream_error_text``,
        ``upstream_result``) from an async handler without stalling the serving loop: one of
        ``size`` 8 KiB or more runs on the host's redaction threads, at most one at a time for each
        subject; a shorter one inline (:mod:`codemode.packs.off_loop`).

        Args:
            subject: the subject the call is for (``subject.id``).
            size: the size of the text or JSON body the job reads.
            job: the redaction.
            *args: its arguments.

        Returns:
            What ``job`` returned (or raises what it raised).
        """
        return await off_loop(subject, size, job, *args)

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
        """The first ``size`` characters of ``text`` once every spelling is redacted (a mark begun
        before them is kept whole).

        The whole text is read, so every spelling is found whole however long its escapes
        (``&#0000115;`` is one ``s``), and what is kept, and whether it is shown at all, is
        measured on the redacted text: on the text as sent, where a read ended and where a cut
        text's tail began followed the credential's own length, and an escape that the program's
        value began and the credential's first characters completed decided whether decoding
        settled (found by a review). When decoding the redacted text's escapes does not
        settle (an escape inside more escapes than the views decode), nothing is kept: ``""``.

        Args:
            text: the text.
            size: how many characters to keep.

        Returns:
            The head, redacted, and how many spellings were replaced.
        """
        spans = self.matcher.find(text)
        shown, marks = _marked(text, spans)
        if not decoded_views(shown)[1]:
            return "", 0
        kept = [m for m in marks if m[0] < size]
        return shown[: max([size, *(end for _, end in kept)])], len(kept)

    def value(self, value: Any) -> tuple[Any, int]:
        """Apply :meth:`exact` to every string of a JSON value (keys too), and to every number's
        JSON text (one that holds a spelling becomes that text redacted, a string).

        Args:
            value: the value.

        Returns:
            The redacted value and how many strings changed.
        """
        if not self:
            return value, 0
        strings: list[str] = []

        def collect(node: Any) -> None:
            if isinstance(node, str):
                strings.append(node)
            elif isinstance(node, int | float) and not isinstance(node, bool):
                strings.append(json.dumps(node))  # an all-digit credential echoed as a number
            elif isinstance(node, list):
                for item in node:
                    collect(item)
            elif isinstance(node, dict):
                for k, v in node.items():
                    collect(k)
                    collect(v)

        collect(value)
        found = iter(self.matcher.find_each(strings))  # one pass over all of them: see find_each
        changed = 0

        def walk(node: Any) -> Any:
            nonlocal changed
            if isinstance(node, str):
                spans = next(found)
                changed += bool(spans)
                return replaced(node, spans) if spans else node
            if isinstance(node, int | float) and not isinstance(node, bool):
                spans = next(found)
                changed += bool(spans)
                return replaced(json.dumps(node), spans) if spans else node  # then a string
            if isinstance(node, list):
                return [walk(item) for item in node]
            if isinstance(node, dict):
                out = {}
                for k, v in node.items():  # the order collect took
                    key = walk(k)
                    out[key] = walk(v)
                return out
            return node

        return walk(value), changed
