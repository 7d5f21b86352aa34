"""Run one model-written Starlark program (starlark-pyo3) and classify how it ended.

Language surface
    Exactly ``False None True abs all any attempt bool chr dict dir enumerate fail float getattr
    hasattr hash int json len list math max min ord parallel print range repr reversed sorted str sum
    tuple type zip`` plus the capability namespaces (see ``environment``). Standard dialect without
    ``load``: no f-strings, no ``while``, no top-level ``if``/``for``, no keyword-only or
    positional-only parameter syntax, no type annotations. ``print`` output is kept up to the exec
    frame's ``max_print_bytes`` and sent to the host (``prints``), or discarded without it.

Rules
    The top level must contain exactly one ``def main():`` (column 0, empty parameter list) and
    ``main`` must still be that function after the top level ran (else ``invalid_program``).
    Native (capability) calls are accepted only while ``main`` runs and only with keyword
    arguments; they are bound against the manifest input shapes (``shapes.bind_arguments``)
    and bounded (``values.check_value``) before a ``native_call`` leaves. A call the binding
    rejects is reported to the host (``native_invalid``), which decides the error text and ends
    the program, or (under ``attempt``) answers with the error as a value. ``main``'s value must
    be a plain value (tuples become lists) within ``max_value_depth``/``max_value_bytes``.

Recoverable calls
    ``attempt(records.get, id=7)`` makes the call as ``native_attempt`` (or ``native_invalid``
    with ``attempt``); the host answers a recoverable failure (denied, failed, invalid arguments)
    with ``native_error`` and its approved text, and ``attempt`` returns ``{"ok": False, "error":
    text}``; a success is ``{"ok": True, "value": result}``. Every other failure ends the program
    as without ``attempt``: the host decides, the worker only asks.

Parallel calls
    ``parallel([(records.get, {"id": 1}), (records.get, {"id": 2})])`` checks its list, counts all
    its calls against ``max_native_calls`` at once, then makes each call through the capability
    wrapper as usual, except that the bound call (or the binding's diagnostic) is collected instead
    of sent; the batch goes to the host as one ``native_batch`` frame, whose ``native_batch_result``
    has one ``attempt``-style record per call, in order. The host decides, per call, what is a
    record and what ends the program, exactly as for ``attempt``.

Step budget: the unit, measured
    starlark-rust calls the ``check_cancelled`` hook once every 1,000 *ticks*, where a tick is
    one loop iteration (``for`` statement or comprehension) or one call of a Starlark function
    (a call statement at top level counts about twice). Measured on starlark-pyo3 2026.1.3:
    ``for i in range(N): x += i`` inside a function gives N/1000 checks whatever the loop body
    holds; a loop of N iterations calling a ``def`` each time gives 2N/1000 (except a ``def``
    that just returns a constant: starlark-rust inlines it and its calls do not tick).
    Straight-line work between ticks, calls of builtins (``len``, ``math.*``) and the time
    inside one builtin call (``sorted(range(10**8))``) are not counted: the host's wall-clock
    deadline and kill bound those.

    So **one step = one tick** (loop iteration or function call), enforced with a granularity of
    1,000: at the k-th check the program has used k*1000 steps and it is stopped with
    ``resource_limit`` as soon as k*1000 > ``max_steps``; a program may run up to
    ``max_steps + 999`` ticks. The default 1,000,000 steps is about a million loop iterations.
    Steps are counted from the first top-level statement until ``main`` returns, including the
    ticks of the Starlark-written builtins it calls (``sum``, ``json.encode``, the argument copy
    of each native call).

Errors
    Parse, resolve and runtime errors: ``invalid_program`` with ``<codemode>:LINE:COL: <first line
    of the Starlark error>`` (at most 1 KiB, non-printables replaced, no Python traceback).
    Call-stack overflow and exceeded budgets: ``resource_limit``. The Starlark call stack is
    limited to ``max_callstack`` (clamped to 10,000) plus 4 frames for the driver and builtin
    wrappers, so the program's own functions may nest about ``max_callstack + 2`` deep.
    A Rust panic (``PanicException``) or a failure of this module's own set-up: ``internal``
    with no text. A message of the machinery beneath the language (CPython's digit limit, the
    starlark-pyo3 bridge, starlark-rust's parameter unpacking) is replaced as
    ``foreign_texts.translate`` says.

Threading
    Every evaluation runs on one long-lived thread with a 256 MiB stack (deeply nested source
    or data recurses deeply inside the Rust interpreter; 64 KiB of nested brackets needs about
    that much), one program at a time per process. ``warm_up`` runs on that thread too, so the
    first real program finds the interpreter's per-thread state warm.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence

# NamedTuple, not dataclasses: importing dataclasses (and inspect, ast, dis with it) costs about
# 13 ms of CPU at every start of a single-use worker (a container or pod per execute).
from typing import Any, Final, NamedTuple, Protocol, TypeVar, cast

import starlark as sl

from . import protocol
from .diagnostics import (
    FALLBACK_LOCATION,
    FILENAME,
    bounded,
    describe_error,
    find_operator,
    has_valid_main,
    main_error,
    program_error,
)
from .environment import JSON_RESULT_DEPTH, MAX_BRIDGE_DEPTH, Environment, environment, set_hooks
from .foreign_texts import digit_limit_text, translate
from .prints import PrintBuffer
from .protocol import ProtocolError, validate_manifest
from .shapes import BindError, bind_arguments, positional_diagnostic
from .values import Overflow, ValueLimitError, ValueTypeError, check_value

__all__ = [
    "CALLSTACK_SLACK",
    "MAX_CALLSTACK",
    "STEPS_PER_CHECK",
    "ExecLimits",
    "Host",
    "HostProtocolError",
    "NativeAborted",
    "Outcome",
    "Reply",
    "on_interpreter_thread",
    "run_program",
    "warm_up",
]

STEPS_PER_CHECK: Final = protocol.STEPS_PER_CHECK
"""Ticks between two ``check_cancelled`` calls (fixed inside starlark-rust)."""
MAX_CALLSTACK: Final = 10_000
"""Upper clamp on the exec frame's ``max_callstack``."""
CALLSTACK_SLACK: Final = 4
"""Frames added to ``max_callstack`` for the driver and capability wrappers."""
THREAD_STACK_BYTES: Final = 256 * 1024 * 1024
_STACK_FALLBACKS: Final = (THREAD_STACK_BYTES, 64 * 1024 * 1024, 16 * 1024 * 1024)

