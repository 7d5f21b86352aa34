"""Redaction timing benchmark: does the time to redact a text depend on how much of the credential
it repeats? (The goal: "no observable difference ... in their length and timing".)

Run: ``python -m tests.benchmarks.bench_redaction_timing [--size N] [--rounds R]``. Prints
numbers; asserts nothing. A backend that repeats the tenant's value in a result hands the host a
text the tenant chose; the tenant can fill it with copies of a guess: the known prefix of the
credential and ``k`` more characters, right or wrong. For each ``k`` the benchmark times
``Redactor.redact`` (OpenAPI results, up to ``max_response_bytes``) on ``--size`` characters of
such copies, right guesses against wrong ones, and ``upstream_error_text`` (the upstream MCP pack)
on one copy padded to its window; the same with every character a JSON ``\\u`` escape (``\\u``,
read through the decoded views); and the same for copies of the credential's last ``k``
characters (``end``), where the matcher of 2b6a3b2 looked up blocks (found by a review: 1 MB
of copies of the right 4 characters took 245-261 ms against 79-122 ms for wrong ones). It also
times the earlier rule's way of matching (one regular expression of the spellings, which compares
character by character): the difference it shows between right and wrong guesses is what a timing
attack measures. The goal: right / wrong ≈ 1
for the redaction (its spread between rounds is the noise).
"""

from __future__ import annotations

import argparse
import random
import re
import string
import time
from collections.abc import Callable
from functools import partial

from codemode.packs.error_text import upstream_error_text
from codemode.packs.redaction import Redactor, spellings

PREFIX = "Bearer sk_live_"
_RNG = random.Random(31)
BODY = "".join(_RNG.choice(string.ascii_letters + string.digits) for _ in range(24))
CREDENTIAL = PREFIX + BODY


def guesses(k: int, right: bool, size: int) -> str:
    wrong = "".join("#" if c != "#" else "$" for c in BODY[:k])
    guess = "!" + PREFIX + (BODY[:k] if right else wrong)
    return guess * (size // len(guess))


def end_parts(k: int, right: bool, size: int) -> str:
    """Copies of the credential's last ``k`` characters, or of ``k`` others (a matcher that looks up
    blocks of a spelling's end, as the one of 2b6a3b2 did, pays for each copy of a right one)."""
    part = BODY[-k:] if right else "".join("#" if c != "#" else "$" for c in BODY[-k:])
    return part * (size // len(part))


#: Letters and digits to others of their kind: a wrong guess of the same shape, with as many
#: distinct characters (so as many distinct escapes) as the right one.
_OTHER = str.maketrans(
    string.ascii_lowercase + string.ascii_uppercase + string.digits,
    string.ascii_lowercase[13:]
    + string.ascii_lowercase[:13]
    + string.ascii_uppercase[13:]
    + string.ascii_uppercase[:13]
    + string.digits[5:]
    + string.digits[:5],
)


def escaped_guesses(k: int, right: bool, size: int) -> str:
    """Copies of the known prefix and ``k`` more characters (right, or others of the same shape),
    every character a JSON ``\\u`` escape (six characters for one): the decoded views
    (``codemode.packs.unescaping``) must cost what the text is, not what it shares with the
    credential."""
    guess = "!" + PREFIX + (BODY[:k] if right else BODY[:k].translate(_OTHER))
    return "".join(f"\\u{ord(c):04x}" for c in guess) * (size // (6 * len(guess)))


def best(fn: Callable[[], object], rounds: int) -> tuple[float, float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[0], times[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="characters of each text")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    redactor = Redactor([CREDENTIAL])
    forms = sorted(spellings(CREDENTIAL), key=len, reverse=True)
    regex = re.compile("|".join(re.escape(f) for f in forms))  # the earlier rule's matching
    print(
        f"credential: {len(CREDENTIAL)} characters; texts of {args.size:,} characters; best of {args.rounds}"
    )
    print(
        f"{'guess':>6} {'k':>3} {'what':<24} {'right ms (best/median)':>22} {'wrong ms (best/median)':>22}"
        f" {'ratio':>6}"
    )
    series = [("prefix", k, guesses) for k in (0, 4, 8, 16, 23)] + [("end", k, end_parts) for k in (4, 8)]
    series += [("\\u", k, escaped_guesses) for k in (8, 23)]
    for kind, k, make in series:
        right, wrong = make(k, True, args.size), make(k, False, args.size)
        rows: list[tuple[str, Callable[[str], object]]] = [
            ("Redactor.redact", redactor.redact),
            ("regex of the spellings", lambda t: regex.sub("[redacted]", t)),
            ("upstream_error_text", lambda t: upstream_error_text("api", t[:2000], secrets=[CREDENTIAL])),
        ]
        for name, fn in rows:
            r, rm = best(partial(fn, right), args.rounds)
            w, wm = best(partial(fn, wrong), args.rounds)
            ms = f"{r * 1e3:>10.2f} {rm * 1e3:>11.2f} {w * 1e3:>10.2f} {wm * 1e3:>11.2f}"
            print(f"{kind:>6} {k:>3} {name:<24} {ms} {r / w:>6.2f}")


if __name__ == "__main__":
    main()
