"""The one rule for an upstream's own error text that a client may see (docs/reference/errors.md,
``capability failed: <upstream name>: <text>``), shared by the MCP and OpenAPI packs.

The text is the upstream's, and a tenant may steer it (server-memory quotes the entity name it was
given), so the rule finds the credentials' whole spellings in a bounded head of it (:data:`SCANNED`
characters), reads a shorter head of the result and does nothing whose cost grows
faster than that head: every step is one linear pass, and the token patterns are matched once per
token, anchored at its start.

1. **Cut**: every whole spelling of a configured credential (step 3) is first found in the first
   :data:`SCANNED` characters and made ``[redacted]``; then only the first :data:`LOOK_AT`
   characters of that count; :data:`REACH` more are read, so that a spelling of a credential
   starting inside them is seen whole in the normal form (a multiple of it when a credential's
   longest spelling is longer: how far the rule reads never depends on a credential of up to
   1,024 characters, see step 3). Cut from the text as sent, how much followed a credential
   depended on its length.
2. **Normal form**: NFKC (full-width and other compatibility forms become plain ones), HTML
   character references and percent-escapes decoded (three rounds at most), NFKC again, the
   look-alike separators (``∕ ⁄ ⧸ ∖ ⧵ 。 ｡ ∶ ꞉``, ...) made ``/ \\ . :``; format characters
   (zero-width spaces, bidi controls, soft hyphens) removed, every other control or separator
   character a space, whitespace runs one space.
3. **Credentials**: every whole spelling of a configured value of at least 4 characters (those of
   ``codemode.packs.redaction``: its plain forms, such as the token of ``Bearer <token>``, the
   decoded ``user:password`` of ``Basic`` and the password, each also percent-, JSON-, HTML- or
   base64-encoded, in any ASCII case) becomes ``[redacted]``: in the raw text, and again in the
   normal form, where one broken up by spaces, newlines, tabs, zero-width or other invisible
   characters, or combining marks still counts; and in the decoded views of each
   (``codemode.packs.unescaping``: JSON ``\\u`` escapes, HTML references and percent-escapes,
   four more rounds), the span of the escapes a spelling came from. When the normal form's escapes
   have not settled after those rounds, nothing of the text is shown (``""``, and one warning).
   Never a part of one: the tenant steers the text, and a rule that reacts to a part answers "is
   this part of the credential?". When the text was longer than what is read, the
   normal form's last characters that could hold the start of a spelling (from where the last of
   its most decoded view's characters begin, as many as were read past :data:`LOOK_AT`, whatever
   they are) are dropped: a fixed count, since one that followed the credential's length showed
   it to a text whose normal form is shorter than itself (percent-escapes). When anything was
   redacted, one warning names the upstream (never the text).
4. **Cut again** to :data:`LOOK_AT` characters, then **tokens**: the text is split at spaces and
   at ``' " ( ) [ ] { } < > , ; = |`` and backquotes; trailing ``. : ! ?`` of a token stay outside
   it. A token is an *address* (``[url]``) when it has ``scheme://``, starts with ``//`` or
   ``www.``, or is a host name (two or more dot-separated labels of letters, digits, ``-`` and
   ``_`` in any script, the last of at least two letters: ``évil.example``, but also
   ``diary.txt``: a host and a file name cannot be told apart), an IPv4 address, an IPv6 address
   (in brackets or with ``::``), or any name with ``:port``, each optionally after ``user@`` and
   before a port and ``/``, ``?`` or ``#`` and anything. It is a *path* (``[path]``) when it
   starts with ``/``, ``\\``, dots or ``~`` and then ``/`` or ``\\``, a drive letter and ``:\\`` or
   ``:/``, or ``file:``, or when it holds two or more ``/`` or ``\\`` anywhere
   (``é/srv/tenants/x``; ``Mars/Olympus`` stays). A name with a port is not all digits (``10:30``
   is a time).
5. **Bound**: at most ``limit`` UTF-8 bytes, cut on a character boundary with ``...``.
"""

from __future__ import annotations

import functools
import html
import logging
import re
import unicodedata
import urllib.parse
from collections.abc import Iterable

from .redaction import MARK, Matcher, matcher_of, replaced, spellings
from .unescaping import long_references_decoded

__all__ = [
    "LOOK_AT",
    "MAX_UPSTREAM_ERROR",
    "MIN_SECRET",
    "REACH",
    "SCANNED",
    "upstream_error_text",
]