T = TypeVar("T")

MAIN_MESSAGE: Final = "program must define `def main():` (no parameters) at top level"
SHIFT_MESSAGE: Final = "the << operator is not supported (its results wrap around); multiply instead"
ATTEMPT_MESSAGE: Final = "attempt() takes a capability first, e.g. attempt(records.get, id=7)"
PARALLEL_OUTSIDE_MAIN: Final = (
    "parallel() called outside main(); capabilities can only be called while main runs"
)

# The ``final_error`` message of a ``resource_limit``: which limit ran out (a fixed word list the
# host checks again).
LIMIT_STEPS: Final = "steps"
LIMIT_MEMORY: Final = "memory"
LIMIT_NATIVE_CALLS: Final = "native calls"
LIMIT_VALUE_SIZE: Final = "value size"
# Messages of the interpreter's panics when its heap cannot grow (measured on starlark-pyo3
# 2026.1.3: doubling a string to 2**40, a list of 50M strings, ``list(range(10**9))``).
_MEMORY_PANICS: Final = ("out of memory", "AlignedSize must not exceed", "capacity overflow")


class ExecLimits(NamedTuple):
    """The ``limits`` of an exec frame."""

    max_steps: int
    max_value_depth: int
    max_value_bytes: int
    max_native_calls: int
    max_callstack: int
    max_print_bytes: int = 0  # 0: the exec frame has no max_print_bytes, prints are discarded

    @classmethod
    def from_mapping(cls, limits: Mapping[str, Any]) -> ExecLimits:
        return cls(
            max_steps=int(limits["max_steps"]),
            max_value_depth=int(limits["max_value_depth"]),
            max_value_bytes=int(limits["max_value_bytes"]),
            max_native_calls=int(limits["max_native_calls"]),
            max_callstack=int(limits["max_callstack"]),
            max_print_bytes=int(limits.get("max_print_bytes", 0)),
        )


