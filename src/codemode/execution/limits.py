"""Execution and discovery limits (docs/reference/limits.md). Zero means "use the default"; negative is a
build error. ``max_print_bytes`` defaults to 0, which turns prints off."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ..catalog.answers import DEFAULT_MAX_DESCRIBE_RESPONSE_BYTES

__all__ = ["DEFAULTS", "DEFAULT_SUBJECT_QUOTA", "FLOAT_LIMITS", "PRINTS_OVER_VALUE", "UNITS", "Limits"]

#: Prints are bounded like a value: a program cannot return more through them than through main().
PRINTS_OVER_VALUE = "limits: max_print_bytes must not exceed max_value_bytes"

#: Concurrent executes one subject may run (``Builder(subject_quota=...)``, ``--subject-quota``).
DEFAULT_SUBJECT_QUOTA = 4

DEFAULTS: dict[str, float] = {
    "max_source_bytes": 64 * 1024,
    "max_execution_steps": 1_000_000,
    "max_execution_time": 5.0,
    "max_native_calls": 100,
    "max_value_depth": 32,
    "max_value_bytes": 1024 * 1024,
    "max_intermediate_value_bytes": 8 * 1024 * 1024,
    "max_search_query_bytes": 256,
    "max_search_results": 20,
    "max_concurrent_executions": 8,
    "max_search_response_bytes": 64 * 1024,
    "max_callstack": 100,
    "max_describe_response_bytes": DEFAULT_MAX_DESCRIBE_RESPONSE_BYTES,
    "max_print_bytes": 0,
    "max_approval_time": 120.0,
    "max_pending_approvals": 1,
}

#: The limits counted in seconds (floats); every other one is a count or bytes.
FLOAT_LIMITS = frozenset({"max_execution_time", "max_approval_time"})

#: What each limit counts (shown by ``--help`` and docs/reference/limits.md).
UNITS: dict[str, str] = {
    "max_source_bytes": "bytes of program source (UTF-8)",
    "max_execution_steps": "interpreter steps per execute (loop iterations and function calls)",
    "max_execution_time": "seconds of wall time per execute",
    "max_native_calls": "capability calls per execute",
    "max_value_depth": "nesting depth of a value crossing the boundary",
    "max_value_bytes": "encoded bytes of one value crossing the boundary",
    "max_intermediate_value_bytes": "encoded bytes of all capability results of one execute",
    "max_search_query_bytes": "bytes of a search query",
    "max_search_results": "results per search",
    "max_concurrent_executions": "executes in flight at once (slots)",
    "max_search_response_bytes": "bytes of a search response (compact JSON)",
    "max_callstack": "Starlark call-stack depth",
    "max_describe_response_bytes": "bytes of one describe_api answer (compact JSON)",
    "max_print_bytes": "bytes of print() output returned per execute (0 = prints are discarded)",
    "max_approval_time": "seconds a question to the user may stay open (paused: not max_execution_time)",
    "max_pending_approvals": "approvals one subject may have open at once (a further ask is declined)",
}


@dataclass(frozen=True)
class Limits:
    """Per-execute budgets; a field left at 0 takes its default (units, defaults and where each is
    enforced: docs/reference/limits.md).

    The program: ``max_source_bytes`` (its source), ``max_execution_steps`` (interpreter work, in
    the worker's ticks), ``max_execution_time`` (seconds of the whole execute), ``max_callstack``
    (Starlark frames), ``max_print_bytes`` (prints kept; its default is 0: none). Its calls:
    ``max_native_calls`` (per execute), ``max_value_depth`` and ``max_value_bytes`` (each argument
    map, result and ``main()``'s value), ``max_intermediate_value_bytes`` (all results sent to the
    worker). Search and describe: ``max_search_query_bytes``, ``max_search_results``,
    ``max_search_response_bytes``, ``max_describe_response_bytes``. The server:
    ``max_concurrent_executions`` (worker slots). Asking the user: ``max_approval_time`` (seconds a
    question may stay open) and ``max_pending_approvals`` (questions one subject may have open).
    """

    max_source_bytes: int = 0
    max_execution_steps: int = 0
    max_execution_time: float = 0.0
    max_native_calls: int = 0
    max_value_depth: int = 0
    max_value_bytes: int = 0
    max_intermediate_value_bytes: int = 0
    max_search_query_bytes: int = 0
    max_search_results: int = 0
    max_concurrent_executions: int = 0
    max_search_response_bytes: int = 0
    max_callstack: int = 0
    max_describe_response_bytes: int = 0
    max_print_bytes: int = 0  # its default is 0: prints are kept only when this is set
    max_approval_time: float = 0.0
    max_pending_approvals: int = 0

    def problems(self) -> list[str]:
        """What ``Builder.build()`` refuses in these limits.

        Returns:
            One text per problem: a non-number, a negative or non-finite value, prints larger than a
            value; empty when the limits are usable.
        """
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                out.append(f"limits: {f.name} must be a number")
            elif value < 0:
                out.append(f"limits: {f.name} must not be negative")
            elif value != value or value == float("inf"):
                out.append(f"limits: {f.name} must be finite")
        if not out:
            resolved = self.resolved()
            if resolved.max_print_bytes > resolved.max_value_bytes:
                out.append(PRINTS_OVER_VALUE)
        return out

    def resolved(self) -> Limits:
        """The limits as the server applies them. Call after ``problems()`` is empty.

        Returns:
            A copy with every zero replaced by its default.
        """
        changes: dict[str, float] = {}
        for f in fields(self):
            if getattr(self, f.name) == 0:
                default = DEFAULTS[f.name]
                changes[f.name] = default if f.name in FLOAT_LIMITS else int(default)
        return replace(self, **changes)  # type: ignore[arg-type]