#: Bytes of an upstream's error text a client may see (after the ``<upstream>: `` mark).
MAX_UPSTREAM_ERROR = 160
#: Characters of an upstream's error text the rule reads (the client sees at most 160 bytes).
LOOK_AT = 1024
#: Characters read past LOOK_AT, and dropped again at the end of a longer text's normal form
#: (rounded up to a multiple for a credential whose longest spelling is longer).
REACH = 1024
#: Characters of an error text in which whole spellings are found before the window is taken
#: (four windows when a credential's spellings make the window longer).
SCANNED = 65536
MIN_SECRET = 4
_DECODE_ROUNDS = 3

log = logging.getLogger("codemode.upstream")

#: Characters that look like a separator of a URL or a path, and the separator they stand for
#: (the compatibility forms, full-width ones included, NFKC already maps).
_LOOK_ALIKES = str.maketrans(
    {
        **dict.fromkeys("\u2215\u2044\u29f8\u2571\u1735", "/"),
        **dict.fromkeys("\u2216\u29f5\u29f9\u2572", "\\"),
        **dict.fromkeys("\u3002\uff61", "."),  # IDNA label separators
        **dict.fromkeys("\u2236\ua789\u0589\u05c3", ":"),
    }
)
#: What may come between two characters of a credential and still spell it: spaces (every other
#: control and separator is one by then), combining marks and the letters that show as blanks.
_GAP_CHARS = (
    " \u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe00-\ufe0f\ufe20-\ufe2f"
    "\u034f\u115f\u1160\u17b4\u17b5\u3164\uffa0\u2800"
)
_GAP = re.compile(f"[{_GAP_CHARS}]+")
_NOT_GAP = re.compile(f"[^{_GAP_CHARS}]")
_SPACES = re.compile(r" {2,}")
_WRAPPERS = "'\"()[]{}<>`"
_SPLIT = re.compile(r"([ '\"()\[\]{}<>,;=|`]+)")
_PATH_START = re.compile(r"[.~]*[/\\]|[A-Za-z]:[/\\]|file:", re.IGNORECASE)
_HOST_NAME = re.compile(r"(?:[\w-]+\.)+[^\W\d_]{2,}")
_NAME = re.compile(r"[\w-]+(?:\.[\w-]+)*")
_IPV4 = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}")
_V6_CHARS = frozenset("0123456789abcdefABCDEF:.")
_PORT = re.compile(r":[0-9]{1,5}")
_AFTER_HOST = re.compile(r"[/?#]")


def _spaced(text: str) -> str:
    """Format characters removed, every other non-printable character a space."""
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        elif unicodedata.category(ch) != "Cf":
            out.append(" ")
    return "".join(out)


def _normal(text: str) -> str:
    """Step 2 of the module text, without squeezing the spaces."""
    text = unicodedata.normalize("NFKC", _spaced(text))
    text = html.unescape(long_references_decoded(text))  # which may raise on a long number
    for _ in range(_DECODE_ROUNDS):
        decoded = urllib.parse.unquote(text, errors="replace")
        if decoded == text:
            break
        text = decoded
    return _spaced(unicodedata.normalize("NFKC", text).translate(_LOOK_ALIKES))


def _flat(text: str) -> str:
    return _GAP.sub("", text)


def _redact(text: str, matcher: Matcher, *, drop: int) -> tuple[str, int] | None:
    """Every spelling of ``matcher`` (already flat) in ``text`` ``[redacted]``, whatever gap
    characters lie between its characters; with ``drop``, what starts where the last ``drop``
    characters of the most decoded view of the flat text begin dropped unless inside a spelling
    that starts before them: the text was cut, and they could be the start of one. Returns the
    text and how many spellings were found; None when decoding the flat text's escapes did not
    settle."""
    flat = _flat(text)
    keep = [m.start() for m in _NOT_GAP.finditer(text)]  # keep[i]: where flat[i] is in text
    found = matcher.search(flat)
    if not found.settled:
        return None
    spans = [(keep[start], keep[end - 1] + 1) for start, end in found.spans]
    if drop:
        at = found.tail_start(drop)
        stop = keep[at] if at else 0
        spans = [span for span in spans if span[0] < stop]
        text = text[: max([stop, *(end for _, end in spans)])]
    return (replaced(text, spans, MARK) if spans else text), len(spans)


def _ipv6(text: str) -> bool:
    return (
        set(text) <= _V6_CHARS and ("::" in text or text.count(":") == 7) and any(c not in ":." for c in text)
    )