class Outcome(NamedTuple):
    """How a program ended: ``kind`` is ``"final"`` (with ``value``) or ``"error"`` (``error``
    is a ``final_error`` code, ``message`` its text, possibly empty)."""

    kind: str
    value: Any = None
    error: str = ""
    message: str = ""

    @classmethod
    def final(cls, value: Any) -> Outcome:
        return cls("final", value=value)

    @classmethod
    def failed(cls, error: str, message: str = "") -> Outcome:
        return cls("error", error=error, message=message)


class NativeAborted(Exception):
    """Raised by the host channel when the host ended the exchange (``native_abort``, or the
    stream closed): the program stops at once."""


class HostProtocolError(Exception):
    """Raised by the host channel (or here) when the host broke the protocol during a call."""


class Reply(NamedTuple):
    """The host's answer to one call: ``ok`` with the plain ``value``, or the host's approved
    ``error`` text (only ever for a call that asked to recover)."""

    ok: bool
    value: Any = None
    error: str = ""

    @classmethod
    def succeeded(cls, value: Any) -> Reply:
        return cls(True, value=value)

    @classmethod
    def failed(cls, error: str) -> Reply:
        return cls(False, error=error)


class Host(Protocol):
    """What a running program asks of the host (``channel.HostChannel`` over the frame streams).

    ``call`` and ``invalid`` block for the host's reply; when the host ends the execute instead
    they raise :class:`NativeAborted` (or :class:`HostProtocolError`), and the program stops."""

    def call(self, name: str, args: dict[str, Any], attempt: bool) -> Reply: ...

    def invalid(self, name: str, message: str, attempt: bool) -> Reply: ...

    def batch(self, calls: list[dict[str, Any]]) -> list[Reply]: ...

    def prints(self, text: str, cut: bool) -> None: ...


_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_DECODER: Final = json.JSONDecoder()


class _Stop(Exception):
    """Internal: a hook decided the program ends (the reason is in ``_Run.failure``)."""


