"""What a bounded policy costs on the worst inputs the inline caps let through: measured once, at
construction.

Part of :mod:`codemode.authz.rego`. The allow-list of :mod:`codemode.authz.rego._bounded` bounds
the work of each rule by the input's size, not the number of rules: a deny list of 400 one-line
rules, every form allowed, takes tens of milliseconds on a 4,000-character argument. Every input
reference of a bounded policy is a static path (``input.arguments.sql``), so the inputs that make
its rules work hardest can be built from those paths: at each path, in turn, a string at the
character cap made of four-byte characters (rego-cpp works on UTF-8 bytes), an array at the value
cap, a chain of objects at the depth cap and an object at the value cap; and one input with a long
string at every path at once. :func:`worst_case` evaluates the policy on each and returns the
longest CPU time the policy adds to the input's own cost (an object at the value cap costs rego-cpp
about 0.2 ms to build whatever the policy, so that cost is measured on a one-rule policy and taken
off; an input over the limit is re-run three times, keeping the quickest runs, so a preempted or
disturbed run does not count). Rules gated on a literal (``input.capability.name
== "db.query"``) are not reached by these inputs: the measured guard in :mod:`codemode.authz.rego`
stays the second line of defence.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from .. import PolicyError
from ._bounded import MAX_INLINE_CHARS, MAX_INLINE_DEPTH, MAX_INLINE_VALUES, small_input

__all__ = ["worst_case", "worst_inputs"]

#: A four-byte character (UTF-8): the most bytes per counted character.
_WIDE: Final = "\U0001f600"
#: At most this many referenced paths get inputs of their own (the rest share the all-paths input).
_MAX_PATHS: Final = 32
#: Runs of one input over the limit before it counts (its quickest run is kept).
_RUNS: Final = 3


def _base() -> dict[str, Any]:
    return {"subject": {"id": ""}, "capability": {"id": "", "name": ""}, "arguments": {}}


def _shapes(chars: int, values: int, levels: int) -> list[Any]:
    """The worst values to put at one path: ``chars`` characters of strings, ``values`` values,
    ``levels`` containers deep at most (0: a string only)."""
    if levels < 1:
        return [_WIDE * chars]
    per = max(chars // values, 1)
    chain: Any = _WIDE * (chars - levels)
    for _ in range(levels):
        chain = {"k": chain}
    return [_WIDE * chars, [_WIDE * per] * values, {f"k{i}": _WIDE * per for i in range(values)}, chain]


#: The paths outside ``arguments`` an input has (all strings).
_FIXED: Final = (("subject", "id"), ("capability", "id"), ("capability", "name"))


def _document(values: dict[tuple[str, ...], Any]) -> dict[str, Any] | None:
    """The input document with each value at its path, or None when a path cannot hold it (outside
    ``arguments`` only the three strings exist; ``input`` and ``input.arguments`` are objects)."""
    document: dict[str, Any] = {"subject": {"id": ""}, "capability": {"id": "", "name": ""}, "arguments": {}}
    for path, value in values.items():
        if path[:1] != ("arguments",) and path:
            if path not in _FIXED or not isinstance(value, str):
                return None
            document[path[0]][path[1]] = value
        elif len(path) <= 1:
            if not isinstance(value, dict):
                return None
            document["arguments"] = value
        else:
            node = document["arguments"]
            for key in path[1:-1]:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    return None
            node[path[-1]] = value
    return document


def _fit(make: Callable[[int], dict[tuple[str, ...], Any]]) -> dict[str, Any] | None:
    """The document of ``make(chars)``, with ``chars`` cut down from the cap until it is within
    the inline caps; None when no size fits or the paths cannot hold the values."""
    chars = MAX_INLINE_CHARS
    while chars > 0:
        document = _document(make(chars))
        if document is None or small_input(document):
            return document
        chars = chars * 9 // 10
    return None


def worst_inputs(paths: Iterable[tuple[str, ...]]) -> list[dict[str, Any]]:
    """The inputs described in the module docstring, each within the inline caps.

    Args:
        paths: the static ``input`` paths of the policy (:func:`_bounded.input_paths`).

    Returns:
        The input documents.
    """
    chosen = sorted(set(paths), key=lambda p: (-len(p), p))[:_MAX_PATHS]
    makers: list[Callable[[int], dict[tuple[str, ...], Any]]] = []
    for path in chosen:
        levels = MAX_INLINE_DEPTH - max(len(path), 1)  # containers around the value at the path
        values = MAX_INLINE_VALUES - 8 - 2 * len(path)
        for index in range(len(_shapes(1, values, levels))):
            makers.append(functools.partial(_one, path, index, values, levels))
    if chosen:
        makers.append(functools.partial(_every, tuple(chosen)))
    return [document for document in map(_fit, makers) if document is not None]


def _one(
    path: tuple[str, ...], index: int, values: int, levels: int, chars: int
) -> dict[tuple[str, ...], Any]:
    return {path: _shapes(chars, values, levels)[index]}


def _every(paths: tuple[tuple[str, ...], ...], chars: int) -> dict[tuple[str, ...], Any]:
    return {path: _WIDE * max(chars // len(paths), 1) for path in paths}


def worst_case(
    evaluate: Callable[[dict[str, Any]], object],
    baseline: Callable[[dict[str, Any]], object],
    inputs: Iterable[dict[str, Any]],
    limit: float,
) -> float:
    """The longest CPU time (seconds) the policy adds to an evaluation over ``inputs`` (beyond the
    time ``baseline``, a one-rule policy that reads nothing, takes on the same input: building a
    large input costs rego-cpp the same whatever the policy); it stops at the first input over
    ``limit``.

    Args:
        evaluate: one evaluation of the policy on the calling thread (failures count as evaluations).
        baseline: one evaluation of the one-rule policy on the calling thread.
        inputs: from :func:`worst_inputs`.
        limit: seconds past which the policy is too slow for the loop's thread.

    Returns:
        The worst time measured.
    """
    worst = 0.0
    for document in inputs:
        spent = _quickest(evaluate, document, 1)
        if spent > limit:  # over even with the input's own cost: measure that, and again
            spent = _quickest(evaluate, document, _RUNS) - _quickest(baseline, document, _RUNS)
        worst = max(worst, spent)
        if worst > limit:
            break
    return worst


def _quickest(evaluate: Callable[[dict[str, Any]], object], document: dict[str, Any], runs: int) -> float:
    """The quickest of ``runs`` evaluations' CPU times (a preempted or disturbed run does not count)."""
    best = float("inf")
    for _ in range(runs):
        started = time.thread_time()
        with contextlib.suppress(PolicyError):
            evaluate(document)
        best = min(best, time.thread_time() - started)
    return best
