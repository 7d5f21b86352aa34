"""Search benchmark: p50/p99 latency over 10,000 synthetic capabilities (goal: p50 ≤ 2 ms).

Run: ``python -m tests.benchmarks.bench_search [--capabilities N] [--rounds R] [--seed S]``.
Prints numbers; asserts nothing. The catalog is deterministic for a given seed: names such as
``billing.invoices.createDraft``, 3–8 search terms, a one-sentence summary and a two-sentence
description drawn (Zipf-like) from a vocabulary of a few thousand English and technical words with
their inflections, so prefix queries meet realistic fan-out (``inv`` → invoice, invoices, invoiced,
inventory, …).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from codemode.catalog.search import SearchEntry, SearchIndex, tokenize
from codemode.ops.percentile import percentile


def _words(text: str) -> list[str]:
    return text.split()


DOMAINS = _words(
    """
billing identity storage compute network analytics catalog orders payments shipping inventory
support marketing crm hr payroll finance ledger audit security monitoring logging alerts search
messaging notifications calendar documents media video images translation geo maps weather devices
iot fleet scheduling workflows pipelines builds deployments registry secrets keys dns cdn cache
queues streams tickets projects teams repos reviews wiki forms surveys
"""
)

RESOURCES = _words(
    """
invoices customers subscriptions plans coupons refunds charges disputes payouts accounts users
groups roles permissions sessions tokens buckets objects volumes snapshots instances images clusters
nodes pods services routes firewalls addresses certificates domains records zones reports dashboards
metrics events traces logs alerts incidents tickets comments attachments messages channels threads
contacts leads opportunities campaigns segments audiences products variants prices orders carts
shipments packages labels warehouses suppliers employees contracts budgets expenses journals entries
transactions balances statements policies rules webhooks schedules jobs tasks runs artifacts
releases branches commits pulls issues pages files folders documents templates translations
locations devices sensors readings firmware vehicles drivers trips bookings rooms calendars meetings
invitations
"""
)

VERBS = _words(
    """
create get list update delete archive restore search export import sync approve reject cancel refund
send resend retry pause resume start stop restart scale validate preview publish unpublish assign
unassign merge split close reopen lock unlock rotate revoke grant verify estimate calculate
summarize translate tag untag move copy rename share
"""
)

OBJECTS = _words(
    """
draft batch summary status history details settings config metadata owner members permissions usage
quota limits preview version revision attachment comment note label tag alias link token secret key
certificate report export snapshot backup schedule trigger webhook policy rule template variant
price discount tax total balance address contact payment method
"""
)

# Base vocabulary (a realistic spread of business and technical English); inflections are derived.
BASE_WORDS = _words(
    """