class _Run:
    """State of one program run; the builtins reach it through ``environment.set_hooks``."""

    def __init__(self, limits: ExecLimits, inputs: dict[str, Mapping[str, Any]], host: Host) -> None:
        self.limits = limits
        self.inputs = inputs
        self.host = host
        self.output = PrintBuffer(limits.max_print_bytes)
        self.attempting = False
        self.depth = min(limits.max_value_depth, MAX_BRIDGE_DEPTH)
        # Depth counts each argument value; the keyword map around them is one more level.
        self.args_depth = min(limits.max_value_depth + 1, MAX_BRIDGE_DEPTH)
        self.checks = 0
        self.counting = True
        self.main_running = False
        self.native_calls = 0
        # The calls of a parallel(...) being collected (None: calls go to the host one by one).
        self.batch: list[dict[str, Any]] | None = None
        self.batch_bytes = 0
        self.failure: tuple[str, str, str] | None = None  # (code, message, callee to locate)
        self.escape: BaseException | None = None

    def fail(self, error: str, message: str = "", locate: str = "") -> None:
        if self.failure is None:
            self.failure = (error, message, locate)

    # --- hooks called from Starlark -------------------------------------------------------

    def check_cancelled(self) -> bool:
        self.checks += 1
        if self.counting and self.checks * STEPS_PER_CHECK > self.limits.max_steps:
            self.fail("resource_limit", LIMIT_STEPS)
            return True
        if self.checks & (self.checks - 1) == 0:  # checks 1, 2, 4, 8, ...: protocol.max_print_frames
            try:
                self.flush_prints()  # so that a program the host kills later still shows its prints
            except (NativeAborted, HostProtocolError) as exc:
                self.escape = exc
                return True
        return False

    def flush_prints(self) -> None:
        pending = self.output.take()
        if pending is not None:
            self.host.prints(*pending)

    def main_begin(self) -> None:
        self.main_running = True

    def main_end(self) -> None:
        self.main_running = False
        self.counting = False

    def internal(self) -> None:
        self.fail("internal")

    def print_wanted(self) -> bool:
        return self.output.wanted

    def print_text(self, text: str) -> None:
        self.output.add(text)

    def attempt_begin(self) -> None:
        self.attempting = True

    def attempt_refused(self) -> None:
        self.fail("invalid_program", ATTEMPT_MESSAGE, locate="attempt")
        raise _Stop

    def parallel_begin(self, count: int) -> None:
        """Start collecting the ``count`` calls of one ``parallel(...)``: all of them count against
        ``max_native_calls`` before any is made."""
        if not self.main_running:
            self.fail("invalid_program", PARALLEL_OUTSIDE_MAIN, locate="parallel")
            raise _Stop
        if self.batch is not None:  # the builtin cannot nest: its elements are capabilities only
            self.fail("internal")
            raise _Stop
        if self.native_calls + count > self.limits.max_native_calls:
            self.fail("resource_limit", LIMIT_NATIVE_CALLS)
            raise _Stop
        self.batch, self.batch_bytes = [], 0

    def parallel_refused(self, message: str) -> None:
        self.batch = None
        self.fail("invalid_program", message, locate="parallel")
        raise _Stop

    def parallel_end(self) -> Any:
        """Send the collected calls as one batch; the list of ``attempt``-style records."""
        calls, self.batch = self.batch, None
        if calls is None:
            self.fail("internal")
            raise _Stop
        replies = self._ask(lambda: self.host.batch(calls))
        records: list[dict[str, Any]] = []
        for call, reply in zip(calls, replies, strict=True):
            if reply.ok and "invalid" not in call:
                try:
                    check_value(reply.value, self.depth, self.limits.max_value_bytes)
                except ValueLimitError:
                    self.fail("resource_limit", LIMIT_VALUE_SIZE)
                    raise _Stop from None
                except ValueTypeError:
                    self.escape = HostProtocolError("native_batch_result value is not a plain value")
                    raise _Stop from None
                records.append({"ok": True, "value": reply.value})
            elif not reply.ok and isinstance(reply.error, str) and reply.error:
                records.append({"ok": False, "error": reply.error})
            else:
                self.escape = HostProtocolError("a batch result that does not fit its call")
                raise _Stop
        try:
            # The whole list is one value the program receives: bounded like one result.
            check_value(records, self.depth + 2, self.limits.max_value_bytes)
        except ValueLimitError:
            self.fail("resource_limit", LIMIT_VALUE_SIZE)
            raise _Stop from None
        if self.depth <= JSON_RESULT_DEPTH:
            return _ENCODER.encode(records)
        return [records]

    def _collect(self, call: dict[str, Any]) -> Any:
        """One call of a ``parallel(...)``, kept for its batch; the wrapper's placeholder value."""
        assert self.batch is not None
        self.batch.append(call)
        return "null"

    def _enter(self, name: str) -> bool:
        """Count one call; whether it is made under ``attempt``."""
        attempt, self.attempting = self.attempting, False
        if not self.main_running:
            self.fail(
                "invalid_program",
                f"capability {name} called outside main(); capabilities can only be called while main runs",
                locate=name.rsplit(".", 1)[-1],
            )
            raise _Stop
        self.native_calls += 1
        if self.native_calls > self.limits.max_native_calls:
            self.fail("resource_limit", LIMIT_NATIVE_CALLS)
            raise _Stop
        return attempt

    def _ask(self, request: Callable[[], T]) -> T:
        """One round trip to the host, after the prints so far (the host ends the program by
        ending the exchange: then the program stops at once)."""
        try:
            self.flush_prints()
            return request()
        except (NativeAborted, HostProtocolError) as exc:
            self.escape = exc
            raise _Stop from None

    def _invalid(self, name: str, diagnostic: str, attempt: bool) -> Any:
        """A call the binding rejected: the host records it and decides the text."""
        reply = self._ask(lambda: self.host.invalid(name, diagnostic, attempt))
        return self._failed(reply, attempt)

    def _failed(self, reply: Reply, attempt: bool) -> Any:
        """``attempt``'s value for a recoverable failure; without ``attempt`` the host must have
        ended the program instead of answering."""
        if not attempt or reply.ok or not isinstance(reply.error, str) or not reply.error:
            self.escape = HostProtocolError("an error reply to a call that asked no recovery")
            raise _Stop
        return _ENCODER.encode({"ok": False, "error": reply.error})

    def native_positional(self, name: str) -> Any:
        attempt = self._enter(name)
        if self.batch is not None:
            return self._collect({"name": name, "invalid": positional_diagnostic(name, self.inputs[name])})
        return self._invalid(name, positional_diagnostic(name, self.inputs[name]), attempt)

    def native_rejected(self, name: str, value: Any) -> Any:
        attempt = self._enter(name)
        if isinstance(value, Overflow):
            self.fail("resource_limit", LIMIT_VALUE_SIZE)
            raise _Stop
        try:
            bind_arguments(self.inputs[name], value)
        except BindError as exc:
            if self.batch is not None:
                return self._collect({"name": name, "invalid": exc.diagnostic})
            return self._invalid(name, exc.diagnostic, attempt)
        self.fail("internal")  # a marked value always fails to bind
        raise _Stop

    def native_call(self, name: str, args_json: str) -> Any:
        attempt = self._enter(name)
        try:
            args = bind_arguments(self.inputs[name], _decode(args_json))
        except BindError as exc:
            if self.batch is not None:
                return self._collect({"name": name, "invalid": exc.diagnostic})
            return self._invalid(name, exc.diagnostic, attempt)
        except ValueLimitError:
            self.fail("resource_limit", LIMIT_VALUE_SIZE)
            raise _Stop from None
        try:
            size = check_value(args, self.args_depth, self.limits.max_value_bytes)
        except ValueLimitError:
            self.fail("resource_limit", LIMIT_VALUE_SIZE)
            raise _Stop from None
        if self.batch is not None:
            # A batch's arguments together are bounded like one call's.
            self.batch_bytes += size
            if self.batch_bytes > self.limits.max_value_bytes:
                self.fail("resource_limit", LIMIT_VALUE_SIZE)
                raise _Stop
            return self._collect({"name": name, "args": args})
        reply = self._ask(lambda: self.host.call(name, args, attempt))
        if not reply.ok:
            return self._failed(reply, attempt)
        value = reply.value
        try:
            check_value(value, self.depth, self.limits.max_value_bytes)
        except ValueLimitError:
            self.fail("resource_limit", LIMIT_VALUE_SIZE)
            raise _Stop from None
        except ValueTypeError:
            self.escape = HostProtocolError("native_result value is not a plain value")
            raise _Stop from None
        if attempt:
            value = {"ok": True, "value": value}  # one level more: still below JSON_RESULT_DEPTH + 1
        if self.depth <= JSON_RESULT_DEPTH:
            return _ENCODER.encode(value)
        return [value]


