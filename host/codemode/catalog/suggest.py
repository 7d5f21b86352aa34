"""The closest capability name to a near miss, for ``describe_api``'s ``capability not found``
(docs/reference/describe.md): ``records.creat`` → ``did you mean records.create?``.

Suggestions come only from the names given (the enabled catalog, which ``search_api`` shows every
caller), so a suggestion names nothing the caller could not find by searching.
"""

from __future__ import annotations

from collections.abc import Sequence

from rapidfuzz import fuzz, process

__all__ = ["SUGGEST_CUTOFF", "Suggester"]

#: The least similarity (rapidfuzz's ``fuzz.ratio``, 0..100: the share of characters the two
#: case-folded names have in common, in order) a suggestion needs.
SUGGEST_CUTOFF = 80.0


class Suggester:
    """The closest of a fixed set of names.

    Args:
        names: the names a suggestion may be; ties go to the first in sorted order.
    """

    def __init__(self, names: Sequence[str]) -> None:
        ordered = sorted(set(names))
        self._by_folded: dict[str, str] = {}
        for name in ordered:
            self._by_folded.setdefault(name.casefold(), name)
        self._folded = list(self._by_folded)
        # A text more than twice as long as every name cannot reach the cutoff (the ratio is at most
        # 2 * shorter / (both lengths)): such a miss costs no comparison.
        self._longest = 2 * max((len(n) for n in self._folded), default=0)

    def closest(self, text: str) -> str | None:
        """The name most like ``text``.

        Args:
            text: what the caller asked for (not a name of the set).

        Returns:
            The closest name when it is similar enough (``SUGGEST_CUTOFF``), else None.
        """
        if not isinstance(text, str) or not text or len(text) > self._longest:
            return None
        folded = text.casefold()
        # The first best in sorted order (deterministic); rapidfuzz's C code keeps a miss against
        # the largest catalog (4,096 names) near a millisecond, so misses cannot starve the loop.
        found = process.extractOne(folded, self._folded, scorer=fuzz.ratio, score_cutoff=SUGGEST_CUTOFF)
        return self._by_folded[found[0]] if found is not None else None
