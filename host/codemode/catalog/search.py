"""Capability search for ``search_api``: the contract (tokenization, matching, ranking, the
third-party rule, output bounds) is docs/reference/search.md; this module implements it.

The index is built once from the enabled capabilities and never changes; ``SearchIndex.search`` keeps
its state in locals, so one index serves concurrent searches. How it is laid out (token groups per
field, ``bisect`` for prefixes, the pigeonhole rule that expands only the most selective query
tokens) is in docs/ARCHITECTURE.md, "Search index".
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from operator import itemgetter
from typing import Any

from .stems import stem

__all__ = [
    "CONNECTORS",
    "DEFAULT_MAX_QUERY_BYTES",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_MAX_RESULTS",
    "FIELD_WEIGHTS",
    "MAX_QUERY_TOKENS",
    "MIN_PREFIX_CHARS",
    "PREFIX_FACTOR",
    "RARITY_SPAN",
    "SearchEntry",
    "SearchIndex",
    "SearchLimitError",
    "SearchResponse",
    "SearchResult",
    "normalize_query",
    "oversized_entries",
    "required_matches",
    "tokenize",
]

DEFAULT_MAX_QUERY_BYTES = 256
DEFAULT_MAX_RESULTS = 20
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024
MAX_QUERY_TOKENS = 16
MIN_PREFIX_CHARS = 3

CONNECTORS: frozenset[str] = frozenset(
    ["a", "an", "and", "by", "for", "from", "in", "of", "on", "or", "the", "to", "with"]
)

# name, search terms, summary, description; PREFIX_FACTOR * w[f] > w[f + 1] keeps field precedence.
FIELD_WEIGHTS: tuple[float, float, float, float] = (12.0, 8.0, 5.0, 3.0)
PREFIX_FACTOR = 0.75
_TERMS, _SUMMARY = 1, 2  # field positions in FIELD_WEIGHTS
# Rarity multiplies by 1 .. 1 + RARITY_SPAN; keep 1 + RARITY_SPAN < 1 / PREFIX_FACTOR and < 12/8.
RARITY_SPAN = 0.3

_RESPONSE_OPEN = '{"results":['
_RESPONSE_CLOSE = '],"truncated":false}'  # the longer of the two closings
_EMPTY_RESPONSE_BYTES = len(_RESPONSE_OPEN) + len(_RESPONSE_CLOSE)


class SearchLimitError(Exception):
    """The query exceeded its byte cap or its distinct-token limit (→ ``resource limit exceeded``).

    ``str()`` is the coarse client text; the reason is in ``reason`` for host logs only.

    Args:
        reason: which limit the query exceeded, for host logs.
    """

    def __init__(self, reason: str) -> None:
        super().__init__("resource limit exceeded")
        self.reason = reason


# --------------------------------------------------------------------------------------------------
# Tokenization
# --------------------------------------------------------------------------------------------------

# Fast pre-split: ASCII non-alphanumerics, controls and any Unicode whitespace always separate. Other
# separators (non-ASCII punctuation, symbols) stay inside a chunk and are found by _chunk_tokens.
_CHUNK_RE = re.compile(r"[^\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f\s]+")

# Character kinds.
_SEP = 0
_UPPER = 1  # Lu, Lt
_LOWER = 2  # Ll
_CASELESS = 3  # Lo
_MODIFIER = 4  # Lm: a letter with no case or script boundary of its own
_DIGIT = 5  # Nd
_MARK = 6  # Mn, Mc, Me

_CATEGORY_KIND = {
    "Lu": _UPPER,
    "Lt": _UPPER,
    "Ll": _LOWER,
    "Lo": _CASELESS,
    "Lm": _MODIFIER,
    "Nd": _DIGIT,
    "Mn": _MARK,
    "Mc": _MARK,
    "Me": _MARK,
}


def _kind(char: str) -> int:
    return _CATEGORY_KIND.get(unicodedata.category(char), _SEP)


@lru_cache(maxsize=4096)
def _fold(token: str) -> str:
    folded = token.casefold()
    normalized = unicodedata.normalize("NFKC", folded)
    if normalized != folded:
        normalized = unicodedata.normalize("NFKC", normalized.casefold())
    return normalized


def _plural_s(chunk: str, kinds: Sequence[int], start: int) -> bool:
    """True if the lowercase run starting at ``start`` is a lone ``s`` (``IDs``, ``URLsFor``)."""
    if chunk[start] != "s":
        return False
    after = start + 1
    while after < len(kinds) and kinds[after] == _MARK:
        after += 1
    return after >= len(kinds) or kinds[after] != _LOWER


@lru_cache(maxsize=1 << 16)
def _chunk_tokens(chunk: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Folded tokens of one pre-split chunk, and the extra halves of kept humps (index only)."""
    if chunk.isascii() and chunk.isalpha() and chunk.islower():
        return (chunk,), ()
    kinds = [_kind(c) for c in chunk]
    tokens: list[str] = []
    halves: list[str] = []
    start = -1  # start of the current token, -1 when none
    hump = -1  # where the kept hump of the current token begins
    protect = False  # word-initial capital whose first hump may still be kept
    word_start = True  # the next token begins a separator-delimited word
    prev_digit = False
    prev_case = _SEP  # last _UPPER/_LOWER/_CASELESS seen in the current token

    def flush(end: int) -> None:
        nonlocal start, hump
        if start >= 0:
            tokens.append(_fold(chunk[start:end]))
            if hump > 0:
                halves.append(_fold(chunk[start:hump]))
                halves.append(_fold(chunk[hump:end]))
        start = -1
        hump = -1

    n = len(chunk)
    for i in range(n):
        k = kinds[i]
        if k == _SEP or (k == _MARK and start < 0):
            flush(i)
            word_start = True
            continue
        if k == _MARK:
            continue
        is_digit = k == _DIGIT
        if start >= 0:
            split = False
            if is_digit != prev_digit:
                split = True
            elif not is_digit and k != _MODIFIER:
                if prev_case == _LOWER and k == _UPPER:
                    if protect:
                        hump = i
                        protect = False
                    else:
                        split = True
                elif prev_case == _UPPER and k == _UPPER:
                    j = i + 1
                    while j < n and kinds[j] == _MARK:
                        j += 1
                    if j < n and kinds[j] == _LOWER and not _plural_s(chunk, kinds, j):
                        split = True
                elif prev_case != _SEP and (prev_case == _CASELESS) != (k == _CASELESS):
                    split = True
                if protect and k != _LOWER:
                    # Only "Capital + lowercase…" at the start of a word is a brand-like word.
                    protect = False
            if split:
                flush(i)
                start = i
                protect = False
                prev_case = _SEP
        else:
            start = i
            protect = word_start and k == _UPPER
            word_start = False
            prev_case = _SEP
        word_start = False
        prev_digit = is_digit
        if not is_digit and k != _MODIFIER:
            prev_case = k
    flush(n)
    return tuple(tokens), tuple(halves)