def _classify(run: _Run, exc: BaseException, source: str, helpers: Mapping[str, str]) -> Outcome:
    if run.escape is not None:
        raise run.escape
    if run.failure is not None:
        error, message, callee = run.failure
        if callee:
            location, _ = describe_error(str(exc), source, callee, helpers)
            message = f"{FILENAME}:{location or FALLBACK_LOCATION}: {message}"
        return Outcome.failed(error, bounded(message))
    if type(exc).__name__ == "PanicException":
        # The interpreter's heap panics (instead of aborting) when one of its own allocations
        # cannot be made; any other panic is a bug.
        if str(exc).startswith(_MEMORY_PANICS):
            return Outcome.failed("resource_limit", LIMIT_MEMORY)
        return Outcome.failed("internal")
    if isinstance(exc, sl.StarlarkError):
        text = str(exc)
        _, message = describe_error(text, source)
        if message.startswith(("Starlark call stack overflow", "Too many recursion levels")):
            return Outcome.failed("resource_limit", LIMIT_STEPS)
        foreign = translate(message)
        if foreign is None:
            return Outcome.failed("invalid_program", program_error(text, source, helpers))
        error, replacement = foreign
        if error == "invalid_program":
            location, _ = describe_error(text, source, helpers=helpers)
            replacement = bounded(f"{FILENAME}:{location or FALLBACK_LOCATION}: {replacement}")
        return Outcome.failed(error, replacement)
    if isinstance(exc, MemoryError):
        return Outcome.failed("resource_limit", LIMIT_MEMORY)
    if isinstance(exc, ValueError) and digit_limit_text(str(exc)):
        # main()'s value (on the error path it crosses as a value) holds an integer too long.
        return Outcome.failed("resource_limit", LIMIT_VALUE_SIZE)
    return Outcome.failed("internal")


