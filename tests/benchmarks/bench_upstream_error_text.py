"""Upstream error text benchmark: what a tenant-chosen error text costs the serving loop.

Run: ``python -m tests.benchmarks.bench_upstream_error_text [--size N] [--rounds R]``. Prints
numbers; asserts nothing. server-memory answers ``add_observations`` on a missing entity with
``Entity with name <name> not found``, and the name is the tenant's: the rule
(``codemode.packs.error_text``) runs on the serving loop for every such answer. Each text is a run
of letters (the case that made the earlier, unanchored URL and path patterns quadratic: 150 KB took
21 s), a run of dotted labels and one of slashes, each at ``--size`` characters and twice that. The
goal: the time does not grow with the text (ratio ≈ 1: only the first ``LOOK_AT`` characters are
read).
"""

from __future__ import annotations

import argparse
import statistics
import time

from codemode.packs.error_text import LOOK_AT, upstream_error_text

KINDS = {
    "letters": "a",
    "dotted labels": "a.",
    "slashes": "a/",
    "percent escapes": "%2F",
}


def entity_error(kind: str, size: int) -> str:
    unit = KINDS[kind]
    return f"Entity with name {unit * (size // len(unit))} not found"


def seconds(text: str, rounds: int) -> float:
    """Median seconds of one call of the rule on ``text``, with a configured credential."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        upstream_error_text("memory", text, secrets=["sk-live-4f9a1c2e7b"])
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=150_000, help="characters of the first text")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    print(f"upstream_error_text: reads the first {LOOK_AT} characters; median of {args.rounds} rounds")
    print(f"{'text':<16} {'n = ' + format(args.size, ','):>14} {'2n':>12} {'ratio 2n/n':>11}")
    for kind in KINDS:
        one = seconds(entity_error(kind, args.size), args.rounds)
        two = seconds(entity_error(kind, 2 * args.size), args.rounds)
        print(f"{kind:<16} {one * 1e3:>11.3f} ms {two * 1e3:>9.3f} ms {two / one:>11.2f}")


if __name__ == "__main__":
    main()
