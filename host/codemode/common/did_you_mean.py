"""The one "did you mean" of the command's flags, the settings' keys and tables, and the shipped packs'
tables (re-exported by ``codemode.packs``): the known name closest to a misspelt one, by difflib's
similarity ratio. ``describe_api``'s suggestion of a capability is another rule
(``codemode.catalog.suggest``)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["CUTOFF", "closest", "did_you_mean"]

#: The least similarity (difflib's ratio, 0 to 1) a known name needs to be suggested.
CUTOFF = 0.75


def closest(given: str, known: Iterable[str], *, cutoff: float | None = None) -> str | None:
    """The known name most like ``given``.

    Args:
        given: what was written.
        known: the names it may have meant.
        cutoff: the least similarity (default :data:`CUTOFF`).

    Returns:
        That name, or None when none is similar enough.
    """
    close = difflib.get_close_matches(given, list(known), n=1, cutoff=CUTOFF if cutoff is None else cutoff)
    return close[0] if close else None


def did_you_mean(given: str, known: Iterable[str], *, cutoff: float | None = None) -> str:
    """The hint that ends a one-line error about a misspelt name.

    Args:
        given: what was written.
        known: the names it may have meant.
        cutoff: the least similarity (default :data:`CUTOFF`).

    Returns:
        `` (did you mean 'pool'?)``, or ``""`` when no name is similar enough.
    """
    name = closest(given, known, cutoff=cutoff)
    return f" (did you mean {name!r}?)" if name is not None else ""
