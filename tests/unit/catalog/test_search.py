"""Search and tokenization (docs/reference/search.md): table-driven where the behaviour is a table."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from codemode.catalog.search import (
    CONNECTORS,
    FIELD_WEIGHTS,
    MAX_QUERY_TOKENS,
    MIN_PREFIX_CHARS,
    PREFIX_FACTOR,
    RARITY_SPAN,
    SearchEntry,
    SearchIndex,
    SearchLimitError,
    SearchResponse,
    _index_tokens,
    normalize_query,
    oversized_entries,
    required_matches,
    tokenize,
)
from codemode.catalog.stems import stem

EMPTY = {"results": [], "truncated": False}


def entry(
    name: str, summary: str = "Does a thing.", description: str = "", terms: Sequence[str] = ()
) -> SearchEntry:
    return SearchEntry(
        name=name, signature=f"{name}()", summary=summary, description=description, search_terms=list(terms)
    )


def names(index: SearchIndex, query: str) -> list[str]:
    return [r.name for r in index.search(query).results]


def encoded_size(response: SearchResponse) -> int:
    return len(json.dumps(response.to_dict(), separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


# --------------------------------------------------------------------------------------------------
# Tokenization
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        # the example of docs/reference/search.md
        ("GitHub.Pulls.createReview", ["github", "pulls", "create", "review"]),
        # camelCase
        ("createReview", ["create", "review"]),
        ("listAllOpenPulls", ["list", "all", "open", "pulls"]),
        ("gitHub", ["git", "hub"]),  # starts lowercase: always split
        ("iPhone", ["i", "phone"]),
        # acronym → word
        ("HTTPServer", ["http", "server"]),
        ("XMLHttpRequest", ["xml", "http", "request"]),
        ("getHTTPResponse", ["get", "http", "response"]),
        ("IOError", ["io", "error"]),
        ("HTTPS", ["https"]),
        ("IDs", ["ids"]),  # plural s is not a word
        ("listURLsForRepo", ["list", "urls", "for", "repo"]),
        # brand-like words keep their first hump (so the documented example holds), only at word start
        ("MySQL", ["mysql"]),
        ("PostgreSQL", ["postgresql"]),
        ("JavaScript", ["javascript"]),
        ("GitHubAPI", ["github", "api"]),
        ("GitHubPullRequest", ["github", "pull", "request"]),
        ("OAuth", ["o", "auth"]),
        # letter ↔ digit
        ("v2api", ["v", "2", "api"]),
        ("sha256", ["sha", "256"]),
        ("ipv6Address", ["ipv", "6", "address"]),
        ("S3Bucket", ["s", "3", "bucket"]),
        ("OAuth2", ["o", "auth", "2"]),
        ("2fa", ["2", "fa"]),
        ("x²", ["x", "2"]),  # NFKC: superscript two is the digit 2
        ("١٢٣abc", ["١٢٣", "abc"]),  # Arabic-Indic digits are digits
        # Unicode letters, case folding
        ("données", ["données"]),
        ("donne\u0301es", ["données"]),  # decomposed accent: same token
        ("Größe", ["grösse"]),  # casefold, not lower
        ("GRÖSSE", ["grösse"]),
        ("ΟΔΟΣ", ["οδοσ"]),
        ("οδος", ["οδοσ"]),  # final sigma folds to sigma
        ("ＧｉｔＨｕｂ", ["github"]),  # full-width forms
        ("検索する", ["検索する"]),  # CJK run: one token
        ("APIキー", ["api", "キー"]),  # cased ↔ caseless script boundary; ー (Lm) joins
        ("हिन्दी", ["हिन्दी"]),  # combining vowel signs stay in the token
        ("\u0301abc", ["abc"]),  # a mark with nothing before it separates
        # separators
        ("snake_case-kebab.dot/slash", ["snake", "case", "kebab", "dot", "slash"]),
        ("foo—bar…baz", ["foo", "bar", "baz"]),
        ("a+b=c", ["a", "b", "c"]),
        ("deploy🚀now", ["deploy", "now"]),
        ("  \t\n ", []),
        ("...___---", []),
        ("", []),
        # tokenize keeps connectors; queries drop them
        ("the invoice", ["the", "invoice"]),
    ],
)
def test_tokenize(text: str, tokens: list[str]) -> None:
    assert tokenize(text) == tokens


# --------------------------------------------------------------------------------------------------
# Query normalization: connectors, dedupe, limits
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "tokens"),
    [
        ("create a draft for the invoice", ["create", "draft", "invoice"]),
        ("invoice Invoice INVOICE invoices", ["invoice", "invoices"]),
        ("sync from GitHub to GitLab with tokens", ["sync", "github", "gitlab", "tokens"]),
        (" ".join(sorted(CONNECTORS)), []),
        ("The Of AND", []),
        ("   ", []),
    ],
)
def test_normalize_query(query: str, tokens: list[str]) -> None:
    assert normalize_query(query) == tokens


WORDS = [f"w{chr(ord('a') + i)}x" for i in range(20)]  # wax wbx wcx ...: distinct, no prefixes


@pytest.mark.parametrize(
    ("query", "ok"),
    [
        (" ".join(WORDS[:16]), True),
        (" ".join(WORDS[:17]), False),
        (" ".join(WORDS[:16] + WORDS[:16]), True),  # duplicates don't count
        (" ".join(WORDS[:16]).upper(), True),
        ("the " + " and ".join(WORDS[:16]) + " of a", True),  # connectors don't count
        (".".join(WORDS[:17]), False),
    ],
)
def test_token_limit(query: str, ok: bool) -> None:
    index = SearchIndex([entry("a.b")])
    if ok:
        assert len(normalize_query(query)) == MAX_QUERY_TOKENS
        index.search(query)
    else:
        with pytest.raises(SearchLimitError):
            normalize_query(query)
        with pytest.raises(SearchLimitError) as err:
            index.search(query)
        assert str(err.value) == "resource limit exceeded"


@pytest.mark.parametrize(
    ("query", "limit", "ok"),
    [
        ("x" * 256, 256, True),
        ("x" * 257, 256, False),
        ("x" + " " * 255, 256, True),
        ("x" + " " * 256, 256, False),  # padding counts
        (" " * 257, 256, False),  # checked before trimming: a blank query can still be too long
        ("é" * 128, 256, True),  # UTF-8 bytes, not characters
        ("é" * 128 + "x", 256, False),
        ("日" * 85 + "x", 256, True),  # 255 + 1
        ("日" * 86, 256, False),  # 258
        ("abcd", 4, True),
        ("abcde", 4, False),
    ],
)
def test_byte_limit(query: str, limit: int, ok: bool) -> None:
    index = SearchIndex([entry("a.b")])
    if ok:
        index.search(query, max_query_bytes=limit)
    else:
        with pytest.raises(SearchLimitError):
            index.search(query, max_query_bytes=limit)


def test_default_byte_limit_is_256() -> None:
    index = SearchIndex([entry("a.b")])
    index.search("y" * 256)
    with pytest.raises(SearchLimitError):
        index.search("y" * 257)


def test_byte_limit_is_checked_before_token_limit() -> None:
    with pytest.raises(SearchLimitError) as err:
        normalize_query(" ".join(WORDS), max_query_bytes=10)
    assert "bytes" in err.value.reason


# --------------------------------------------------------------------------------------------------
# Blank and empty answers
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "",
        "   ",
        "\t\n",
        "...",
        "___",
        "-- // ::",
        "🚀",
        "the of and",
        "a an the",
        "zzzz",
        "records zzzz",
        "lookup zzzz qqqq",
    ],
)
def test_blank_connector_only_and_no_match(query: str) -> None:
    index = SearchIndex([entry("records.lookup", "Look up one record by key."), entry("records.list")])
    assert index.search(query).to_dict() == EMPTY


def test_empty_index() -> None:
    assert SearchIndex([]).search("anything").to_dict() == EMPTY


# --------------------------------------------------------------------------------------------------
# Eligibility
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("q", "need"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 4), (6, 4), (7, 5), (16, 11)])
def test_required_matches(q: int, need: int) -> None:
    assert required_matches(q) == need


ELIGIBILITY_WORDS = ["amber", "birch", "cedar", "dune", "ember", "fjord", "grove"]


@pytest.mark.parametrize("q", [1, 2, 3, 4, 7])
def test_eligibility(q: int) -> None:
    need = {1: 1, 2: 2, 3: 2, 4: 3, 7: 5}[q]
    words = ELIGIBILITY_WORDS[:q]
    index = SearchIndex(
        [
            entry("caps.hit", description=" ".join(words[:need])),
            entry("caps.miss", description=" ".join(words[: need - 1]) or "nothing here"),
            entry("caps.all", description=" ".join(words)),
        ]
    )
    # the words are spread out of order in the query: order doesn't matter
    found = names(index, " ".join(reversed(words)))
    assert "caps.hit" in found
    assert "caps.all" in found
    assert "caps.miss" not in found


# --------------------------------------------------------------------------------------------------
# Matching: exact and prefix
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ("records", True),
        ("record", True),  # prefix of "records"
        ("rec", True),  # 3 characters: prefix allowed
        ("re", False),  # 2 characters: exact only
        ("ke", False),
        ("key", True),
        ("recordsx", False),
        ("cords", False),  # no infix matching
        ("looking", True),  # an inflection of "look" (same stem)
        ("look", True),
        ("records", True),
        ("entries", True),  # "entry": plural and singular share a stem
        ("created", True),  # "create" (in createReview)
        ("lookup", False),  # a different word: no stem in common with "look"
        ("review", True),  # camelCase part of the name
        ("createreview", False),  # ... which is two tokens
        ("fetch", True),  # search term
        ("fetc", True),
        ("retrieve", False),  # no synonyms
    ],
)
def test_exact_and_prefix_matching(query: str, found: bool) -> None:
    index = SearchIndex([entry("records.createReview", "Look up one record by key.", terms=["fetch entry"])])
    assert (names(index, query) == ["records.createReview"]) is found


@pytest.mark.parametrize(
    ("text", "query", "found"),
    [
        ("Größe", "GRÖSSE", True),
        ("Größe", "gröss", True),  # prefix counted in characters
        ("Größe", "groesse", False),  # no transliteration
        ("données", "donne\u0301es", True),
        ("données", "DONNÉES", True),
        ("日本語版", "日本語", True),  # 3 characters: prefix
        ("日本語版", "日本", False),  # 2 characters: exact only
        ("Opens a PullRequest.", "pull request", True),  # halves of a kept hump are indexed
        ("Opens a PullRequest.", "PullRequest", True),
        ("Works with GitHub.", "hub", True),
        ("Works with GitHub.", "git", True),
        ("Copies data from a bucket.", "fro", False),  # connectors are not indexed
        ("Copies data from a bucket.", "buc", True),
    ],
)
def test_text_matching(text: str, query: str, found: bool) -> None:
    index = SearchIndex([entry("x.y", description=text)])
    assert (names(index, query) == ["x.y"]) is found


def test_search_terms_are_never_returned() -> None:
    index = SearchIndex([entry("x.y", terms=["secret phrase"])])
    response = index.search("secret phrase").to_dict()
    assert response == {
        "results": [{"name": "x.y", "signature": "x.y()", "summary": "Does a thing."}],
        "truncated": False,
    }


# --------------------------------------------------------------------------------------------------
# Ranking
# --------------------------------------------------------------------------------------------------


def test_exact_dotted_name_ranks_first() -> None:
    index = SearchIndex(
        [
            entry("records.lookup", "Look up one record by key."),
            entry("lookup.records", "Records lookup records.", terms=["records lookup"]),
            entry("alpha.records", "Lookup of records, records lookup.", terms=["records", "lookup"]),
        ]
    )
    # without the exact-name rule, lookup.records would win on score and then on name
    assert names(index, "records lookup")[0] != "records.lookup"
    for query in ["records.lookup", "RECORDS.LOOKUP", "  Records.Lookup \n", "\trecords.lookup"]:
        assert names(index, query)[0] == "records.lookup"
    # not exact: different separator
    assert names(index, "records_lookup")[0] != "records.lookup"


def test_exact_dotted_name_ranks_first_even_when_tokens_would_not_match() -> None:
    # "GitHub.sync" tokenizes to github sync; the name gitHub.sync to git hub sync
    index = SearchIndex([entry("gitHub.sync"), entry("other.sync")])
    assert names(index, "github sync") == []
    assert names(index, "GitHub.sync") == ["gitHub.sync"]


def test_exact_beats_prefix() -> None:
    # alphabetical order would favour the prefix match
    index = SearchIndex([entry("zeta.invoice"), entry("alpha.invoices")])
    assert names(index, "invoice") == ["zeta.invoice", "alpha.invoices"]


def test_exact_beats_prefix_regardless_of_rarity() -> None:
    # "ledger" is in every filler (common); "ledgers" only once (rare): exact in the name still wins
    fillers = [entry(f"f.filler{i}", description="Ledger entry.") for i in range(50)]
    index = SearchIndex([entry("z.ledger"), entry("a.ledgers"), *fillers])
    assert names(index, "ledger")[:2] == ["z.ledger", "a.ledgers"]


def test_field_beats_lower_field_regardless_of_rarity() -> None:
    # a common token matched in the name beats a rare one matched in the search terms
    fillers = [entry(f"f.filler{i}", description="Ledger entry.") for i in range(50)]
    index = SearchIndex([entry("z.ledger"), entry("a.tool", terms=["ledgerbook"]), *fillers])
    assert names(index, "ledg")[:2] == ["z.ledger", "a.tool"]
    assert names(index, "ledgerbook") == ["a.tool"]


def test_exact_names_differing_only_in_case_all_rank_first() -> None:
    index = SearchIndex([entry("a.b"), entry("a.B"), entry("a.bb", terms=["a b"])])
    assert names(index, "A.B") == ["a.B", "a.b", "a.bb"]


def test_field_precedence_ladder() -> None:
    # every (field, quality) once; names are reverse-alphabetical so a tie would reverse the order
    index = SearchIndex(
        [
            entry("h.ledger"),
            entry("g.ledgers"),
            entry("f.t", terms=["ledger"]),
            entry("e.t", terms=["ledgers"]),
            entry("d.s", summary="Ledger."),
            entry("c.s", summary="Ledgers."),
            entry("b.d", description="Ledger."),
            entry("a.d", description="Ledgers."),
        ]
    )
    assert names(index, "ledger") == ["h.ledger", "g.ledgers", "f.t", "e.t", "d.s", "c.s", "b.d", "a.d"]
    # all prefix matches: pure field order, ties by name within a field
    assert names(index, "ledg") == ["g.ledgers", "h.ledger", "e.t", "f.t", "c.s", "d.s", "a.d", "b.d"]


def test_field_precedence_name_terms_summary_description() -> None:
    index = SearchIndex(
        [
            entry("w.description", description="The ledger."),
            entry("x.summary", summary="The ledger."),
            entry("y.terms", terms=["ledger"]),
            entry("z.ledger"),
        ]
    )
    assert names(index, "ledger") == ["z.ledger", "y.terms", "x.summary", "w.description"]


def test_only_strongest_contribution_per_token() -> None:
    index = SearchIndex(
        [
            entry(
                "b.ledger",
                summary="Ledger ledger.",
                description="Ledger, ledgers.",
                terms=["ledger", "ledgers"],
            ),
            entry("a.ledger"),
        ]
    )
    # same strongest match (exact, in the name): a tie, broken by name
    assert names(index, "ledger") == ["a.ledger", "b.ledger"]


def test_rare_beats_common() -> None:
    fillers = [
        entry(f"f.filler{i}", summary="Other thing.", description="A report about things.") for i in range(10)
    ]
    index = SearchIndex(
        [
            entry("z.rare", summary="Ledger tool.", description="Report helper."),
            entry("a.common", summary="Report tool.", description="Ledger helper."),
            *fillers,
        ]
    )
    assert names(index, "ledger report") == ["z.rare", "a.common"]


def test_rare_beats_common_for_prefix_matches() -> None:
    fillers = [entry(f"f.filler{i}", description="Invoice notes.") for i in range(10)]
    index = SearchIndex([entry("z.invariant"), entry("a.invoice"), *fillers])
    assert names(index, "inv")[:2] == ["z.invariant", "a.invoice"]


def test_more_matched_tokens_rank_higher() -> None:
    index = SearchIndex(
        [
            entry("a.two", description="amber birch"),
            entry("z.three", description="amber birch cedar"),
        ]
    )
    assert names(index, "amber birch cedar") == ["z.three", "a.two"]


def test_ties_by_name() -> None:
    index = SearchIndex(
        [entry(n, "Export data.") for n in ["b.tool", "c.tool", "a.tool", "B.tool", "ab.tool"]]
    )
    assert names(index, "export") == ["B.tool", "a.tool", "ab.tool", "b.tool", "c.tool"]


def test_disabled_entries_are_simply_absent() -> None:
    # the index only knows what it was given (static filtering happens before it is built)
    index = SearchIndex([entry("a.ledger")])
    assert names(index, "ledger") == ["a.ledger"]
    assert names(index, "b.ledger") == []


# --------------------------------------------------------------------------------------------------
# Output bounds
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "max_results", "returned", "truncated"),
    [
        (25, 20, 20, True),
        (20, 20, 20, False),
        (19, 20, 19, False),
        (6, 5, 5, True),
        (5, 5, 5, False),
        (3, 1, 1, True),
    ],
)
def test_truncation_by_count(count: int, max_results: int, returned: int, truncated: bool) -> None:
    entries = [entry(f"t.c{i:02d}", "Export data.") for i in range(count)]
    response = SearchIndex(entries, max_results=max_results).search("export")
    assert [r.name for r in response.results] == [f"t.c{i:02d}" for i in range(returned)]
    assert response.truncated is truncated


def test_truncation_by_bytes() -> None:
    entries = [entry(f"t.c{i:02d}", "Exporte les données — 数据导出.") for i in range(10)]
    full = SearchIndex(entries).search("export")
    assert len(full.results) == 10 and not full.truncated
    size = encoded_size(full)

    exact_fit = SearchIndex(entries, max_response_bytes=size).search("export")
    assert exact_fit == full

    one_short = SearchIndex(entries, max_response_bytes=size - 1).search("export")
    assert one_short.results == full.results[:9]
    assert one_short.truncated

    for bound in range(32, size + 1):
        response = SearchIndex(entries, max_response_bytes=bound).search("export")
        assert encoded_size(response) <= bound
        assert response.results == full.results[: len(response.results)]  # always a ranked prefix
        assert response.truncated is (len(response.results) < 10)


def test_oversized_result() -> None:
    big = entry("a.big", "Export " + "x" * 500)
    small = entry("b.small", "Export.")
    index = SearchIndex([big, small], max_response_bytes=200)
    # the top-ranked result does not fit; results stay a ranked prefix
    assert index.search("export").to_dict() == {"results": [], "truncated": True}
    assert oversized_entries([big, small], 200) == ["a.big"]
    assert oversized_entries([big, small]) == []


def test_invalid_bounds() -> None:
    with pytest.raises(ValueError):
        SearchIndex([], max_results=0)
    with pytest.raises(ValueError):
        SearchIndex([], max_response_bytes=31)
    with pytest.raises(ValueError):
        SearchIndex([]).search("x", max_query_bytes=0)


def test_response_shape() -> None:
    index = SearchIndex(
        [SearchEntry("records.lookup", "records.lookup(*, key: str)", "Look up one record.", "Long.", ["x"])]
    )
    assert index.search("record").to_dict() == {
        "results": [
            {
                "name": "records.lookup",
                "signature": "records.lookup(*, key: str)",
                "summary": "Look up one record.",
            }
        ],
        "truncated": False,
    }


def test_concurrent_searches_agree() -> None:
    entries = [entry(f"svc{i % 7}.op{i}", f"Operation {i} on ledger {i % 3}.") for i in range(200)]
    index = SearchIndex(entries)
    queries = ["ledger", "operation ledger", "op1", "svc3", "svc2.op9"] * 20
    expected = [index.search(q) for q in queries]
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(index.search, queries)) == expected


# --------------------------------------------------------------------------------------------------
# The optimized index agrees with a brute-force reading of the rules
# --------------------------------------------------------------------------------------------------


def reference_search(entries: list[SearchEntry], query: str, max_results: int) -> tuple[list[str], bool]:
    """Score every entry directly from the documented formula (no inverted index, no shortcuts)."""
    tokens = normalize_query(query)
    fields = []
    for e in entries:
        terms = [t for term in e.search_terms for t in _index_tokens(term)]
        # a third-party capability's search terms are summary text
        namespace, _, operation = e.name.partition(".")
        fields.append(
            [
                _index_tokens(operation),
                [] if e.third_party else terms,
                _index_tokens(e.summary) + (terms if e.third_party else []),
                _index_tokens(e.description),
                _index_tokens(namespace),  # name weight, exact matches only
            ]
        )
    n = len(entries)
    df: dict[str, int] = {}
    for doc in fields:
        for t in {t for f in doc for t in f}:
            df[t] = df.get(t, 0) + 1

    def rarity(t: str) -> float:
        return 1.0 if n < 2 else 1.0 + RARITY_SPAN * math.log(n / df[t]) / math.log(n)

    folded = query.strip().casefold()
    exact = sorted(e.name for e in entries if e.name.casefold() == folded)
    scored: list[tuple[float, bool, str]] = []
    for e, doc in zip(entries, fields, strict=True):
        if e.name in exact:
            continue
        total, matched = 0.0, 0
        for qt in tokens:
            best = 0.0
            for f, field_tokens in enumerate(doc):
                weight = FIELD_WEIGHTS[f] if f < len(FIELD_WEIGHTS) else FIELD_WEIGHTS[0]
                for t in field_tokens:
                    if t == qt:
                        best = max(best, weight * rarity(t))
                    elif f < len(FIELD_WEIGHTS) and (
                        (len(qt) >= MIN_PREFIX_CHARS and t.startswith(qt)) or stem(t) == stem(qt)
                    ):  # a prefix, or another inflection (same stem), scores as a prefix
                        best = max(best, weight * rarity(t) * PREFIX_FACTOR)
            if best:
                matched += 1
                total += best
        if tokens and matched >= required_matches(len(tokens)):
            scored.append((-total, e.third_party, e.name))
    ranked = exact + [name for _, _, name in sorted(scored)]
    return ranked[:max_results], len(ranked) > max_results


def test_index_matches_reference_on_random_catalogs() -> None:
    rng = random.Random(1234)
    vocab = ["inv", "invoice", "invoices", "ledger", "led", "ledgers", "draft", "drafts", "pay", "payment"]
    vocab += ["sync", "synchronize", "report", "reports", "git", "hub", "user", "users", "create", "list"]
    vocab += ["données", "grösse", "the", "for", "and", "v2", "sha256", "http", "server", "key"]

    def phrase(k: int) -> str:
        words = [rng.choice(vocab) for _ in range(k)]
        return " ".join(w.capitalize() if rng.random() < 0.2 else w for w in words)

    def camel(words: list[str]) -> str:
        return words[0] + "".join(w.capitalize() for w in words[1:])

    for trial in range(100):
        entries: dict[str, SearchEntry] = {}
        for _ in range(rng.randint(1, 40)):
            name = ".".join(camel([rng.choice(vocab) for _ in range(rng.randint(1, 2))]) for _ in range(2))
            entries[name] = SearchEntry(
                name=name,
                signature=f"{name}()",
                summary=phrase(rng.randint(1, 6)),
                description=phrase(rng.randint(0, 12)),
                search_terms=[phrase(rng.randint(1, 2)) for _ in range(rng.randint(0, 4))],
                third_party=rng.random() < 0.3,
            )
        catalog = list(entries.values())
        max_results = rng.choice([1, 3, 5, 20])
        index = SearchIndex(catalog, max_results=max_results)
        queries = [phrase(rng.randint(1, 7)) for _ in range(10)]
        queries += [w[: rng.randint(1, len(w))] for w in rng.sample(vocab, 5)]
        queries += [rng.choice(catalog).name.upper(), "  " + rng.choice(catalog).name + " "]
        for query in queries:
            response = index.search(query)
            expected = reference_search(catalog, query, max_results)
            assert ([r.name for r in response.results], response.truncated) == expected, (trial, query)


def test_a_namespace_matches_exactly_only_so_a_name_own_words_rank() -> None:
    names = [
        "petstore.add_pet",
        "petstore.find_pets_by_status",
        "petstore.create_user",
        "petstore.login_user",
    ]
    index = SearchIndex(
        [
            SearchEntry(n, f"{n}()", "Logs user into the system." if "login" in n else "Does it.")
            for n in names
        ]
    )
    found = [r.name for r in index.search("pet").results]
    # before: every petstore operation matched `pet` through its namespace (login_user included)
    assert found == ["petstore.add_pet", "petstore.find_pets_by_status"]
    assert {r.name for r in index.search("petstore").results} == set(names)
    assert index.search("petstore login").results[0].name == "petstore.login_user"
