"""Third-party text in search (docs/reference/search.md, "Third-party capabilities"): a capability
whose text an upstream server or document wrote never outranks a host capability for the host
capability's own words (its name, search terms or summary) unless its name has those words too."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from codemode.catalog.search import CONNECTORS, SearchEntry, SearchIndex, tokenize


def entry(
    name: str,
    summary: str = "Does a thing.",
    description: str = "",
    terms: Sequence[str] = (),
    *,
    third_party: bool = False,
) -> SearchEntry:
    return SearchEntry(
        name=name,
        signature=f"{name}()",
        summary=summary,
        description=description,
        search_terms=list(terms),
        third_party=third_party,
    )


def names(index: SearchIndex, query: str) -> list[str]:
    return [r.name for r in index.search(query).results]


def test_equal_scores_put_host_capabilities_first() -> None:
    # same text, same field: the third-party one sorts first by name but ranks second
    index = SearchIndex(
        [
            entry("a.export", "Export data."),
            entry("z.export", "Export data."),
            entry("b.export", "Export data."),
        ]
    )
    assert names(index, "export") == ["a.export", "b.export", "z.export"]
    index = SearchIndex(
        [
            entry("a.export", "Export data.", third_party=True),
            entry("z.export", "Export data."),
            entry("b.export", "Export data.", third_party=True),
        ]
    )
    assert names(index, "export") == ["z.export", "a.export", "b.export"]


def test_third_party_search_terms_count_as_summary_text() -> None:
    host_summary = entry("z.host", "Ledger report.")
    host_terms = entry("y.host", terms=["ledger report"])
    upstream = entry("a.up", terms=["ledger report"], third_party=True)
    index = SearchIndex([host_summary, host_terms, upstream])
    # host terms (8) > host summary (5) = third-party terms (5, ties go to the host)
    assert names(index, "ledger report") == ["y.host", "z.host", "a.up"]
    # ... but third-party terms still beat a host description (3)
    index = SearchIndex([entry("z.host", "Other.", "Ledger report."), upstream])
    assert names(index, "ledger report") == ["a.up", "z.host"]


def _words(text: str) -> list[str]:
    return list(dict.fromkeys(t for t in tokenize(text) if t not in CONNECTORS))


def test_stuffed_third_party_text_never_outranks_a_host_capability_for_its_own_words() -> None:
    rng = random.Random(20)
    vocab = "records search list filtered exact tag create store new note get fetch one id update change"
    vocab += " title body tags delete remove erase browse documents query items find notes entries memo"
    words = vocab.split()
    for trial in range(200):
        hosts = []
        for i in range(rng.randint(1, 6)):
            name = f"{rng.choice(words)}.{rng.choice(words)}{i}"
            summary = " ".join(rng.sample(words, rng.randint(2, 8))).capitalize() + "."
            hosts.append(
                entry(
                    name,
                    summary,
                    " ".join(rng.sample(words, rng.randint(0, 12))),
                    [" ".join(rng.sample(words, 2)) for _ in range(rng.randint(0, 4))],
                )
            )
        everything = " ".join(words)
        # an upstream writes every word everywhere it can, many times, under a name without them
        hostile = [
            entry(
                f"{ns}.helper", (everything + ". ") * 3, everything * 50, [everything] * 16, third_party=True
            )
            for ns in ("a", "zz")
        ]
        index = SearchIndex([*hosts, *hostile], max_results=len(hosts) + 2)
        for host in hosts:
            own = _words(" ".join([host.name, host.summary, *host.search_terms]))
            for k in (1, 2, 3, 5):
                for query_words in itertools.islice(itertools.combinations(own, min(k, len(own))), 4):
                    query = " ".join(rng.sample(list(query_words), len(query_words)))
                    ranked = names(index, query)
                    assert host.name in ranked, (trial, query, ranked)  # all its words: eligible
                    position = ranked.index(host.name)
                    for h in hostile:
                        assert h.name not in ranked[:position], (trial, query, ranked)
