"""OpenTelemetry traces of executes, for operators (docs/tracing.md).

Off unless a :class:`Tracing` is given (``Builder(tracing=...)``; the service builds one from the
``trace_*`` settings). Off, every hook is a method of :data:`NULL_TRACE` that does nothing, and
nothing of OpenTelemetry is imported: this module imports ``opentelemetry`` only inside
:class:`Tracer`, which exists only when tracing is on.

One span per execute (``codemode.execute``) with children for the admission wait
(``codemode.admission``), acquiring the sandbox (``codemode.sandbox.acquire``: warm from a pool or
cold), each native call (``codemode.native_call``), an approval asked of the user
(``codemode.approval``) and the teardown (``codemode.teardown``, which may end after its parent: the
worker is reaped in the background). Attributes carry ids, names, decisions, outcome words, limit
kinds and durations only: never an argument, a result, the program, a print, a policy or handler
text or an error message, and the subject only as a hash (or not at all).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ATTRIBUTES",
    "MAX_TRACE_HEADER_BYTES",
    "NULL_TRACE",
    "SPAN_NAMES",
    "TRACE_SUBJECT_LABEL",
    "ExecuteTrace",
    "SubjectMode",
    "Trace",
    "Tracer",
    "Tracing",
    "subject_hash",
]

#: Every span a trace may hold (docs/tracing.md lists them).
SPAN_NAMES = (
    "codemode.execute",
    "codemode.admission",
    "codemode.sandbox.acquire",
    "codemode.native_call",
    "codemode.approval",
    "codemode.teardown",
)
#: Every attribute a span may carry (docs/tracing.md lists them): nothing else is ever set.
ATTRIBUTES = (
    "codemode.subject",
    "codemode.runtime",
    "codemode.outcome",
    "codemode.limit",
    "codemode.native_calls",
    "codemode.worker.id",
    "codemode.admission.granted",
    "codemode.sandbox.acquired",
    "codemode.sandbox.warm",
    "codemode.capability.id",
    "codemode.capability.name",
    "codemode.call.decision",
    "codemode.call.outcome",
    "codemode.call.authz_seconds",
    "codemode.call.handler_seconds",
    "codemode.approval.answer",
)

#: The HMAC key of :func:`subject_hash`: a domain label, not a secret.
TRACE_SUBJECT_LABEL = b"codemode trace subject pseudonym"

#: How an execute span names its subject: a hash of the id, or not at all.
SubjectMode = Literal["hash", "omit"]

#: Bytes of a ``traceparent`` / ``tracestate`` value read from a request; longer ones are ignored.
MAX_TRACE_HEADER_BYTES = 512


@dataclass(frozen=True)
class Tracing:
    """What ``Builder(tracing=...)`` takes.

    Args:
        provider: an OpenTelemetry ``TracerProvider`` (the SDK's, with the exporter of your choice).
        subject: ``"hash"`` (default) puts ``codemode.subject`` = :func:`subject_hash` of the
            subject id on each execute span (a pseudonym: whoever can guess an id can confirm it);
            ``"omit"`` leaves the subject out.
    """

    provider: Any
    subject: SubjectMode = "hash"


def subject_hash(subject_id: str) -> str:
    """The pseudonym a trace carries for a subject (``codemode.subject``). It has a domain of its
    own (:data:`TRACE_SUBJECT_LABEL`), so it shares no digits with the subject's other derived
    names (its data-dir name, the quota Lease label: plain SHA-256 prefixes of the id), and one
    cannot be matched with another.

    Args:
        subject_id: the subject id.

    Returns:
        The first 16 hex digits of the HMAC-SHA256 of its UTF-8 bytes keyed with
        :data:`TRACE_SUBJECT_LABEL`.
    """
    data = subject_id.encode("utf-8", "surrogatepass")
    return hmac.new(TRACE_SUBJECT_LABEL, data, hashlib.sha256).hexdigest()[:16]


class _NullTrace:
    """The trace of an execute when tracing is off: every hook does nothing."""

    __slots__ = ()

    def now(self) -> int:
        return 0

    def admission(self, start: int, granted: bool) -> None:
        return None

    def acquire(self, start: int, acquired: bool, warm: bool) -> None:
        return None

    def native_call(
        self,
        start: int,
        capability_id: str,
        capability: str,
        decision: str,
        outcome: str,
        authz_seconds: float,
        handler_seconds: float,
    ) -> None:
        return None

    def approval(self, start: int, answer: str) -> None:
        return None

    def teardown(self, start: int) -> None:
        return None

    def finish(self, outcome: str, limit: str | None, native_calls: int, worker_id: str) -> None:
        return None


NULL_TRACE = _NullTrace()


class ExecuteTrace:
    """The spans of one execute. Each child is created when its step is over, with the step's
    start time (``now()``, taken when it began), so an unfinished step leaves no open span.

    Args:
        tracer: the OpenTelemetry tracer the children are made with.
        root: the execute span.
        context: the context holding the root span (the children's parent).
        trace_api: the ``opentelemetry.trace`` module.
    """

    __slots__ = ("_api", "_context", "_root", "_tracer")

    def __init__(self, tracer: Any, root: Any, context: Any, trace_api: Any) -> None:
        self._tracer = tracer
        self._root = root
        self._context = context
        self._api = trace_api

    def now(self) -> int:
        """The start time of a step.

        Returns:
            Nanoseconds since the epoch.
        """
        return time.time_ns()

    def _child(self, name: str, start: int, attributes: Mapping[str, Any]) -> None:
        span = self._tracer.start_span(name, context=self._context, start_time=start, attributes=attributes)
        span.end()

    def admission(self, start: int, granted: bool) -> None:
        """The ``codemode.admission`` span: the wait for a worker slot.

        Args:
            start: the step's start (:meth:`now` when it began).
            granted: whether a slot was granted.
        """
        self._child("codemode.admission", start, {"codemode.admission.granted": granted})

    def acquire(self, start: int, acquired: bool, warm: bool) -> None:
        """The ``codemode.sandbox.acquire`` span.

        Args:
            start: the step's start (:meth:`now` when it began).
            acquired: whether a sandbox was acquired.
            warm: whether it came warm from a pool (else it was spawned cold).
        """
        self._child(
            "codemode.sandbox.acquire",
            start,
            {"codemode.sandbox.acquired": acquired, "codemode.sandbox.warm": warm},
        )

    def native_call(
        self,
        start: int,
        capability_id: str,
        capability: str,
        decision: str,
        outcome: str,
        authz_seconds: float,
        handler_seconds: float,
    ) -> None:
        """A ``codemode.native_call`` span.

        Args:
            start: the step's start (:meth:`now` when it began).
            capability_id: the capability's id.
            capability: its dotted name.
            decision: the authorizer's decision.
            outcome: the call's outcome word.
            authz_seconds: seconds the authorizer took.
            handler_seconds: seconds the handler took.
        """
        self._child(
            "codemode.native_call",
            start,
            {
                "codemode.capability.id": capability_id,
                "codemode.capability.name": capability,
                "codemode.call.decision": decision,
                "codemode.call.outcome": outcome,
                "codemode.call.authz_seconds": authz_seconds,
                "codemode.call.handler_seconds": handler_seconds,
            },
        )

    def approval(self, start: int, answer: str) -> None:
        """The ``codemode.approval`` span: a question asked of the user.

        Args:
            start: the step's start (:meth:`now` when it began).
            answer: the user's answer.
        """
        self._child("codemode.approval", start, {"codemode.approval.answer": answer})

    def teardown(self, start: int) -> None:
        """The ``codemode.teardown`` span (it may end after its parent).

        Args:
            start: the step's start (:meth:`now` when it began).
        """
        self._child("codemode.teardown", start, {})

    def finish(self, outcome: str, limit: str | None, native_calls: int, worker_id: str) -> None:
        """End the execute span (status ``ERROR`` unless the outcome is ``ok``; no description).

        Args:
            outcome: the execute's outcome word.
            limit: the kind of the limit it exceeded, if any.
            native_calls: the native calls it made.
            worker_id: its worker's id (empty when it got none).
        """
        trace_api = self._api
        root = self._root
        root.set_attribute("codemode.outcome", outcome)
        root.set_attribute("codemode.native_calls", native_calls)
        if worker_id:
            root.set_attribute("codemode.worker.id", worker_id)
        if limit:
            root.set_attribute("codemode.limit", limit)
        if outcome != "ok":
            # The outcome word only: a status description would be free text.
            root.set_status(trace_api.Status(trace_api.StatusCode.ERROR))
        root.end()


#: What the execute pipeline holds: a live trace, or the one that does nothing.
Trace = ExecuteTrace | _NullTrace


class Tracer:
    """Starts the trace of each execute (made by the executor from a :class:`Tracing`).

    Args:
        tracing: the tracing settings.
        runtime_name: the runtime's name, set on each execute span.

    Raises:
        ValueError: ``tracing.subject`` is neither ``hash`` nor ``omit``.
    """

    def __init__(self, tracing: Tracing, runtime_name: str) -> None:
        from opentelemetry import context as context_api
        from opentelemetry import trace as trace_api
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if tracing.subject not in ("hash", "omit"):
            raise ValueError('tracing subject must be "hash" or "omit"')
        self._api = trace_api
        self._context_api = context_api
        self._propagator = TraceContextTextMapPropagator()
        self._tracer = tracing.provider.get_tracer("codemode")
        self._subject = tracing.subject
        self._runtime = runtime_name

    def start(self, subject_id: str, carrier: Mapping[str, Any] | None) -> ExecuteTrace:
        """The execute span: always the root of a new trace, whose id and sampling the host's
        provider decides. A valid W3C ``traceparent`` in ``carrier`` (as an MCP client sends it in
        ``_meta``) is only *linked*: the link names its trace and span id, never its flags or its
        ``tracestate`` (a tenant's context may not turn tracing off, pick the host's trace id, or put
        its state on the host's spans).

        Args:
            subject_id: the subject id (hashed or left out as configured).
            carrier: the request's trace context, if any (a value over
                :data:`MAX_TRACE_HEADER_BYTES` is ignored).

        Returns:
            The execute's trace.
        """
        links = []
        claimed = self._claimed(carrier)
        if claimed is not None:
            links.append(self._api.Link(claimed))
        attributes: dict[str, Any] = {"codemode.runtime": self._runtime}
        if self._subject == "hash":
            attributes["codemode.subject"] = subject_hash(subject_id)
        root = self._tracer.start_span(
            "codemode.execute",
            context=self._context_api.Context(),  # a new trace, whatever context is current
            kind=self._api.SpanKind.SERVER,
            attributes=attributes,
            links=links,
        )
        return ExecuteTrace(self._tracer, root, self._api.set_span_in_context(root), self._api)

    def _claimed(self, carrier: Mapping[str, Any] | None) -> Any:
        """The span a client's ``traceparent`` names, without its flags or state (None: none valid)."""
        value = carrier.get("traceparent") if carrier else None
        if not isinstance(value, str) or len(value) > MAX_TRACE_HEADER_BYTES:
            return None
        sent = self._api.get_current_span(self._propagator.extract({"traceparent": value})).get_span_context()
        if not sent.is_valid:
            return None
        return self._api.SpanContext(sent.trace_id, sent.span_id, is_remote=True)
