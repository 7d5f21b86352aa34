"""What every store implementation shares: the limit kinds, what a record's bytes are, which texts a
store refuses, and when a record has expired. One module so the backends cannot drift apart."""

from __future__ import annotations

__all__ = [
    "STATE_BYTES",
    "STATE_KEYS",
    "SUSPENSIONS",
    "SUSPENSION_BYTES",
    "check_texts",
    "expired",
    "state_size",
    "storable",
]

#: The limit kinds of :class:`codemode.store.StoreFull` (docs/reference/limits.md).
SUSPENSIONS = "suspensions"
SUSPENSION_BYTES = "suspension bytes"
STATE_KEYS = "state keys"
STATE_BYTES = "state bytes"


def check_texts(*texts: str) -> None:
    """Refuse a text no backend can keep exactly.

    PostgreSQL's ``text`` cannot hold U+0000 and a lone surrogate has no UTF-8 form; a JSON text the
    host produced holds neither (``json.dumps`` escapes both), so only a caller's bug or a hostile
    key or subject id gets here, and it is refused the same way by every backend.

    Args:
        texts: the texts (ids, keys, values, sources).

    Raises:
        ValueError: a text holds U+0000 or a lone surrogate.
    """
    for text in texts:
        if "\x00" in text:
            raise ValueError("a stored text may not hold U+0000")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a stored text must be valid Unicode (no lone surrogate)") from None


def storable(*texts: str) -> bool:
    """Whether every text could have been stored (:func:`check_texts` passes): a lookup by a text
    that could not is answered "absent" by every backend, without asking the database.

    Args:
        texts: the texts.

    Returns:
        True when all of them could be stored.
    """
    try:
        check_texts(*texts)
    except ValueError:
        return False
    return True


def state_size(key: str, value: str) -> int:
    """UTF-8 bytes one state key holds (its key and its value): what ``state bytes`` counts.

    Args:
        key: the key.
        value: the value's JSON text.

    Returns:
        The bytes.
    """
    return len(key.encode("utf-8")) + len(value.encode("utf-8"))


def expired(expires: float | None, now: float) -> bool:
    """Whether a record whose time is ``expires`` is gone at ``now`` (its last instant is excluded).

    Args:
        expires: when it expires (None: never).
        now: the time.

    Returns:
        True once ``now`` reached ``expires``.
    """
    return expires is not None and expires <= now