account action activity address adjust admin agent agreement alert allocate amount analyze annotate
answer api application apply approval archive area asset assign attach attempt attribute audience
audit authenticate author automate available backup balance bank batch behavior benefit bill block
board body booking boundary branch brand bucket budget buffer build bundle business cache calendar
call campaign cancel capacity card carrier case catalog category certificate change channel charge
check checkout claim class clean client close cluster code collect column comment commit company
compare compile complete compliance component compute condition config confirm connect connection
consent contact container content context contract control convert copy cost count country coupon
course coverage create credential credit currency customer cycle daily dashboard data database date
deadline debit decision default define delete delivery demand deploy deposit describe design
destination detail detect device diagnose discount dispatch display dispute document domain download
draft driver due duplicate duration edit email employee enable encrypt endpoint engine enroll entity
entry environment error estimate evaluate event evidence exchange execute expense expire export
extend extract factor failure feature fee feedback field file filter finance fleet folder follow
forecast form format forward frame freight fulfill function fund gateway generate geography goal
grant graph group guarantee guest handle hardware header health history hold host hour identity
image import incident income index indicator industry inform infrastructure input inspect install
instance insurance integrate interest interface internal inventory invest invoice issue item job
journal key label language launch layer lead ledger legal level license limit line link list load
loan locate lock log login maintain manage manifest map margin market match measure media meeting
member merchant merge message method metric migrate milestone mobile model modify monitor month move
name network node note notify number object offer office operate option order organization origin
output owner package page parameter partner password patch pay payment payroll pending perform
period permission person phase pipeline plan platform policy pool portfolio position post predict
preference premium prepare present price print priority privacy process procure produce product
profile program project promote property protect provider publish purchase quality quantity query
queue quota quote range rate read reason receipt receive recipient reconcile record recover reduce
refer refund region register reject release remind remove renew repair replace replica report
repository request require reserve reset resolve resource respond restore result retain retry return
revenue review revoke reward risk role rotate route rule run salary sale sample save scale schedule
schema scope score script search season secret section secure segment select send sensor sequence
server service session setting share shift ship shipment signal signature site size skill slot
snapshot source space specify split sponsor stage standard start state statement status step stock
storage store strategy stream submit subscribe supplier supply support survey suspend switch sync
system table tag target task tax team template tenant term test text threshold ticket tier time
token topic total track trade traffic train transfer transaction transform translate transport trend
trigger trip type unit update upgrade upload usage user validate value variant vendor verify version
video view visit volume voucher wallet warehouse warning webhook weight window workflow workspace
zone
"""
)

SUFFIXES = ["", "s", "ed", "ing", "er", "ers", "ation", "ations", "able", "ment", "ments", "ly"]

CONNECTOR_WORDS = ["a", "an", "and", "by", "for", "from", "in", "of", "on", "or", "the", "to", "with"]


def build_vocabulary(rng: random.Random) -> list[str]:
    words: set[str] = set(BASE_WORDS) | set(RESOURCES) | set(OBJECTS) | set(VERBS) | set(DOMAINS)
    for base in BASE_WORDS:
        stem = base[:-1] if base.endswith("e") else base
        for suffix in rng.sample(SUFFIXES, 5):
            words.add(base + suffix if suffix in ("", "s") else stem + suffix)
    vocabulary = sorted(words)
    rng.shuffle(vocabulary)  # the Zipf rank is random with respect to spelling
    return vocabulary


def zipf_sampler(rng: random.Random, vocabulary: list[str]) -> Callable[[], str]:
    weights = [1.0 / (rank + 1) ** 0.9 for rank in range(len(vocabulary))]
    cumulative: list[float] = []
    total = 0.0
    for w in weights:
        total += w
        cumulative.append(total)

    def draw() -> str:
        return rng.choices(vocabulary, cum_weights=cumulative, k=1)[0]

    return draw


def sentence(rng: random.Random, draw: Callable[[], str], words: int) -> str:
    out: list[str] = []
    for _ in range(words):
        out.append(rng.choice(CONNECTOR_WORDS) if rng.random() < 0.25 else draw())
    text = " ".join(out)
    return text[0].upper() + text[1:] + "."


def camel(verb: str, obj: str) -> str:
    return verb + obj[0].upper() + obj[1:]


def build_catalog(n: int, seed: int) -> tuple[list[SearchEntry], list[str]]:
    rng = random.Random(seed)
    vocabulary = build_vocabulary(rng)
    draw = zipf_sampler(rng, vocabulary)
    names: set[str] = set()
    entries: list[SearchEntry] = []
    while len(entries) < n:
        domain, resource = rng.choice(DOMAINS), rng.choice(RESOURCES)
        verb = rng.choice(VERBS)
        leaf = camel(verb, rng.choice(OBJECTS)) if rng.random() < 0.6 else verb
        name = f"{domain}.{resource}.{leaf}"
        if name in names:
            continue
        names.add(name)
        params = ", ".join(f"{draw()}_{i}: str" for i in range(rng.randint(0, 4)))
        signature = f"{name}(*, {params})" if params else f"{name}()"
        summary = f"{verb.capitalize()} {rng.choice(['a', 'the', 'one'])} {resource[:-1]} {draw()}" + (
            f" {sentence(rng, draw, rng.randint(3, 8)).lower()}"
        )
        description = sentence(rng, draw, rng.randint(10, 20)) + " " + sentence(rng, draw, rng.randint(8, 16))
        terms = [" ".join(draw() for _ in range(rng.randint(1, 2))) for _ in range(rng.randint(3, 8))]
        entries.append(SearchEntry(name, signature, summary, description, terms))
    return entries, vocabulary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--capabilities", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    t0 = time.perf_counter()
    entries, vocabulary = build_catalog(args.capabilities, args.seed)
    t1 = time.perf_counter()
    index = SearchIndex(entries)
    t2 = time.perf_counter()

    rng = random.Random(args.seed + 1)
    # Document frequency of each vocabulary word, to pick common and rare query words.
    df: dict[str, int] = {}
    for e in entries:
        seen = set(tokenize(" ".join([e.name, *e.search_terms, e.summary, e.description])))
        for token in seen:
            df[token] = df.get(token, 0) + 1
    by_df = sorted((w for w in vocabulary if w in df), key=lambda w: df[w])
    rare = [w for w in by_df if df[w] <= 5][:200] or by_df[:200]
    common = by_df[-200:]
    prefixes = sorted({w[:3] for w in vocabulary if len(w) >= 5})

    queries: dict[str, list[str]] = {
        "1 token, common word": common,
        "1 token, rare word": rare,
        "2 tokens": [f"{rng.choice(VERBS)} {rng.choice(RESOURCES)}" for _ in range(200)],
        "3 tokens (verb resource object)": [
            f"{rng.choice(VERBS)} {rng.choice(RESOURCES)} {rng.choice(OBJECTS)}" for _ in range(200)
        ],
        "3-char prefix": [rng.choice(prefixes) for _ in range(200)],
        "5 tokens, natural phrasing": [
            f"how to {rng.choice(VERBS)} the {rng.choice(RESOURCES)} {rng.choice(OBJECTS)} for "
            f"{rng.choice(common)} {rng.choice(vocabulary)}"
            for _ in range(200)
        ],
        "16 tokens": [" ".join(rng.sample(vocabulary, 16)) for _ in range(100)],
        "exact dotted name": [rng.choice(entries).name.upper() for _ in range(200)],
        "no match": [f"zq{rng.randrange(10**6)}x qzv{rng.randrange(10**6)}" for _ in range(200)],
    }

    print(
        f"catalog: {len(entries)} capabilities, {len(vocabulary)} vocabulary words "
        f"(generated in {t1 - t0:.2f} s)"
    )
    print(f"index build: {(t2 - t1) * 1000:.0f} ms, {index.vocabulary_size} distinct tokens")
    print(f"{'query kind':34} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'avg results':>12}")
    all_samples: list[float] = []
    for kind, qs in queries.items():
        for q in qs[:20]:  # warm the tokenizer cache the way a running server would be
            index.search(q)
        samples: list[float] = []
        returned = 0
        for _ in range(args.rounds):
            for q in qs:
                start = time.perf_counter()
                response = index.search(q)
                samples.append((time.perf_counter() - start) * 1000)
                returned += len(response.results)
        all_samples.extend(samples)
        print(
            f"{kind:34} {statistics.median(samples):8.3f} {percentile(samples, 99):8.3f} "
            f"{max(samples):8.3f} {returned / len(samples):12.1f}"
        )
    print(
        f"{'all kinds':34} {statistics.median(all_samples):8.3f} {percentile(all_samples, 99):8.3f} "
        f"{max(all_samples):8.3f}"
    )


if __name__ == "__main__":
    main()