def _decode(text: str) -> Any:
    """A value the driver encoded as JSON. Integers too long for CPython's int parsing (more than
    4300 digits, e.g. ``1 << 100000``) are too large to cross: ``ValueLimitError``."""
    try:
        return _DECODER.decode(text)
    except ValueError:
        raise ValueLimitError("integer too large to cross") from None


def _finish(result: Any, limits: ExecLimits, source: str) -> Outcome:
    if not isinstance(result, list) or not result:
        return Outcome.failed("internal")
    if result[0] == "bad_main":
        return Outcome.failed("invalid_program", main_error(source, MAIN_MESSAGE))
    try:
        value = _decode(result[1]) if result[0] == "ok" else result[1]
        check_value(value, limits.max_value_depth, limits.max_value_bytes)
    except ValueLimitError:
        return Outcome.failed("resource_limit", LIMIT_VALUE_SIZE)
    except ValueTypeError as exc:
        return Outcome.failed(
            "invalid_program", main_error(source, f"main() returned an unsupported value: {exc}")
        )
    return Outcome.final(value)


def _execute(env: Environment, run: _Run, source: str) -> Outcome:
    try:
        ast = sl.parse(FILENAME, source, env.dialect)
    except sl.StarlarkError as exc:
        return Outcome.failed("invalid_program", program_error(str(exc), source))
    if not has_valid_main(source):
        return Outcome.failed("invalid_program", main_error(source, MAIN_MESSAGE))
    shift = find_operator(source, "<<")
    if shift is not None:
        return Outcome.failed(
            "invalid_program", bounded(f"{FILENAME}:{shift[0]}:{shift[1]}: {SHIFT_MESSAGE}")
        )

    limits = run.limits
    modules: dict[str, Any] = {}
    roots: list[str] = []
    if run.inputs:
        arg_nodes = 2 * limits.max_value_bytes + 16  # generous: None record fields are dropped
        modules["natives"], roots = env.natives(list(run.inputs), run.args_depth, arg_nodes)
    loader = env.loader(modules)
    module = env.program_module(loader, roots)
    driver = env.driver(run.depth, limits.max_value_bytes)
    options = sl.EvalOptions(
        check_cancelled=run.check_cancelled,
        max_callstack_size=min(limits.max_callstack, MAX_CALLSTACK) + CALLSTACK_SLACK,
    )
    try:
        sl.eval_with(options, module, ast, env.globals)
        modules["user"] = module.freeze()
        result = sl.eval_with(options, sl.Module(), driver, env.globals, env.loader(modules)).value
    except BaseException as exc:  # PanicException derives from BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return _classify(run, exc, source, env.helper_sources)
    if run.escape is not None:
        raise run.escape
    return _finish(result, limits, source)


class _Executor:
    """One long-lived thread with a large stack that runs every evaluation of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]] = (
            queue.SimpleQueue()
        )

    def _serve(self) -> None:
        while True:
            fn, box, done = self._jobs.get()
            try:
                box.append((True, fn()))
            except BaseException as exc:
                box.append((False, exc))
            finally:
                done.set()

    def _start(self) -> threading.Thread | None:
        with self._lock:
            if self._thread is not None:
                return self._thread
            for size in _STACK_FALLBACKS:
                try:
                    previous = threading.stack_size(size)
                except (ValueError, RuntimeError):
                    continue
                try:
                    thread = threading.Thread(target=self._serve, name="codemode-starlark", daemon=True)
                    thread.start()
                except RuntimeError:
                    continue
                finally:
                    threading.stack_size(previous)
                self._thread = thread
                return thread
            return None  # pragma: no cover - no large stack could be mapped at all

    def run(self, fn: Callable[[], T]) -> T:
        thread = self._start()
        if thread is None or threading.current_thread() is thread:
            return fn()
        box: list[Any] = []
        done = threading.Event()
        self._jobs.put((fn, box, done))
        done.wait()
        ok, result = box[0]
        if not ok:
            raise result
        return cast(T, result)


_EXECUTOR = _Executor()
_RUN_LOCK = threading.RLock()


def _after_fork_in_child() -> None:
    """A child forked from a warm process (``codemode_worker.template`` or the reuse mode's
    ``codemode_worker.supervisor``) has only the forking
    thread: the interpreter thread stayed in the parent, so the next run starts one of its own."""
    global _EXECUTOR, _RUN_LOCK
    _EXECUTOR = _Executor()
    _RUN_LOCK = threading.RLock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def on_interpreter_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` on the interpreter thread (the worker entry runs its whole loop there, so
    programs run without a thread hand-off)."""
    return _EXECUTOR.run(fn)


