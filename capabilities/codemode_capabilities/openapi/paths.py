"""Path parameter values that stay inside their own segment of the declared route.

A backend decodes the request path before it routes it (Starlette and ``http.server`` turn ``%2F``
into ``/``; proxies may decode a second time; Tomcat reads ``..;x`` as ``..``; Windows drops
trailing dots; some servers fold Unicode compatibility forms such as ``．`` to ``.``). So a value is
judged by every form a backend might make of it, not by its encoding:

* **one segment** (the default): no ``/`` and no ``\\``, no ``%XX`` or ``%uXXXX`` escape (a second
  decoding would turn it into any character, overlong dots included), no control character, not
  empty, and not made only of dots and spaces (before any ``;``). The value and its NFKC form are
  both checked.
* **multi-segment** (a parameter the operator lists in ``multi_segment_parameters``): the same, but
  ``/`` separates segments, and each segment must pass the rules above (so no empty, ``.`` or
  ``..`` segment and no leading or trailing ``/``).

An accepted value is percent-encoded segment by segment (``quote(..., safe="")``). A refused one
raises :class:`codemode.InvalidArguments` with a diagnostic naming the argument: the client sees
``invalid capability arguments: argument "<keyword>" must be ...`` and no request is made.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import quote

from codemode import InvalidArguments

__all__ = ["ONE_SEGMENT", "SEGMENTS", "encode_path_value"]

ONE_SEGMENT = (
    "must be one URL path segment: no '/', '\\', '%XX' escapes or control characters, "
    "not empty and not only dots"
)
SEGMENTS = (
    "must be a relative path of URL path segments: no '\\', '%XX' escapes or control characters, "
    "no empty segment and no segment of only dots"
)

_ESCAPE = re.compile(r"%(?:[0-9A-Fa-f]{2}|[uU][0-9A-Fa-f]{4})")
_CONTROL = frozenset(("Cc", "Cf", "Zl", "Zp"))


def _bad_segment(segment: str) -> bool:
    head = segment.split(";", 1)[0]  # servlet containers drop ";params" before they resolve dots
    return not head.strip(". \t")


def _bad_text(text: str) -> bool:
    return (
        "\\" in text
        or _ESCAPE.search(text) is not None
        or any(unicodedata.category(ch) in _CONTROL for ch in text)
    )


def encode_path_value(keyword: str, text: str, *, multi_segment: bool = False) -> str:
    """``text`` percent-encoded for its place in the path (the rules: the module text).

    Args:
        keyword: the argument's keyword, for the diagnostic.
        text: the value.
        multi_segment: whether ``/`` may separate segments of it.

    Returns:
        The value percent-encoded segment by segment.

    Raises:
        InvalidArguments: the value or its NFKC form breaks the rules (the diagnostic names the
            argument).
    """
    forms = {text, unicodedata.normalize("NFKC", text)}
    for form in forms:
        segments = form.split("/")
        if _bad_text(form) or (not multi_segment and len(segments) > 1) or any(map(_bad_segment, segments)):
            raise InvalidArguments(f'argument "{keyword}" {SEGMENTS if multi_segment else ONE_SEGMENT}')
    return "/".join(quote(segment, safe="") for segment in text.split("/"))