def _normalize(text: str) -> str:
    return text if text.isascii() else unicodedata.normalize("NFKC", text)


def tokenize(text: str) -> list[str]:
    """Split ``text`` into case-folded tokens (docs/reference/search.md). Connectors are kept.

    Args:
        text: any text (a query, a capability's name or summary).

    Returns:
        The tokens in order, duplicates included.
    """
    out: list[str] = []
    for chunk in _CHUNK_RE.findall(_normalize(text)):
        out.extend(_chunk_tokens(chunk)[0])
    return out


def _index_tokens(text: str) -> list[str]:
    """Tokens of capability text: ``tokenize`` plus the halves of kept humps, minus connectors."""
    out: list[str] = []
    for chunk in _CHUNK_RE.findall(_normalize(text)):
        tokens, halves = _chunk_tokens(chunk)
        out.extend(tokens)
        out.extend(halves)
    return [t for t in out if t not in CONNECTORS]


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def normalize_query(query: str, max_query_bytes: int = DEFAULT_MAX_QUERY_BYTES) -> list[str]:
    """The distinct, non-connector query tokens in first-seen order.

    Args:
        query: the raw query.
        max_query_bytes: the bound on its UTF-8 bytes (checked before anything else; padding
            counts).

    Returns:
        The distinct non-connector tokens, first-seen order.

    Raises:
        ValueError: ``max_query_bytes`` is not positive.
        SearchLimitError: the query is longer than ``max_query_bytes`` or has more than
            ``MAX_QUERY_TOKENS`` distinct non-connector tokens.
    """
    if max_query_bytes < 1:
        raise ValueError("max_query_bytes must be positive")
    # Every character is at least one byte: a long string fails without being encoded.
    if len(query) > max_query_bytes or _utf8_len(query) > max_query_bytes:
        raise SearchLimitError(f"query exceeds {max_query_bytes} bytes")
    seen: dict[str, None] = {}
    for token in tokenize(query):
        if token in CONNECTORS or token in seen:
            continue
        seen[token] = None
        if len(seen) > MAX_QUERY_TOKENS:
            raise SearchLimitError(f"query has more than {MAX_QUERY_TOKENS} distinct tokens")
    return list(seen)


