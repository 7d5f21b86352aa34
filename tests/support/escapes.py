"""What a client could read out of a text it is shown (the credential-redaction tests' own view)."""

from __future__ import annotations

import html
import re
from urllib.parse import unquote_plus

_UNICODE = re.compile(r"\\u([0-9a-fA-F]{4})")


def read_out(text: str) -> str:
    """``text`` with its JSON ``\\uXXXX`` and ``\\\\`` escapes, HTML character references and percent
    escapes decoded until nothing changes (eight rounds at most), ``+`` a space."""
    for _ in range(8):
        before = text
        text = _UNICODE.sub(lambda m: chr(int(m.group(1), 16)), text).replace("\\\\", "\\")
        text = unquote_plus(html.unescape(text))
        if text == before:
            break
    return text
