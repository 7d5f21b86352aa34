"""English inflections for search: the Snowball (Porter2) stem of a token (docs/reference/search.md,
"Matching"). ``entities`` and ``entity`` share the stem ``entiti``; ``create``, ``created`` and
``creating`` share ``creat``.

Only tokens of ASCII letters are stemmed (the stemmer is English); any other token is its own stem.
The stemmer object keeps state between calls, so calls are serialized; stems are cached, so a
running server stems each distinct query word once.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import snowballstemmer

__all__ = ["stem"]

_STEMMER = snowballstemmer.stemmer("english")
_LOCK = threading.Lock()


@lru_cache(maxsize=1 << 16)
def stem(token: str) -> str:
    """The English stem of a folded token.

    Args:
        token: one token as ``codemode.catalog.search.tokenize`` returns it.

    Returns:
        Its stem; the token itself when it is not made of ASCII letters.
    """
    if not (token.isascii() and token.isalpha()):
        return token
    with _LOCK:
        return str(_STEMMER.stemWord(token))
