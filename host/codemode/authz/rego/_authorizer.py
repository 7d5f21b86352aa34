"""The in-process Rego authorizer on regopy (rego-cpp): the contract (input document, decision
values, errors) is docs/reference/authorization.md; the design (what construction checks, thread
safety, speed, deadlines, measurements) is docs/authz.md.

For the code reader: :class:`RegoAuthorizer` validates everything at construction (the lexical scan
is :mod:`codemode.authz.rego._scan`, then compilation, the audit of the builtins the compiled plan
links, and one probe evaluation). A regopy ``Interpreter`` must never be used by two threads at once
(it crashes the process), so each evaluating thread builds its own interpreter and compiled bundle
from the validated sources, lazily, never shared; the input goes to the C API directly
(:mod:`codemode.authz.rego._direct`). :meth:`RegoAuthorizer.authorize` hands the evaluation to a
small pool of daemon threads through ``codemode.common.handoff`` (``evaluate_inline=True``
evaluates on the calling thread instead), or evaluates a bounded policy (``_bounded``, whose
cost ``_calibrate`` measured at construction) on the calling thread, under a guard and a
per-loop-turn budget.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import math
import os
import queue
import re
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal

import regopy

from ...common.handoff import NOT_YET, HandOff
from .. import AskUser, AuthorizationInput, Denied, PolicyError, Subject
from ._bounded import input_paths, small_input, unbounded_reason
from ._calibrate import worst_case, worst_inputs
from ._direct import DIRECT as _DIRECT
from ._direct import INT64_MAX as _INT64_MAX
from ._direct import INT64_MIN as _INT64_MIN
from ._direct import MAX_INPUT_DEPTH as _MAX_INPUT_DEPTH
from ._direct import NUL_MESSAGE as _NUL_MESSAGE
from ._direct import SURROGATE_MESSAGE as _SURROGATE_MESSAGE
from ._direct import evaluate as direct_evaluate
from ._scan import (
    ScanError,
    check_modules,
    defined_rules,
    forbidden_reason,
    is_identifier,
    parse_decision,
)

__all__ = [
    "ASK",
    "INLINE_BUDGET",
    "WAIT_BUDGET",
    "Decision",
    "InvalidPolicy",
    "RegoAuthorizer",
    "UnknownDecision",
    "from_files",
]

#: Default seconds ``authorize()`` may block the calling thread waiting for an evaluation.
WAIT_BUDGET = 0.002
#: Evaluations over the budget within ``codemode.common.handoff.SLOW_WINDOW`` at which
#: ``authorize()`` stops blocking the calling thread.
_SLOW_LIMIT = 4
#: Seconds a bounded policy's evaluation on the calling thread is meant to take at most: a decision
#: with less time left before its deadline goes to the pool, a policy that takes more than a quarter
#: of it on the worst inputs built at construction is never evaluated inline, and the guard
#: (:meth:`RegoAuthorizer._timed`) stops inline evaluation for good once one takes more than twice
#: it, or ``_SLOW_LIMIT`` take more within ``_SLOW_WINDOW``. It is also the inline evaluation time
#: one event-loop turn may spend: past it, an inline decision first yields the loop.
INLINE_BUDGET: Final = 0.001
#: Seconds within which ``_SLOW_LIMIT`` inline evaluations over the budget stop inline evaluation.
_SLOW_WINDOW: Final = 60.0


log = logging.getLogger("codemode.authz.rego")


class InvalidPolicy(ValueError):
    """The decision or the modules are not acceptable; the message names the problem."""


class UnknownDecision(InvalidPolicy):
    """The decision names no rule of the loaded modules (every call would fail as undefined)."""


def _check_decision(decision: str, segments: tuple[str | int, ...], rules: Mapping[str, set[str]]) -> None:
    """The decision must start with a rule of some package (it may go on into the rule's value)."""
    given = [str(s) for s in segments]
    for package, heads in rules.items():
        for rule in heads:
            named = [*package.split("."), *rule.split(".")]
            if given[: len(named)] == named:
                return
    found = "; ".join(
        f"data.{package} (rules {', '.join(sorted(heads)) or 'none'})"
        for package, heads in sorted(rules.items())
    )
    raise UnknownDecision(f"decision {decision!r} names no rule of the loaded modules: {found}")


def _new_interpreter(strict: bool) -> regopy.Interpreter:
    interp = regopy.Interpreter()
    interp.log_level = regopy.LogLevel.NONE  # nothing from the policy reaches stdout/stderr
    if strict:
        interp.strict_built_in_errors = True
    return interp


def _check_value(value: Any, depth: int) -> None:
    """The input document must be plain JSON that rego-cpp represents exactly (fail closed).

    rego-cpp takes strings as C strings, so a NUL would silently cut the string short (a policy would
    see ``"public"`` for ``"public\\x00/../secret"``); integers are int64; floats must be finite.
    """
    if depth > _MAX_INPUT_DEPTH:
        raise PolicyError("rego: input is nested too deeply")
    if value is None or value is True or value is False:
        return
    if isinstance(value, str):
        _check_str(value)
    elif isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise PolicyError("rego: input integer outside the int64 range")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise PolicyError("rego: input float is not finite")
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise PolicyError("rego: input object keys must be strings")
            _check_str(k)
            _check_value(v, depth + 1)
    elif isinstance(value, list | tuple):
        for v in value:
            _check_value(v, depth + 1)
    else:
        raise PolicyError(f"rego: input value of type {type(value).__name__} is not JSON")


def _check_str(value: str) -> None:
    if "\x00" in value:
        raise PolicyError(_NUL_MESSAGE)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise PolicyError(_SURROGATE_MESSAGE) from None


#: The one decision value besides true and false: let the user decide (authz.AskUser).
ASK: Final = "ask"
#: What a decision evaluates to.
Decision = bool | Literal["ask"]


def _answer(decision: Decision) -> None:
    """Return (allow), or raise :class:`Denied` or :class:`AskUser` for a decision."""
    if decision == ASK:
        raise AskUser('rego: decision is "ask"')
    if decision is not True:
        raise Denied("rego: decision is false")


_ALLOW_TEXT = '{"expressions":[true]}'
_DENY_TEXT = '{"expressions":[false]}'
_ERRORMSG_RE = re.compile(r"\(errormsg \d+:([^\n)]*)")


def _classify(ok: bool, text: str, binding: str | None) -> Decision:
    """rego-cpp's output for one evaluation → True (allow) / False (deny) / ``"ask"`` (ask the
    user), or PolicyError."""
    if not ok:
        # Strict builtin errors, conflicting rule values, type errors: rego-cpp reports "<error>".
        raise PolicyError("rego: evaluation error")
    if binding is None:
        if text == _ALLOW_TEXT:
            return True
        if text == _DENY_TEXT:
            return False
    text = text.strip()
    if text == "undefined":
        raise PolicyError("rego: decision is undefined")
    if text.startswith("(error") or text.startswith("<error"):
        # Some errors (unknown function, recursion, some builtin errors) come back as an error tree
        # in an output that claims success.
        m = _ERRORMSG_RE.search(text)
        raise PolicyError("rego: evaluation error" + (f": {m.group(1)}" if m else ""))
    try:
        doc = json.loads(text)
    except ValueError:
        raise PolicyError("rego: unreadable evaluator output") from None
    if isinstance(doc, list):
        if len(doc) != 1:
            raise PolicyError("rego: decision has more than one result")
        doc = doc[0]
    if not isinstance(doc, dict):
        raise PolicyError("rego: unreadable evaluator output")
    if binding is None:
        exprs = doc.get("expressions")
        if not isinstance(exprs, list):
            raise PolicyError("rego: unreadable evaluator output")
        if not exprs:
            raise PolicyError("rego: decision is undefined")
        if len(exprs) != 1:
            raise PolicyError("rego: decision has more than one result")
        value = exprs[0]
    else:
        bindings = doc.get("bindings")
        if not isinstance(bindings, dict) or binding not in bindings:
            raise PolicyError("rego: decision is undefined")
        value = bindings[binding]
    if value is True:
        return True
    if value is False:
        return False
    if value == ASK:
        return ASK
    raise PolicyError('rego: decision must be true, false or "ask"')


class _Evaluator:
    """One thread's private interpreter and compiled bundle. Never shared between threads."""

    __slots__ = ("_builder", "_bundle", "_entrypoint", "_entrypoint_c", "_query", "_runner")

    def __init__(self, modules: Mapping[str, str], entrypoint: str | None, query: str | None) -> None:
        builder = _new_interpreter(strict=False)
        for name, source in modules.items():
            builder.add_module(name, source)
        bundle = builder.build(query, [entrypoint] if entrypoint is not None else [])
        if not bundle.ok():
            raise PolicyError("rego: the policy did not compile")
        self._builder = builder  # kept alive with its bundle
        self._bundle = bundle
        self._runner = _new_interpreter(strict=True)
        self._entrypoint = entrypoint
        self._entrypoint_c = entrypoint.encode() if entrypoint is not None else b""
        self._query = query

    def evaluate(self, document: dict[str, Any]) -> Decision:
        lib = _DIRECT
        if lib is not None:
            entrypoint = self._entrypoint_c if self._entrypoint is not None else None
            ok, text = direct_evaluate(lib, self._runner._impl, self._bundle._impl, entrypoint, document)
        else:
            ok, text = self._evaluate_public(document)
        return _classify(ok, text, None if self._entrypoint is not None else "x")

    def _evaluate_public(self, document: dict[str, Any]) -> tuple[bool, str]:
        _check_value(document, 0)
        self._runner.set_input(regopy.Input(document))
        try:
            if self._entrypoint is not None:
                output = self._runner.query_bundle_entrypoint(self._bundle, self._entrypoint)
            else:
                output = self._runner.query_bundle(self._bundle)
        except ValueError:
            # regopy's Output parses the text as JSON and fails on rego-cpp's error trees.
            raise PolicyError("rego: evaluation error") from None
        return bool(output.ok()), str(output)


# -- the evaluation pool -------------------------------------------------------------------------------------

_Job = tuple["concurrent.futures.Future[Decision]", dict[str, Any]] | None


class _Pool:
    """A few daemon threads, each with its own :class:`_Evaluator`, fed from one queue.

    Daemon threads (unlike ``ThreadPoolExecutor``'s) never hold up interpreter exit behind an
    evaluation that was abandoned at its deadline.
    """

    def __init__(self, size: int, factory: Callable[[], _Evaluator]) -> None:
        self._size = size
        self._factory = factory
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def check_open(self) -> None:
        if self._closed:
            raise PolicyError("rego: the authorizer is closed")

    def submit(self, document: dict[str, Any]) -> concurrent.futures.Future[Decision]:
        self.check_open()
        if len(self._threads) < self._size:
            self._start_threads()
        fut: concurrent.futures.Future[Decision] = concurrent.futures.Future()
        self._queue.put((fut, document))
        return fut

    def _start_threads(self) -> None:
        with self._lock:
            while len(self._threads) < self._size:
                t = threading.Thread(
                    target=_pool_worker,
                    args=(self._queue, self._factory),
                    name=f"codemode-rego-{len(self._threads)}",
                    daemon=True,
                )
                t.start()
                self._threads.append(t)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._threads:
                self._queue.put(None)


def _pool_worker(jobs: queue.SimpleQueue[_Job], factory: Callable[[], _Evaluator]) -> None:
    evaluator: _Evaluator | None = None
    while True:
        job = jobs.get()
        if job is None:
            return
        fut, document = job
        if not fut.set_running_or_notify_cancel():
            continue  # cancelled (deadline or caller cancellation) before it started
        try:
            if evaluator is None:
                evaluator = factory()
            fut.set_result(evaluator.evaluate(document))
        except BaseException as exc:
            fut.set_exception(exc)
        del fut, document, job


# -- the authorizer -------------------------------------------------------------------------------


def _document(input: AuthorizationInput) -> dict[str, Any]:
    subject = input.subject
    if not isinstance(subject, Subject) or not isinstance(subject.id, str):
        raise PolicyError("rego: authorization input has no valid subject")
    if not isinstance(input.capability_id, str) or not isinstance(input.capability_name, str):
        raise PolicyError("rego: authorization input has no valid capability")
    if not isinstance(input.arguments, dict):
        raise PolicyError("rego: authorization arguments must be a dict")
    return {
        "subject": {"id": subject.id},
        "capability": {"id": input.capability_id, "name": input.capability_name},
        "arguments": input.arguments,
    }


def _small(document: dict[str, Any]) -> bool:
    """:func:`small_input` of a document from :func:`_document`, walking only its arguments: the
    rest is six values (the document, ``subject``, its id, ``capability``, its id and name) and 34
    characters of keys besides the three strings."""
    subject, capability = document["subject"], document["capability"]
    known = len(subject["id"]) + len(capability["id"]) + len(capability["name"]) + 34
    return small_input(document["arguments"], 6, known, 1)


def _position(source: str, offset: int) -> tuple[int, int]:
    data = source.encode("utf-8")[:offset]
    text = data.decode("utf-8", errors="ignore")
    line = text.count("\n") + 1
    col = len(text) - (text.rfind("\n") + 1) + 1
    return line, col


_COMPILE_ERROR_RE = re.compile(r"\(error \d+:(?P<file>[^\n]*?)\|(?P<pos>\d+)\|\d+\s")


def _compile_error_text(message: str, modules: Mapping[str, str]) -> str:
    """rego-cpp's error tree → ``file:line:col: message`` lines (at most 5)."""
    lines: list[str] = []
    for block in re.split(r"(?=\(error )", message):
        msg = _ERRORMSG_RE.search(block)
        if msg is None:
            continue
        where = ""
        loc = _COMPILE_ERROR_RE.search(block)
        if loc is not None and loc.group("file") in modules:
            line, col = _position(modules[loc.group("file")], int(loc.group("pos")))
            where = f"{loc.group('file')}:{line}:{col}: "
        lines.append(where + msg.group(1).strip())
    if not lines:
        return "the policy does not compile"
    return "; ".join(lines[:5])


class RegoAuthorizer:
    """An :class:`~codemode.authz.Authorizer` that evaluates a Rego decision in process. Safe for
    concurrent use from any number of threads and asyncio tasks.

    Args (of the constructor):
        decision: one ground reference into ``data`` (``data.app.allow``, ``data.app["allow"]``).
        modules: filename → Rego v1 source, from trusted configuration only.
        max_workers: bounds the threads that evaluate for :meth:`authorize` (default 4).
        wait_budget: how long (seconds) :meth:`authorize` may block the calling thread waiting for
            an evaluation before it yields to the event loop (default 2 ms; 0 never blocks).
        evaluate_inline: evaluate on the calling thread (no hand-off at all): only for policies
            whose evaluation time is bounded whatever the input, since a running evaluation cannot
            be stopped at the deadline.
        bounded_inline: evaluate on the calling thread when the policy is bounded (nothing in it
            iterates, and its cost measured at construction on its worst inputs is small, see
            docs/authz.md), the input is small, more than :data:`INLINE_BUDGET` is left before the
            deadline, the calling thread already has its interpreter and the guard has not tripped
            (default True; False always hands off).

    Raises (the constructor):
        InvalidPolicy: invalid input (a ``ValueError``), naming the problem.
        UnknownDecision: the decision names no rule of the modules.
    """

    def __init__(
        self,
        decision: str,
        modules: Mapping[str, str],
        *,
        max_workers: int = 4,
        wait_budget: float = WAIT_BUDGET,
        evaluate_inline: bool = False,
        bounded_inline: bool = True,
    ) -> None:
        try:
            segments = parse_decision(decision)
        except ScanError as exc:
            raise InvalidPolicy(str(exc)) from None
        if not isinstance(modules, Mapping):
            raise InvalidPolicy("modules must be a mapping of filename to Rego source")
        if not modules:
            raise InvalidPolicy("at least one policy module is required")
        sources: dict[str, str] = {}
        for name, source in modules.items():
            if not isinstance(name, str) or not name.strip():
                raise InvalidPolicy("policy module filenames must be non-blank strings")
            if not name.isprintable():
                raise InvalidPolicy(f"policy module filename {name!r} contains non-printable characters")
            if not isinstance(source, str):
                raise InvalidPolicy(f"policy module {name!r} must be a str of Rego source")
            sources[name] = source
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise InvalidPolicy("max_workers must be a positive int")
        if (
            isinstance(wait_budget, bool)
            or not isinstance(wait_budget, int | float)
            or not 0 <= wait_budget < math.inf
        ):
            raise InvalidPolicy("wait_budget must be a finite number of seconds >= 0")
        if not isinstance(evaluate_inline, bool):
            raise InvalidPolicy("evaluate_inline must be a bool")
        if not isinstance(bounded_inline, bool):
            raise InvalidPolicy("bounded_inline must be a bool")
        self._handoff = HandOff(float(wait_budget), _SLOW_LIMIT)
        self._inline = evaluate_inline

        self._decision = decision.strip()
        self._modules: Mapping[str, str] = sources
        if all(is_identifier(s) for s in segments):
            self._entrypoint: str | None = "/".join(str(s) for s in segments)
            self._query: str | None = None
        else:
            self._entrypoint = None
            self._query = "x := data" + "".join(f"[{json.dumps(s)}]" for s in segments)

        checker = _new_interpreter(strict=False)
        try:
            check_modules(sources, checker.is_builtin)
            rules = defined_rules(sources)
        except ScanError as exc:
            raise InvalidPolicy(str(exc)) from None
        _check_decision(self._decision, segments, rules)
        for name, source in sources.items():
            try:
                checker.add_module(name, source)
            except regopy.RegoError as exc:
                raise InvalidPolicy(
                    f"policy does not compile: {_compile_error_text(str(exc), sources)}"
                ) from None
        self._audit_plan()
        self._bounded = False
        self._overruns: deque[float] = deque(maxlen=_SLOW_LIMIT)
        reason = unbounded_reason(sources) if bounded_inline and not evaluate_inline else "not asked for"
        if reason is not None:
            log.debug("rego: evaluations go to the pool (unbounded policy: %s)", reason)

        # This thread's evaluator doubles as the probe.
        self._local = threading.local()
        try:
            evaluator = self._new_evaluator()
        except regopy.RegoError as exc:
            raise InvalidPolicy(
                f"policy does not compile: {_compile_error_text(str(exc), sources)}"
            ) from None
        except PolicyError as exc:
            raise InvalidPolicy(f"policy does not compile: {exc}") from None
        self._local.evaluator = evaluator
        self._probe(evaluator)
        if reason is None:
            self._bounded = self._calibrate(evaluator)

        # The factory must not reference self, or the worker threads would keep the authorizer alive.
        self._pool = _Pool(max_workers, functools.partial(_Evaluator, sources, self._entrypoint, self._query))
        self._finalizer = weakref.finalize(self, self._pool.close)

    # -- construction helpers

    def _new_evaluator(self) -> _Evaluator:
        return _Evaluator(self._modules, self._entrypoint, self._query)

    def _audit_plan(self) -> None:
        """Second line of defence behind the scanner: every builtin the compiled plan links must pass
        the forbidden list (the plan is what rego-cpp will actually run)."""
        builder = _new_interpreter(strict=False)
        # Module names become file names inside the saved bundle: use neutral ones.
        for i, source in enumerate(self._modules.values()):
            builder.add_module(f"module{i}.rego", source)
        try:
            bundle = builder.build(self._query, [self._entrypoint] if self._entrypoint is not None else [])
        except regopy.RegoError as exc:
            raise InvalidPolicy(f"policy does not compile: {_compile_error_text(str(exc), {})}") from None
        if not bundle.ok():
            raise InvalidPolicy("policy does not compile")
        with tempfile.TemporaryDirectory(prefix="codemode-rego-") as tmp:
            path = os.path.join(tmp, "bundle")
            try:
                builder.save_bundle(path, bundle)
                with open(os.path.join(path, "plan.json"), encoding="utf-8") as f:
                    plan = json.load(f)
                funcs = plan.get("static", {}).get("builtin_funcs", []) or []
                names = [str(fn["name"]) for fn in funcs]
            except (OSError, ValueError, KeyError, TypeError, AttributeError, regopy.RegoError) as exc:
                raise InvalidPolicy(f"could not audit the compiled policy: {type(exc).__name__}") from None
        for name in names:
            reason = forbidden_reason(name)
            if reason is not None:
                raise InvalidPolicy(f"forbidden builtin {name}: {reason}")

    def _probe(self, evaluator: _Evaluator) -> None:
        """rego-cpp reports some compile-time problems only when the rule runs; one evaluation with an
        empty input surfaces those on the rules it reaches."""
        probe = {"subject": {"id": ""}, "capability": {"id": "", "name": ""}, "arguments": {}}
        try:
            evaluator.evaluate(probe)
        except PolicyError as exc:
            text = str(exc)
            if "Function not found" in text or "Recursion detected" in text:
                raise InvalidPolicy(
                    f"policy does not compile: {text.removeprefix('rego: evaluation error: ')}"
                ) from None

    def _calibrate(self, evaluator: _Evaluator) -> bool:
        """Whether the policy adds at most a quarter of :data:`INLINE_BUDGET` to the evaluation of
        each of its worst inline inputs (:mod:`codemode.authz.rego._calibrate`): a bounded form is not
        a bounded cost (a long deny list of allowed forms is slow)."""
        limit = INLINE_BUDGET / 4
        inputs = worst_inputs(input_paths(self._modules))
        worst = worst_case(evaluator.evaluate, _baseline().evaluate, inputs, limit)
        if worst > limit:
            log.info(
                "rego: evaluations go to the pool (the policy adds %.2f ms on a large input, over %.2f ms)",
                worst * 1e3,
                limit * 1e3,
            )
            return False
        return True

    # -- evaluation

    def decide(self, input: AuthorizationInput) -> Decision:
        """Evaluate on the calling thread (blocking). Thread-safe: each calling thread uses its own
        interpreter (built on first use).

        Args:
            input: what the policy decides on (its ``input`` document).

        Returns:
            True allows, False denies, ``"ask"`` asks the user.

        Raises:
            PolicyError: the policy failed or answered anything else.
        """
        return self._evaluator().evaluate(_document(input))

    def _evaluator(self) -> _Evaluator:
        """The calling thread's own evaluator (never used by another thread)."""
        evaluator: _Evaluator | None = getattr(self._local, "evaluator", None)
        if evaluator is None:
            evaluator = self._new_evaluator()
            self._local.evaluator = evaluator
        return evaluator

    async def authorize(self, ctx: Any, input: AuthorizationInput) -> None:
        """Allow (return), deny (:class:`~codemode.authz.Denied`) or fail (:class:`PolicyError`).

        A bounded policy with a small input and more than :data:`INLINE_BUDGET` left is evaluated
        on the calling thread (``bounded_inline``; once the loop's turn has spent
        :data:`INLINE_BUDGET` on such evaluations, it first yields to the loop). Anything else is
        evaluated on the pool (or inline, see ``evaluate_inline``) and returns by ``ctx.deadline``
        (monotonic seconds) at the latest: it blocks the calling thread at most ``wait_budget``,
        then waits asynchronously. If ``ctx.cancelled`` is set or the calling task is cancelled, an
        evaluation that has not started yet never runs.
        """
        document = _document(input)
        cancelled = getattr(ctx, "cancelled", None)
        if cancelled is not None and _is_set(cancelled):
            raise PolicyError("rego: the call was cancelled")
        timeout: float | None = None
        deadline: Any = getattr(ctx, "deadline", None)
        if isinstance(deadline, int | float) and not isinstance(deadline, bool):
            timeout = float(deadline) - time.monotonic()
            if timeout <= 0:
                raise PolicyError("rego: the deadline passed before evaluation")
        if self._inline:
            allowed = self._evaluator().evaluate(document)
            if timeout is not None and time.monotonic() >= float(deadline):
                raise PolicyError("rego: evaluation did not finish before the deadline")
            _answer(allowed)
            return
        if self._bounded and (timeout is None or timeout > INLINE_BUDGET) and _small(document):
            self._pool.check_open()
            # A thread without its interpreter yet (an authorizer built on another thread) would
            # build one here, for as long as the policy takes to compile: the pool's threads do that.
            evaluator: _Evaluator | None = getattr(self._local, "evaluator", None)
            until = float(deadline) if timeout is not None else None
            if evaluator is not None and (_TURN.current() < INLINE_BUDGET or await _turn_free(ctx, until)):
                _answer(self._evaluate_bounded(evaluator, document, until))
                return
            if timeout is not None:
                timeout = float(deadline) - time.monotonic()
                if timeout <= 0:
                    raise PolicyError("rego: the deadline passed before evaluation")
        started = time.monotonic()
        job = self._pool.submit(document)
        allowed = self._handoff.block(job, None if timeout is None else started + timeout)
        if allowed is NOT_YET:
            future = asyncio.wrap_future(job)
            try:
                if timeout is None:
                    allowed = await future
                else:
                    allowed = await asyncio.wait_for(future, timeout - (time.monotonic() - started))
            except TimeoutError:
                raise PolicyError("rego: evaluation did not finish before the deadline") from None
        _answer(allowed)

    def _evaluate_bounded(
        self, evaluator: _Evaluator, document: dict[str, Any], deadline: float | None
    ) -> Decision:
        """A bounded policy's evaluation on the calling thread, timed (:meth:`_timed`) and charged to
        the loop's turn (:func:`_turn_free`)."""
        started, started_cpu = time.monotonic(), time.thread_time()
        try:
            decision = evaluator.evaluate(document)
        finally:
            ended = time.monotonic()
            _TURN.spend(ended - started)
            late = deadline is not None and ended >= deadline
            self._timed(time.thread_time() - started_cpu, late)
        if late:
            raise PolicyError("rego: evaluation did not finish before the deadline")
        return decision

    def _timed(self, cpu: float, late: bool = False, now: float | None = None) -> None:
        """The guard: an inline evaluation that took more than twice :data:`INLINE_BUDGET` of CPU
        time or ended past its deadline, or the ``_SLOW_LIMIT``-th over the budget within
        ``_SLOW_WINDOW`` seconds, sends every later decision to the pool (quick evaluations in
        between do not count against them). CPU time, not wall time: a preempted evaluation is the
        machine's, not the policy's.

        Args:
            cpu: the evaluation's CPU seconds on the calling thread.
            late: it ended past its deadline.
            now: monotonic seconds (default: now).
        """
        if cpu <= INLINE_BUDGET and not late:
            return
        when = time.monotonic() if now is None else now
        self._overruns.append(when)
        tripped = (
            late
            or cpu > 2 * INLINE_BUDGET
            or (len(self._overruns) == _SLOW_LIMIT and when - self._overruns[0] <= _SLOW_WINDOW)
        )
        if tripped and self._bounded:
            self._bounded = False
            log.warning(
                "rego: an evaluation on the event loop took %.1f ms (budget %.1f ms%s): decisions go to "
                "the pool from now on",
                cpu * 1e3,
                INLINE_BUDGET * 1e3,
                ", past its deadline" if late else "",
            )

    def close(self) -> None:
        """Stop the evaluation threads (idempotent). Later :meth:`authorize` calls fail."""
        self._finalizer()

    @classmethod
    def from_files(
        cls,
        decision: str,
        paths: Iterable[str | os.PathLike[str]],
        *,
        evaluate_inline: bool = False,
        bounded_inline: bool = True,
    ) -> RegoAuthorizer:
        """Read policy files (each file's path is its module name) and build the authorizer: the
        same as the module's :func:`from_files`.

        Args:
            decision: as for the constructor.
            paths: the ``.rego`` files.
            evaluate_inline: as for the constructor.
            bounded_inline: as for the constructor.

        Returns:
            The authorizer.

        Raises:
            InvalidPolicy: a file cannot be read, or the policy is rejected.
            UnknownDecision: the decision names no rule.
        """
        return from_files(decision, paths, evaluate_inline=evaluate_inline, bounded_inline=bounded_inline)

    @property
    def decision(self) -> str:
        """The decision this authorizer evaluates (``data.<package>.<rule>``)."""
        return self._decision

    def __repr__(self) -> str:
        return f"RegoAuthorizer({self._decision!r}, modules={sorted(self._modules)!r})"


class _Turn(threading.local):
    """The inline evaluation time spent in the current turn of the calling thread's event loop."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.spent = 0.0

    def current(self) -> float:
        """Seconds spent in this turn (0 in a loop other than the last one charged)."""
        if self.loop is not asyncio.get_running_loop():
            self.loop, self.spent = None, 0.0
        return self.spent

    def spend(self, seconds: float) -> None:
        """Charge an evaluation to this turn; the next turn starts at 0."""
        if self.loop is None:
            try:
                self.loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self.spent = 0.0
            self.loop.call_soon(self._reset)  # runs at the start of the next turn
        self.spent += seconds

    def _reset(self) -> None:
        self.loop, self.spent = None, 0.0


#: Shared by every authorizer: the loop's turn is held by all of them together.
_TURN = _Turn()


async def _turn_free(ctx: Any, deadline: float | None) -> bool:
    """Wait (yielding the loop) for a turn with inline time left; False when the deadline comes too
    close first (the decision takes the hand-off then). Raises PolicyError when the call is
    cancelled meanwhile."""
    while _TURN.current() >= INLINE_BUDGET:
        await asyncio.sleep(0)
        cancelled = getattr(ctx, "cancelled", None)
        if cancelled is not None and _is_set(cancelled):
            raise PolicyError("rego: the call was cancelled")
        if deadline is not None and deadline - time.monotonic() <= INLINE_BUDGET:
            return False
    return True


_BASELINES = threading.local()


def _baseline() -> _Evaluator:
    """The calling thread's evaluator of a one-rule policy that reads nothing (calibration's measure
    of what an input costs by itself)."""
    evaluator: _Evaluator | None = getattr(_BASELINES, "evaluator", None)
    if evaluator is None:
        evaluator = _Evaluator(
            {"baseline.rego": "package baseline\n\nallow := true\n"}, "baseline/allow", None
        )
        _BASELINES.evaluator = evaluator
    return evaluator


def _is_set(event: Any) -> bool:
    try:
        return bool(event.is_set())
    except Exception:
        return False


def from_files(
    decision: str,
    paths: Iterable[str | os.PathLike[str]],
    *,
    evaluate_inline: bool = False,
    bounded_inline: bool = True,
) -> RegoAuthorizer:
    """Read policy files (each file's path is its module name) and build the authorizer.

    Args:
        decision: as for :class:`RegoAuthorizer`.
        paths: the ``.rego`` files.
        evaluate_inline: as for :class:`RegoAuthorizer`.
        bounded_inline: as for :class:`RegoAuthorizer`.

    Returns:
        The authorizer.

    Raises:
        InvalidPolicy: ``cannot read Rego policy '<path>': <reason>`` or ``Rego policy rejected:
            <problem>`` (configuration front ends, CLI and service, wrap it).
        UnknownDecision: the decision names no rule.
    """
    modules: dict[str, str] = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                modules[str(path)] = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise InvalidPolicy(f"cannot read Rego policy {str(path)!r}: {reason}") from None
    try:
        return RegoAuthorizer(
            decision, modules, evaluate_inline=evaluate_inline, bounded_inline=bounded_inline
        )
    except UnknownDecision:
        raise
    except Exception as exc:
        raise InvalidPolicy(f"Rego policy rejected: {exc}") from None