def _address(token: str) -> bool:
    """A host name, an IP address or a name with a port (after ``user@``, before a path)."""
    head = _AFTER_HOST.split(token, maxsplit=1)[0].rpartition("@")[2]
    if head.startswith("["):
        end = head.find("]")
        rest = head[end + 1 :]
        return end > 1 and _ipv6(head[1:end]) and (not rest or bool(_PORT.fullmatch(rest)))
    if _ipv6(head):
        return True
    name, colon, port = head.rpartition(":")
    if colon and name and _PORT.fullmatch(colon + port):  # a time such as 10:30 is not one
        return bool(_IPV4.fullmatch(name) or (_NAME.fullmatch(name) and not name.isdigit()))
    return bool(_HOST_NAME.fullmatch(head) or _IPV4.fullmatch(head))


def _mark(token: str) -> str | None:
    """``[url]``, ``[path]`` or None for one token (step 4 of the module text)."""
    if not token:
        return None
    if "://" in token or token.startswith("//") or token[:4].lower() == "www.":
        return "[url]"
    if _PATH_START.match(token):
        return "[path]"
    if _address(token):
        return "[url]"
    if token.count("/") + token.count("\\") >= 2:
        return "[path]"
    return None


def _marked(part: str) -> str:
    core = part.rstrip(".:!?")
    mark = _mark(core)
    return part if mark is None else mark + part[len(core) :]


def _word_marked(word: str) -> str:
    """One space-delimited word: a URL taking the whole of it (query strings included) is one
    ``[url]``; otherwise each of its tokens is marked on its own."""
    lead = len(word) - len(word.lstrip(_WRAPPERS))
    core = word[lead:].rstrip(_WRAPPERS + ".,;:!?")
    if core and _mark(core) == "[url]" and not _PATH_START.match(core):
        return word[:lead] + "[url]" + word[lead + len(core) :]
    parts = _SPLIT.split(word)
    parts[::2] = [_marked(p) for p in parts[::2]]  # the odd ones are the separators
    return "".join(parts)


def _bounded(text: str, limit: int) -> str:
    text = text.strip()
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", errors="ignore").rstrip() + "..."


@functools.lru_cache(maxsize=256)
def _matchers(secrets: tuple[str, ...]) -> tuple[Matcher, Matcher]:
    """The matchers of an upstream's credentials: as spelled, and in the flat normal form (made
    once for each configuration, not for each error text)."""
    forms = {form for secret in secrets for form in spellings(secret) if len(form) >= MIN_SECRET}
    flat = matcher_of(forms, lambda spelling: _flat(_normal(spelling)), alone_below=0)
    return matcher_of(forms, alone_below=0), flat


def upstream_error_text(
    upstream: str, text: str, *, secrets: Iterable[str] = (), limit: int = MAX_UPSTREAM_ERROR
) -> str:
    """The part of an upstream's error text a client may see (the rule: docs/reference/errors.md).

    Args:
        upstream: the upstream's name.
        text: its error text (only the head is read).
        secrets: the configured credential values of that upstream (ones shorter than 4 characters
            are ignored).
        limit: the most characters of text kept.

    Returns:
        ``<upstream>: <text>``, or "" when nothing is left.
    """
    raw, flat = _matchers(tuple(secrets))
    reach = REACH * max(1, -(-max(raw.longest, flat.longest) // REACH))
    window = LOOK_AT + reach
    # The window is measured on the text with each spelling already the mark: on the text as
    # sent, where it ended followed the credential's length (found by a review). Spellings are
    # found in the first SCANNED characters (a bounded cost: a spelling starting past them is past
    # any window too).
    scanned = text[: max(SCANNED, 4 * window)]
    spans = raw.find(scanned)
    found = len(spans)
    text = (replaced(scanned, spans, MARK) if spans else scanned) + text[len(scanned) :]
    head = text[:window]
    redacted = _redact(_normal(head), flat, drop=reach if len(text) > window else 0)
    if redacted is None:
        log.warning("upstream %r: its error text nests escapes too deep to read: not shown", upstream)
        return ""
    one, more = redacted
    if found + more:
        log.warning("upstream %r: its error text carried a configured credential: redacted", upstream)
    one = _SPACES.sub(" ", one)[:LOOK_AT]
    one = " ".join(_word_marked(word) for word in one.split(" "))
    one = _bounded(one, limit)
    return f"{upstream}: {one}" if one else ""
