"""Execution and discovery limits (docs/reference/limits.md): each field of :class:`Limits` carries
its real default, its unit, its minimum and the texts of ``--help`` and of the reference's table
(:func:`limits_table` generates it; a test compares). A field left out takes its default; a value
below its minimum is a build problem naming the field. Only ``max_print_bytes`` accepts 0 (its
default: prints off)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from ..catalog.answers import DEFAULT_MAX_DESCRIBE_RESPONSE_BYTES, MIN_DESCRIBE_RESPONSE_BYTES
from ..catalog.search import DEFAULT_MAX_RESPONSE_BYTES

__all__ = [
    "DEFAULTS",
    "DEFAULT_SUBJECT_QUOTA",
    "FLOAT_LIMITS",
    "MINIMUMS",
    "MIN_SEARCH_RESPONSE_BYTES",
    "PRINTS_OVER_VALUE",
    "SUMMARIES",
    "LimitSpec",
    "Limits",
    "limits_table",
    "spec_of",
]

#: Prints are bounded like a value: a program cannot return more through them than through main().
PRINTS_OVER_VALUE = "limits: max_print_bytes must not exceed max_value_bytes"

#: Concurrent executes one subject may run (``Builder(subject_quota=...)``, ``--subject-quota``).
DEFAULT_SUBJECT_QUOTA = 4

#: The smallest search response bound: room for an empty, truncated answer.
MIN_SEARCH_RESPONSE_BYTES = 32


@dataclass(frozen=True)
class LimitSpec:
    """What one limit is: ``unit`` and ``bounds`` are the reference table's columns, ``summary`` is
    its ``--help`` text; ``minimum`` is the smallest value accepted (for seconds: more than it)."""

    unit: str
    summary: str
    bounds: str
    minimum: int = 1


def _limit(default: Any, unit: str, summary: str, bounds: str, minimum: int = 1) -> Any:
    return field(default=default, metadata={"spec": LimitSpec(unit, summary, bounds, minimum)})


@dataclass(frozen=True)
class Limits:
    """Per-execute budgets; a field left out takes its default (units, defaults, minimums and where
    each is enforced: docs/reference/limits.md, generated from these fields).

    The program: ``max_source_bytes`` (its source), ``max_execution_steps`` (interpreter work, in
    the worker's ticks), ``max_execution_time`` (seconds of the whole execute), ``max_callstack``
    (Starlark frames), ``max_print_bytes`` (prints kept; its default is 0: none). Its calls:
    ``max_native_calls`` (per execute), ``max_value_depth`` and ``max_value_bytes`` (each argument
    map, result and ``main()``'s value), ``max_intermediate_value_bytes`` (all results sent to the
    worker). Search and describe: ``max_search_query_bytes``, ``max_search_results``,
    ``max_search_response_bytes``, ``max_describe_response_bytes``. The server:
    ``max_concurrent_executions`` (worker slots). Asking the user: ``max_approval_time`` (seconds a
    question may stay open), ``max_pending_approvals`` (questions one subject may have open) and
    ``max_approval_wait`` (seconds all of one execute's questions may stay open together) and
    ``max_suspension_bytes`` (bytes of one subject's suspended executes' records). The state pack:
    ``max_state_keys`` and ``max_state_bytes`` (keys, and bytes of keys and values, per subject).
    ``max_parallel_calls``: the calls of one ``parallel(...)`` that run at once.

    Seconds are floats; every other field is a count or bytes. ``Builder.build()`` refuses a value
    below its minimum (0 included, except for ``max_print_bytes``), a non-number, a non-finite one.
    """

    max_source_bytes: int = _limit(
        64 * 1024,
        "UTF-8 bytes",
        "bytes of program source (UTF-8)",
        "the program source; host, before a worker is taken",
    )
    max_execution_steps: int = _limit(
        1_000_000,
        "ticks (one loop iteration or Starlark function call; checked every 1,000, see "
        "[program.md](program.md#steps))",
        "interpreter steps per execute (loop iterations and function calls)",
        "interpreter work from the first top-level statement until `main` returns; worker",
    )
    max_execution_time: float = _limit(
        5.0,
        "seconds (float)",
        "seconds of wall time per execute",
        "wall time of the whole execute, starting **before** waiting for a concurrency slot: slot wait, "
        "worker start or hand-out, the exchange, every authorizer and handler call; host (timer + kill)",
        minimum=0,
    )
    max_native_calls: int = _limit(
        100,
        "calls",
        "capability calls per execute",
        "attempted capability calls per execute, counted before binding; worker and host (the host "
        "counts itself)",
    )
    max_value_depth: int = _limit(
        32,
        "nesting levels (inclusive; scalar = 1)",
        "nesting depth of a value crossing the boundary",
        "each capability argument value, each capability result, `main()`'s value; worker and host",
    )
    max_value_bytes: int = _limit(
        1024 * 1024,
        "UTF-8 bytes of compact JSON",
        "encoded bytes of one value crossing the boundary",
        "the argument map of one call, each capability result, `main()`'s value; worker and host",
    )
    max_intermediate_value_bytes: int = _limit(
        8 * 1024 * 1024,
        "bytes (same measure)",
        "encoded bytes of all capability results of one execute",
        "the sum of all successful capability results sent to the worker during one execute; host",
    )
    max_search_query_bytes: int = _limit(
        256, "UTF-8 bytes", "bytes of a search query", "the raw `search_api` query; host"
    )
    max_search_results: int = _limit(
        20, "results", "results per search", "results in one `search_api` response; host"
    )
    max_concurrent_executions: int = _limit(
        8,
        "executions",
        "executes in flight at once (slots)",
        "executions that are starting a worker or hold a live worker, per server; a slot is released "
        "only after its worker is reaped. A warm pool's idle workers come on top; host",
    )
    max_search_response_bytes: int = _limit(
        DEFAULT_MAX_RESPONSE_BYTES,
        "UTF-8 bytes of compact JSON",
        "bytes of a search response (compact JSON)",
        f"one whole `search_api` response (minimum {MIN_SEARCH_RESPONSE_BYTES}); host",
        minimum=MIN_SEARCH_RESPONSE_BYTES,
    )
    max_callstack: int = _limit(
        100,
        "Starlark frames",
        "Starlark call-stack depth",
        "depth of the program's call stack (clamped to 10,000; the worker adds 4 frames for its own "
        "wrappers); worker",
    )
    max_describe_response_bytes: int = _limit(
        DEFAULT_MAX_DESCRIBE_RESPONSE_BYTES,
        "UTF-8 bytes of compact JSON",
        "bytes of one describe_api answer (compact JSON)",
        f"one whole `describe_api` answer (minimum {MIN_DESCRIBE_RESPONSE_BYTES:,}); never cut: a "
        "capability whose answer cannot fit is refused at registration, an upstream tool or operation "
        "is skipped ([describe.md](describe.md#bound)); host",
        minimum=MIN_DESCRIBE_RESPONSE_BYTES,
    )
    max_print_bytes: int = _limit(
        0,
        "UTF-8 bytes of `print()` output",
        "bytes of print() output returned per execute (0 = prints are discarded)",
        "the prints returned beside the result ([program.md](program.md#prints)); **0 (the default) "
        "turns prints off**: they are discarded. At most `max_value_bytes` (`build()` refuses more). "
        "Needs a worker image with prints (an older one refuses the exec frame: `internal failure`, "
        "[protocol.md](protocol.md#compatibility-within-version-1)). Worker (keeps and sends at most "
        "this much) and host (refuses more bytes, and more `print` frames than an honest worker sends)",
        minimum=0,
    )
    max_approval_time: float = _limit(
        120.0,
        "seconds",
        "seconds a question to the user may stay open (not max_execution_time)",
        "how long one question to the user may stay open when the policy asks "
        "([authorization.md](authorization.md#asking-the-user)): the execute's suspension record "
        "expires then, declined, and nothing of it stays. The wait is not the program's "
        "`max_execution_time`; host",
        minimum=0,
    )
    max_pending_approvals: int = _limit(
        1,
        "questions",
        "approvals one subject may have open at once (a further ask is declined)",
        "questions to the user one subject may have open at once (its suspended executes, waiting for "
        "an answer as records in the store); a further ask from that subject is declined at once; host",
    )
    max_approval_wait: float = _limit(
        3600.0,
        "seconds",
        "seconds one execute may wait for the user's answers in all (summed over its questions)",
        "how long all the questions of one execute may stay open together "
        "([authorization.md](authorization.md#asking-the-user)): each question waits at most what is "
        "left of it; once it is spent, the execute ends with `resource limit exceeded: approval "
        "wait`. Hours are fine: nothing but a record waits; it bounds a program that asks again and "
        "again; host",
        minimum=0,
    )

    max_parallel_calls: int = _limit(
        10,
        "calls",
        "calls of one parallel() that run at once",
        "the calls of one `parallel(...)` that run at once ([program.md](program.md#parallel-calls)); "
        "the rest wait for one of them to finish. The sync handlers of one subject (all its executes "
        "and calls together, single or in a batch, and each handler its deadline gave up on until it "
        "has finished in its thread) also take at most half the host's handler threads (at least 1), "
        "and a subject holding one never takes the last free one (kept for a subject holding none), "
        "so neither one tenant nor two can hold them all; host",
    )

    max_suspension_bytes: int = _limit(
        4 * 1024 * 1024,
        "UTF-8 bytes",
        "bytes of suspended executes' records one subject may keep (source and call log)",
        "the records of one subject's executes that wait for an answer "
        "([authorization.md](authorization.md#asking-the-user)): the source and the call log with "
        "its recorded results, summed over the subject's pending suspensions; an ask that would "
        "keep more ends the execute with `resource limit exceeded: suspension bytes`; host (the store)",
        minimum=1,
    )

    max_state_keys: int = _limit(
        1_000,
        "keys",
        "state pack keys one subject may keep",
        "the keys one subject keeps with the state pack ([packs.md](../packs.md#the-state-pack)), "
        "expired keys not counted; a `state.put` of one more ends the execute with `resource limit "
        "exceeded: state keys` and changes nothing; host (the store)",
        minimum=1,
    )

    max_state_bytes: int = _limit(
        4 * 1024 * 1024,
        "UTF-8 bytes",
        "bytes of state pack keys and values one subject may keep",
        "the keys and values (their JSON text) one subject keeps with the state pack "
        "([packs.md](../packs.md#the-state-pack)); a `state.put` that would keep more ends the "
        "execute with `resource limit exceeded: state bytes` and changes nothing; host (the store)",
        minimum=1,
    )

    def problems(self) -> list[str]:
        """What ``Builder.build()`` refuses in these limits.

        Returns:
            One text per problem, naming the field (and its default): a non-number, a non-finite
            value, one below its minimum, prints larger than a value; empty when they are usable.
        """
        out = []
        for f in fields(self):
            value, spec = getattr(self, f.name), spec_of(f.name)
            seconds = f.name in FLOAT_LIMITS
            if isinstance(value, bool) or not isinstance(value, int | float):
                out.append(f"limits: {f.name} must be a number")
            elif not math.isfinite(value):
                out.append(f"limits: {f.name} must be finite")
            elif value <= spec.minimum if seconds else value < spec.minimum:
                bound = "more than" if seconds else "at least"
                default = f"leave it out for the default, {f.default}"
                out.append(f"limits: {f.name} must be {bound} {spec.minimum} ({default})")
        if not out and self.max_print_bytes > self.max_value_bytes:
            out.append(PRINTS_OVER_VALUE)
        return out


def spec_of(name: str) -> LimitSpec:
    """What one limit is.

    Args:
        name: a field of :class:`Limits`.

    Returns:
        Its :class:`LimitSpec` (unit, summary, table text, minimum).
    """
    spec: LimitSpec = _FIELDS[name].metadata["spec"]
    return spec


_FIELDS = {f.name: f for f in fields(Limits)}

#: Each limit's default (the field's own).
DEFAULTS: dict[str, float] = {name: f.default for name, f in _FIELDS.items()}  # type: ignore[misc]

#: The limits counted in seconds (floats); every other one is a count or bytes.
FLOAT_LIMITS = frozenset(name for name, f in _FIELDS.items() if f.type in (float, "float"))

#: What each limit counts, in a few words (``--help`` and docs/configuration.md).
SUMMARIES: dict[str, str] = {name: spec_of(name).summary for name in _FIELDS}

#: The smallest value of each limit (for seconds: the value it must exceed).
MINIMUMS: dict[str, int] = {name: spec_of(name).minimum for name in _FIELDS}


def _default_cell(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def limits_table() -> str:
    """The Markdown table of docs/reference/limits.md, "Configurable limits" (a test compares).

    Returns:
        One row per field of :class:`Limits`: name, unit, default, what it bounds.
    """
    rows = [
        "| name | unit | default | what it bounds, and who enforces it |",
        "|---|---|---|---|",
    ]
    for name in _FIELDS:
        spec = spec_of(name)
        cells = (f"`{name}`", spec.unit, _default_cell(DEFAULTS[name]), spec.bounds)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)