def run_program(
    source: str,
    manifest: Sequence[Mapping[str, Any]],
    limits: ExecLimits,
    host: Host,
) -> Outcome:
    """Run ``source`` and return its outcome.

    ``manifest`` is the exec frame's list of ``{name, input}`` (validated again here; an invalid
    one raises ``ValueError``). ``host`` performs each round trip (:class:`Host`); when it raises
    ``NativeAborted`` or ``HostProtocolError`` the program stops at once and that exception
    propagates out of ``run_program``. The prints not yet sent go to ``host.prints`` before the
    outcome is returned.
    """
    try:
        validate_manifest(list(manifest))
    except ProtocolError as exc:
        raise ValueError(f"invalid manifest: {exc}") from None
    inputs = {str(entry["name"]): entry["input"] for entry in manifest}
    run = _Run(limits, inputs, host)

    def body() -> Outcome:
        set_hooks(run)
        try:
            outcome = _execute(environment(), run, source)
            run.flush_prints()
            return outcome
        except (NativeAborted, HostProtocolError):
            raise
        except BaseException as exc:  # trusted set-up failed, or a panic outside the program
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            return Outcome.failed("internal")
        finally:
            set_hooks(None)

    with _RUN_LOCK:
        return _EXECUTOR.run(body)


_WARM_SOURCE: Final = """
def helper(n):
    return [i * 2 for i in range(n)]

def main():
    out = warm.ping(text = "x", items = [1, 2.5, None], opts = {"a": True})
    tried = attempt(warm.ping, text = 1, items = [])
    both = parallel([(warm.ping, {"text": "y", "items": []}), (warm.ping, {"text": 2, "items": []})])
    total = sum(helper(10)) + math.floor(math.sqrt(16.0)) + len(json.encode({"k": [1, 2]}))
    print("warm", total, tried["ok"])
    return {"out": out, "total": total, "both": both, "decoded": json.decode('{"a": [1, 2.0]}'),
            "indented": json.indent('{"a":[1]}'), "t": (1, "two")}
"""

_WARM_MANIFEST: Final = [
    {
        "name": "warm.ping",
        "input": {
            "t": "record",
            "fields": [
                {"name": "text", "shape": {"t": "str"}},
                {"name": "items", "shape": {"t": "list", "of": {"t": "opt", "of": {"t": "float"}}}},
                {"name": "opts", "shape": {"t": "opt", "of": {"t": "dict", "of": {"t": "bool"}}}},
            ],
        },
    }
]


class _WarmHost:
    """Answers the warm-up program's calls without any frames."""

    def call(self, name: str, args: dict[str, Any], attempt: bool) -> Reply:
        return Reply.succeeded({"ok": True, "args": args})

    def invalid(self, name: str, message: str, attempt: bool) -> Reply:
        return Reply.failed("invalid capability arguments")

    def batch(self, calls: list[dict[str, Any]]) -> list[Reply]:
        return [self.call(c["name"], c["args"], True) if "args" in c else Reply.failed("x") for c in calls]

    def prints(self, text: str, cut: bool) -> None:
        return None


def warm_up() -> None:
    """Build the helper modules and run a throwaway program (with fake native calls, an attempt,
    a print and a throwaway parse error) on the interpreter thread, so that the first real
    program does not pay the interpreter's first-use costs (~10 ms)."""
    limits = ExecLimits(
        max_steps=1_000_000,
        max_value_depth=32,
        max_value_bytes=1 << 20,
        max_native_calls=10,
        max_callstack=200,
        max_print_bytes=1024,
    )
    host = _WarmHost()
    run_program(_WARM_SOURCE, _WARM_MANIFEST, limits, host)
    run_program("def main(:\n", [], limits, host)
