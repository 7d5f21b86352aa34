"""Configured credentials cut out of text an upstream sends back.

A careless or hostile backend may repeat the credential the host gave it (``{"detail": "key
sk-live-... is not valid"}``, a redirect URL carrying ``?api_key=...``). :class:`Redactor` knows
the operator's secret values and replaces, in any text, every occurrence of:

* each value as configured, and its credential part when it has a scheme (``Bearer <token>``,
  ``token <t>``: the ``<token>``); for ``Basic`` the decoded ``user:password`` and the password;
* the percent-encoded and form-encoded spellings of each of those (a value echoed in a URL);
* in :meth:`Redactor.text` (short texts such as an error reason) also any run of at least
  :data:`FRAGMENT` characters of one of them (a backend that echoes a truncated key).

Each is replaced by :data:`MARK`. Values shorter than :data:`MIN_SECRET` characters are replaced
only where they stand alone (between non-alphanumerics), so a two-letter secret does not shred
every word.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus

__all__ = ["FRAGMENT", "MARK", "MIN_SECRET", "Redactor", "spellings"]

MARK = "[redacted]"
FRAGMENT = 8
MIN_SECRET = 6


def spellings(value: str) -> set[str]:
    """The spellings of one configured credential a backend might echo.

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


class Redactor:
    """Replaces the given secret values (see the module docstring) in text and in JSON values.

    Args (of the constructor):
        secrets: the configured credential values (None and "" are skipped).
    """

    def __init__(self, secrets: Iterable[str | None]) -> None:
        plain: set[str] = set()
        for secret in secrets:
            if secret:
                plain |= spellings(secret)
        spelled = plain | {quote(f, safe="") for f in plain} | {quote_plus(f, safe="") for f in plain}
        self.fragments = sorted((f for f in plain if len(f) >= FRAGMENT), key=len, reverse=True)
        long_ = sorted((f for f in spelled if len(f) >= MIN_SECRET), key=len, reverse=True)
        short = sorted((f for f in spelled if len(f) < MIN_SECRET), key=len, reverse=True)
        parts = [re.escape(f) for f in long_]
        parts += [rf"(?<![A-Za-z0-9]){re.escape(f)}(?![A-Za-z0-9])" for f in short]
        self._pattern = re.compile("|".join(parts)) if parts else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def exact(self, text: str) -> str:
        """Replace every whole spelling of a secret.

        Args:
            text: the text.

        Returns:
            It, each spelling replaced by the mark.
        """
        return self._pattern.sub(MARK, text) if self._pattern is not None else text

    def text(self, text: str) -> str:
        """Like :meth:`exact`, and also any run of :data:`FRAGMENT` or more characters of a secret
        (quadratic in the text's length: meant for short texts such as error reasons).

        Args:
            text: the text.

        Returns:
            It, redacted.
        """
        text = self.exact(text)
        if not self.fragments:
            return text
        out: list[str] = []
        i = 0
        while i < len(text):
            end = self._fragment_end(text, i)
            if end:
                out.append(MARK)
                i = end
            else:
                out.append(text[i])
                i += 1
        return "".join(out)

    def _fragment_end(self, text: str, start: int) -> int:
        """The end of the longest run of a secret's characters starting at ``start`` (0: none)."""
        best = 0
        for secret in self.fragments:
            end = start + FRAGMENT
            if end > len(text) or text[start:end] not in secret:
                continue
            while end < len(text) and text[start : end + 1] in secret:
                end += 1
            best = max(best, end)
        return best

    def value(self, value: Any) -> tuple[Any, int]:
        """Apply :meth:`exact` to every string of a JSON value (keys too).

        Args:
            value: the value.

        Returns:
            The redacted value and how many strings changed.
        """
        if self._pattern is None:
            return value, 0
        changed = 0

        def walk(node: Any) -> Any:
            nonlocal changed
            if isinstance(node, str):
                cut = self.exact(node)
                changed += cut != node
                return cut
            if isinstance(node, list):
                return [walk(item) for item in node]
            if isinstance(node, dict):
                return {walk(k): walk(v) for k, v in node.items()}
            return node

        return walk(value), changed