def required_matches(q: int) -> int:
    """Matched query tokens needed for eligibility: 1 of 1, 2 of 2, ceil(2q/3) of q ≥ 3.

    Args:
        q: the number of distinct query tokens.

    Returns:
        How many of them a capability must match.
    """
    if q <= 2:
        return q
    return -(-2 * q // 3)


# --------------------------------------------------------------------------------------------------
# Entries, results, responses
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchEntry:
    """One enabled capability as search sees it.

    Attributes:
        name: the dotted capability name.
        signature: its call signature.
        summary: its one-line summary.
        description: its longer text.
        search_terms: its extra search words.
        third_party: whether an upstream wrote the texts (how that ranks: below).
    """

    name: str
    signature: str
    summary: str
    description: str = ""
    search_terms: Sequence[str] = field(default_factory=tuple)
    #: Text written by an upstream server or document: search terms count as summary text, and
    #: equal scores rank after host capabilities.
    third_party: bool = False


@dataclass(frozen=True)
class SearchResult:
    """One ranked result of ``search_api``.

    Attributes:
        name: the dotted capability name.
        signature: its call signature.
        summary: its one-line summary.
    """

    name: str
    signature: str
    summary: str

    def to_dict(self) -> dict[str, str]:
        """One result as ``search_api`` answers it.

        Returns:
            ``{name, signature, summary}``.
        """
        return {"name": self.name, "signature": self.signature, "summary": self.summary}


@dataclass(frozen=True)
class SearchResponse:
    """``search_api``'s answer: ``results`` (the ranked :class:`SearchResult` s, at most
    ``max_search_results``) and ``truncated`` (more matched than fit the bounds)."""

    results: list[SearchResult]
    truncated: bool

    def to_dict(self) -> dict[str, Any]:
        """``search_api``'s answer as JSON (docs/reference/search.md).

        Returns:
            ``{results: [{name, signature, summary}], truncated}``.
        """
        return {"results": [r.to_dict() for r in self.results], "truncated": self.truncated}


def _compact_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _result_bytes(entry: SearchEntry) -> int:
    item = {"name": entry.name, "signature": entry.signature, "summary": entry.summary}
    return _utf8_len(_compact_json(item))


def oversized_entries(
    entries: Iterable[SearchEntry], max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
) -> list[str]:
    """Names of entries whose single search result cannot fit a response of ``max_response_bytes``.

    Args:
        entries: the search entries.
        max_response_bytes: the bound on a whole search response, in bytes.

    Returns:
        The names of the entries too large for it.
    """
    return [e.name for e in entries if _EMPTY_RESPONSE_BYTES + _result_bytes(e) > max_response_bytes]


# --------------------------------------------------------------------------------------------------
# Index
# --------------------------------------------------------------------------------------------------

# (contribution, capability ids) — one group per (token, strongest field).
_Group = tuple[float, frozenset[int]]


def _rarity(n: int, df: int) -> float:
    if n < 2:
        return 1.0
    return 1.0 + RARITY_SPAN * math.log(n / df) / math.log(n)


class SearchIndex:
    """An immutable inverted index over the enabled capabilities.

    Args:
        entries: the enabled capabilities as search sees them.
        max_results: results per response, at least 1.
        max_response_bytes: the bound on a response's compact JSON, in bytes.

    Raises:
        ValueError: ``max_results`` is below 1 or ``max_response_bytes`` below an empty response.
    """

    def __init__(
        self,
        entries: Iterable[SearchEntry],
        max_results: int = DEFAULT_MAX_RESULTS,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if max_results < 1:
            raise ValueError("max_results must be at least 1")
        if max_response_bytes < _EMPTY_RESPONSE_BYTES:
            raise ValueError(f"max_response_bytes must be at least {_EMPTY_RESPONSE_BYTES}")
        self.max_results = max_results
        self.max_response_bytes = max_response_bytes

        ordered = sorted(entries, key=lambda e: e.name)
        self._results: tuple[SearchResult, ...] = tuple(
            SearchResult(e.name, e.signature, e.summary) for e in ordered
        )
        self._result_bytes: tuple[int, ...] = tuple(_result_bytes(e) for e in ordered)
        self._third_party: tuple[bool, ...] = tuple(e.third_party for e in ordered)
        by_folded: dict[str, list[int]] = {}
        for doc, e in enumerate(ordered):
            by_folded.setdefault(e.name.casefold(), []).append(doc)
        self._by_folded_name: dict[str, tuple[int, ...]] = {k: tuple(v) for k, v in by_folded.items()}

        # token -> per field, the capabilities whose strongest field for the token is that field.
        # The namespace (the name's first segment) is name text that matches only as a whole token:
        # `pet` finds `petstore.add_pet` by its own words, not every operation of the `petstore`
        # namespace. So a token has two postings per capability: its strongest field for an exact
        # match (the namespace counting as name text), and its strongest other field for a prefix.
        exact_postings: dict[str, list[list[int]]] = {}
        prefix_postings: dict[str, list[list[int]]] = {}
        for doc, e in enumerate(ordered):
            namespace, _, operation = e.name.partition(".")
            strongest: dict[str, int] = {}
            texts: tuple[tuple[int, Iterable[str]], ...] = (
                (0, (operation,)),
                (_TERMS, e.search_terms),
                (_SUMMARY, (e.summary,)),
                (3, (e.description,)),
            )
            for fld, parts in texts:
                where = _SUMMARY if fld == _TERMS and e.third_party else fld
                for part in parts:
                    for token in _index_tokens(part):
                        strongest.setdefault(token, where)
            for token, fld in strongest.items():
                prefix_postings.setdefault(token, [[] for _ in FIELD_WEIGHTS])[fld].append(doc)
            for token in set(_index_tokens(namespace)):
                if strongest.get(token) != 0:  # namespace tokens are name text for exact matches
                    strongest[token] = 0
            for token, fld in strongest.items():
                exact_postings.setdefault(token, [[] for _ in FIELD_WEIGHTS])[fld].append(doc)

        n = len(ordered)
        self._vocab: list[str] = sorted(exact_postings)
        self._position: dict[str, int] = {t: i for i, t in enumerate(self._vocab)}
        exact: list[tuple[_Group, ...]] = []
        prefix: list[tuple[_Group, ...]] = []
        for token in self._vocab:
            lists = exact_postings[token]
            rarity = _rarity(n, sum(len(docs) for docs in lists))
            exact.append(tuple((FIELD_WEIGHTS[f] * rarity, frozenset(d)) for f, d in enumerate(lists) if d))
            others = prefix_postings.get(token, [])
            prefix.append(
                tuple(
                    (FIELD_WEIGHTS[f] * rarity * PREFIX_FACTOR, frozenset(d))
                    for f, d in enumerate(others)
                    if d
                )
            )
        self._exact: tuple[tuple[_Group, ...], ...] = tuple(exact)
        self._prefix: tuple[tuple[_Group, ...], ...] = tuple(prefix)
        # stem -> the vocabulary positions of its tokens: an inflection matches like a prefix.
        by_stem: dict[str, list[int]] = {}
        for i, token in enumerate(self._vocab):
            by_stem.setdefault(stem(token), []).append(i)
        self._by_stem: dict[str, tuple[int, ...]] = {k: tuple(v) for k, v in by_stem.items()}

    def __len__(self) -> int:
        return len(self._results)

    @property
    def vocabulary_size(self) -> int:
        """The number of distinct tokens indexed."""
        return len(self._vocab)

    def _token_groups(self, token: str) -> list[_Group]:
        """The (contribution, capabilities) groups one query token matches, strongest first."""
        groups: list[_Group] = []
        position = self._position.get(token)
        if position is not None:
            groups.extend(self._exact[position])
        lo = hi = 0
        if len(token) >= MIN_PREFIX_CHARS:
            lo = bisect.bisect_right(self._vocab, token)  # skips the exact token itself
            hi = bisect.bisect_left(self._vocab, token + "\U0010ffff", lo)
            for i in range(lo, hi):
                groups.extend(self._prefix[i])
        # Another inflection of the word (same stem) matches as a prefix does, unless it already did.
        for i in self._by_stem.get(stem(token), ()):
            if i != position and not lo <= i < hi:
                groups.extend(self._prefix[i])
        if len(groups) > 1:
            groups.sort(key=itemgetter(0), reverse=True)
        return groups

    @staticmethod
    def _strongest(groups: list[_Group]) -> dict[int, float]:
        """Each matching capability's strongest contribution (groups are strongest first)."""
        if len(groups) == 1:
            value, docs = groups[0]
            return dict.fromkeys(docs, value)
        best: dict[int, float] = {}
        for value, docs in groups:
            missing = docs.difference(best)
            if missing:
                best.update(dict.fromkeys(missing, value))
        return best

    @staticmethod
    def _strongest_among(groups: list[_Group], candidates: set[int]) -> dict[int, float]:
        """``_strongest`` restricted to ``candidates`` (set intersection iterates the smaller side)."""
        best: dict[int, float] = {}
        remaining = set(candidates)
        for value, docs in groups:
            hit = docs.intersection(remaining)
            if hit:
                best.update(dict.fromkeys(hit, value))
                remaining -= hit
                if not remaining:
                    break
        return best

    def _scores(self, tokens: list[str]) -> dict[int, float]:
        """Score of every eligible capability."""
        q = len(tokens)
        need = required_matches(q)
        groups = [self._token_groups(t) for t in tokens]
        # Pigeonhole: a capability that matches `need` of the q tokens matches at least one of any
        # q - need + 1 of them, so the union of the smallest q - need + 1 token sets holds every
        # eligible capability. Only those are materialized in full; the rest are probed for them.
        bound = [sum(len(docs) for _, docs in g) for g in groups]
        order = sorted(range(q), key=bound.__getitem__)
        drivers = order[: q - need + 1]
        per_token: list[dict[int, float]] = [{} for _ in range(q)]
        candidates: set[int] = set()
        for i in drivers:
            per_token[i] = self._strongest(groups[i])
            candidates.update(per_token[i])
        if q == 1:
            return per_token[0]
        if not candidates:
            return {}
        for i in order[q - need + 1 :]:
            per_token[i] = self._strongest_among(groups[i], candidates)
        if need == q:
            # Every token must match: intersect the key sets in C, then add.
            common = candidates
            for best in per_token:
                common = common.intersection(best)
            eligible: Iterable[int] = common
        else:
            counts = Counter[int]()
            for best in per_token:
                counts.update(best.keys())
            eligible = [d for d, c in counts.items() if c >= need]
        scores: dict[int, float] = {}
        for d in eligible:
            total = 0.0
            for best in per_token:
                total += best.get(d, 0.0)
            scores[d] = total
        return scores

    def search(self, query: str, max_query_bytes: int = DEFAULT_MAX_QUERY_BYTES) -> SearchResponse:
        """Rank the enabled capabilities for ``query`` (docs/reference/search.md).

        Args:
            query: the raw query.
            max_query_bytes: the bound on its UTF-8 bytes.

        Returns:
            The ranked results that fit the bounds, and whether more matched.
        """
        tokens = normalize_query(query, max_query_bytes)
        exact_docs = self._by_folded_name.get(query.strip().casefold(), ())
        if not tokens and not exact_docs:
            return SearchResponse([], False)

        scores = self._scores(tokens) if tokens else {}

        for d in exact_docs:
            scores.pop(d, None)
        total = len(exact_docs) + len(scores)
        if total == 0:
            return SearchResponse([], False)

        limit = self.max_results
        ranked: list[int] = list(exact_docs[:limit])
        if len(ranked) < limit and scores:
            wanted = limit - len(ranked)
            pool: Iterable[int] = scores
            if len(scores) > 4 * wanted:
                # Only capabilities scoring at least the wanted-th best score can be ranked.
                threshold = heapq.nlargest(wanted, scores.values())[-1]
                pool = [d for d, v in scores.items() if v >= threshold]
            # Score descending, then host before third-party, then name (ids are in name order).
            third = self._third_party
            ordered = sorted(pool, key=lambda d: (-scores[d], third[d], d))
            ranked.extend(ordered[:wanted])

        results: list[SearchResult] = []
        used = _EMPTY_RESPONSE_BYTES
        for d in ranked:
            size = self._result_bytes[d] + (1 if results else 0)
            if used + size > self.max_response_bytes:
                break
            used += size
            results.append(self._results[d])
        return SearchResponse(results, len(results) < total)
