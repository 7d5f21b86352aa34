"""The Starlark side of the language surface: frozen helper modules and how a program's module
is assembled from them.

* ``env`` (file ``<builtins>``, built once per process): ``print``, ``sum``, ``attempt``,
  ``parallel``, the
  ``json`` and ``math`` namespaces, the value sanitizer, the capability wrapper and the ``main``
  driver.
* ``natives`` (file ``<capabilities>``, built per program): one wrapper per capability, nested
  in ``struct``\\ s by dotted name.
* the program's module gets exactly ``print sum attempt parallel json math`` and the capability roots through
  ``load`` statements of a trusted prelude; helper names (``struct``, ``sanitize``, the Python
  hooks) live only in the frozen helper modules and are unreachable by name.

Crossing the Starlark/Python bridge of starlark-pyo3 is expensive per primitive value (several
microseconds each) and lossy (non-finite floats become ``None``), so values cross as JSON text:
the sanitizer copies a value into plain data (lists, str-keyed dicts, finite floats, ...),
replacing anything else with opaque *markers* (``values.Unsupported`` & co.), and clean copies
are ``json.encode``\\ d by starlark-rust and decoded by Python. Marked copies cross as values
(only on the error path) so that binding can name the offending path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

# NamedTuple, not dataclasses: importing dataclasses (and inspect, ast, dis with it) costs about
# 13 ms of CPU at every start of a single-use worker (a container or pod per execute).
from typing import Any, Final, NamedTuple, Protocol

import starlark as sl

from .pybuiltins import (
    MATH_CONSTANTS,
    MATH_FUNCTIONS,
    CallError,
    json_check,
    json_encode_marked,
    json_fail,
    json_indent,
)
from .values import NonFiniteFloat, NonStringKeys, Overflow, Unsupported

__all__ = [
    "JSON_RESULT_DEPTH",
    "MAX_BRIDGE_DEPTH",
    "Environment",
    "Hooks",
    "environment",
    "set_hooks",
]

MAX_BRIDGE_DEPTH: Final = 500
"""Deepest value copied across the bridge (starlark-pyo3 itself refuses more than 1000)."""
JSON_RESULT_DEPTH: Final = 100
"""Native results up to this depth cross as JSON text (starlark-rust decodes at most 128)."""


class Hooks(Protocol):
    """What the builtins need from the running program (see ``interpreter._Run``)."""

    def main_begin(self) -> None: ...

    def main_end(self) -> None: ...

    def native_positional(self, name: str) -> None: ...

    def native_rejected(self, name: str, value: Any) -> None: ...

    def native_call(self, name: str, args_json: str) -> Any: ...

    def attempt_begin(self) -> None: ...

    def attempt_refused(self) -> None: ...

    def parallel_begin(self, count: int) -> None: ...

    def parallel_refused(self, message: str) -> None: ...

    def parallel_end(self) -> Any: ...

    def print_wanted(self) -> bool: ...

    def print_text(self, text: str) -> None: ...

    def internal(self) -> None: ...


_HOOKS: Hooks | None = None


def set_hooks(hooks: Hooks | None) -> None:
    """Route the builtins' hooks to the program that is about to run (``None`` when done)."""
    global _HOOKS
    _HOOKS = hooks


def _hooks() -> Hooks:
    if _HOOKS is None:
        raise CallError("no program is running")
    return _HOOKS


_DONE: Final = sl.OpaquePythonObject(None)  # cheapest value to hand back across the bridge


def _main_begin() -> Any:
    _hooks().main_begin()
    return _DONE


def _main_end() -> Any:
    _hooks().main_end()
    return _DONE


def _native_positional(token: Any) -> Any:
    return _hooks().native_positional(str(token))


def _native_rejected(token: Any, value: Any) -> Any:
    return _hooks().native_rejected(str(token), value)


def _native_call(token: Any, args_json: Any) -> Any:
    return _hooks().native_call(str(token), str(args_json))


def _attempt_begin() -> Any:
    _hooks().attempt_begin()
    return _DONE


def _attempt_refused() -> Any:
    _hooks().attempt_refused()
    raise CallError("attempt() takes a capability first")


def _parallel_begin(count: Any) -> Any:
    if type(count) is not int:
        raise CallError("parallel_begin takes an int")
    _hooks().parallel_begin(count)
    return _DONE


def _parallel_refused(message: Any) -> Any:
    _hooks().parallel_refused(str(message))
    raise CallError("parallel() refused its argument")


def _parallel_end() -> Any:
    return _hooks().parallel_end()


def _print_wanted() -> bool:
    return _hooks().print_wanted()


def _print_text(text: Any) -> Any:
    _hooks().print_text(str(text))
    return _DONE


def _mark_float(text: Any) -> Any:
    return sl.OpaquePythonObject(NonFiniteFloat(str(text)))


def _mark_type(starlark_type: Any) -> Any:
    name = str(starlark_type)
    return sl.OpaquePythonObject(Unsupported("function" if name == "python_callable_value" else name))


def _mark_keys() -> Any:
    return sl.OpaquePythonObject(NonStringKeys())


def _overflow(reason: Any) -> Any:
    return sl.OpaquePythonObject(Overflow(str(reason)))


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Clean ``CallError``\\ s pass through; any other exception is an internal failure."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CallError:
            raise
        except Exception as exc:
            if _HOOKS is not None:
                _HOOKS.internal()
            raise CallError("internal error") from exc

    return call


_ENV_SOURCE: Final = r"""
_FOREVER = range(2147483647)
_MAXF = 1.7976931348623157e308
_UNSET = struct()
_PLAIN = {"string": True, "int": True, "bool": True, "NoneType": True}

def print(*args, sep = " ", end = "\n", **kwargs):
    # Like Python's print: other keywords (file, flush) are accepted and ignored.
    if print_wanted():
        if sep == None:
            sep = " "
        if end == None:
            end = "\n"
        print_text(str(sep).join([str(a) for a in args]) + str(end))

def sum(iterable, start = 0):
    total = start
    for x in iterable:
        total += x
    return total

def _mark(x, t):
    if t == "float":
        return mark_float(repr(x))
    return mark_type(t)

def _plain_keys(d):
    for k in d:
        if type(k) != "string":
            return False
    return True

def sanitize(v, max_depth, max_nodes):
    # [True, plain copy of v] or [False, copy with markers / an overflow marker].
    # NaN compares equal to itself and above every float in Starlark, hence the range test.
    t = type(v)
    if t == "dict":
        if not _plain_keys(v):
            return [False, mark_keys()]
        root = {}
    elif t == "list" or t == "tuple":
        root = []
    elif t in _PLAIN or (t == "float" and v <= _MAXF and v >= -_MAXF):
        return [True, v]
    else:
        return [False, _mark(v, t)]
    clean = True
    stack = [(v, t, root, 1)]
    nodes = 1
    for _ in _FOREVER:
        if not stack:
            return [clean, root]
        src, st, dst, depth = stack.pop()
        if len(src) == 0:
            continue
        if depth >= max_depth:
            return [False, overflow("depth")]
        nodes += len(src)
        if nodes > max_nodes:
            return [False, overflow("size")]
        if st == "dict":
            for k, x in src.items():
                xt = type(x)
                if xt in _PLAIN or (xt == "float" and x <= _MAXF and x >= -_MAXF):
                    dst[k] = x
                elif xt == "list" or xt == "tuple":
                    c = []
                    dst[k] = c
                    stack.append((x, xt, c, depth + 1))
                elif xt == "dict" and _plain_keys(x):
                    c = {}
                    dst[k] = c
                    stack.append((x, xt, c, depth + 1))
                elif xt == "dict":
                    dst[k] = mark_keys()
                    clean = False
                else:
                    dst[k] = _mark(x, xt)
                    clean = False
        else:
            for x in src:
                xt = type(x)
                if xt in _PLAIN or (xt == "float" and x <= _MAXF and x >= -_MAXF):
                    dst.append(x)
                elif xt == "list" or xt == "tuple":
                    c = []
                    dst.append(c)
                    stack.append((x, xt, c, depth + 1))
                elif xt == "dict" and _plain_keys(x):
                    c = {}
                    dst.append(c)
                    stack.append((x, xt, c, depth + 1))
                elif xt == "dict":
                    dst.append(mark_keys())
                    clean = False
                else:
                    dst.append(_mark(x, xt))
                    clean = False
    return [False, overflow("size")]

def encode(x):
    r = sanitize(x, MAX_BRIDGE_DEPTH, 2147483647)
    if r[0]:
        return json.encode(r[1])
    return json_encode_marked(r[1])

def decode(x, default = _UNSET):
    if type(x) == "string":
        reason = json_check(x)
    else:  # checked here: a value that is not a string may not even cross to Python
        reason = "json.decode: got %s, want str" % type(x)
    if reason:
        if default != _UNSET:
            return default
        json_fail(reason)
    return json.decode(x)

def run_main(main, max_depth, max_nodes):
    if type(main) != "function" or repr(main) != "<codemode>.main":
        return ["bad_main"]
    main_begin()
    value = main()
    main_end()
    r = sanitize(value, max_depth, max_nodes)
    if r[0]:
        return ["ok", json.encode(r[1])]
    return ["marked", r[1]]

def make_native(token, max_depth, max_nodes):
    # attempt() recognizes a capability by this function's repr, "<builtins>.capability".
    def capability(*args, **kwargs):
        if args:
            result = native_positional(token)
        else:
            r = sanitize(kwargs, max_depth, max_nodes)
            if r[0]:
                result = native_call(token, json.encode(r[1]))
            else:
                result = native_rejected(token, r[1])
        if type(result) == "string":
            return json.decode(result)
        return result[0]
    return capability

def attempt(*args, **kwargs):
    # attempt(capability, **arguments): the call's recoverable failure as a value.
    if not args or type(args[0]) != "function" or repr(args[0]) != "<builtins>.capability":
        return attempt_refused()
    attempt_begin()
    return args[0](*args[1:], **kwargs)

_PARALLEL_EXAMPLE = 'parallel([(records.get, {"id": 1}), (records.get, {"id": 2})])'
_PARALLEL_PAIRS = "parallel() takes one list of (capability, arguments) pairs"
_PARALLEL_PAIR = 'parallel() calls[%d] must be a (capability, arguments) pair, e.g. (records.get, {"id": 1})'
_PARALLEL_CAPABILITY = (
    "parallel() calls[%d] must start with a capability itself " +
    "(records.get, not records.get(...), attempt or parallel)"
)
_PARALLEL_ARGUMENTS = 'parallel() calls[%d] arguments must be a dict with string keys, e.g. {"id": 1}'

def parallel(*args, **kwargs):
    # parallel([(capability, {arguments}), ...]): the calls made at once, each outcome as attempt's.
    if len(args) != 1 or kwargs:
        return parallel_refused(_PARALLEL_PAIRS + ", e.g. " + _PARALLEL_EXAMPLE)
    calls = args[0]
    if type(calls) != "list":
        return parallel_refused(_PARALLEL_PAIRS + ", got %s, e.g. %s" % (type(calls), _PARALLEL_EXAMPLE))
    if not calls:
        return parallel_refused("parallel() got an empty list: give it at least one " +
                                "(capability, arguments) pair")
    for i, c in enumerate(calls):
        if (type(c) != "tuple" and type(c) != "list") or len(c) != 2:
            return parallel_refused(_PARALLEL_PAIR % i)
        if type(c[0]) != "function" or repr(c[0]) != "<builtins>.capability":
            return parallel_refused(_PARALLEL_CAPABILITY % i)
        if type(c[1]) != "dict" or not _plain_keys(c[1]):
            return parallel_refused(_PARALLEL_ARGUMENTS % i)
    parallel_begin(len(calls))
    for c in calls:
        c[0](**c[1])
    r = parallel_end()
    if type(r) == "string":
        return json.decode(r)
    return r[0]

json_ns = struct(encode = encode, decode = decode, indent = json_indent)
"""


class Environment(NamedTuple):
    """Everything built once per process."""

    dialect: Any
    load_dialect: Any
    globals: Any
    helper_globals: Any
    env: Any  # FrozenModule ``env``
    helper_sources: Mapping[str, str]  # file name -> source, for locating errors

    def loader(self, modules: Mapping[str, Any]) -> Any:
        """A FileLoader serving ``env`` and the given frozen modules."""
        table = {"env": self.env, **modules}
        return sl.FileLoader(lambda name: table[name])

    def natives(self, names: Sequence[str], depth: int, nodes: int) -> tuple[Any, list[str]]:
        """Frozen ``natives`` module for capability ``names`` and the roots it defines as
        ``ns_<root>``. Arguments are copied with at most ``depth`` levels and ``nodes`` items."""
        tree: dict[str, Any] = {}
        tokens: list[Any] = []
        for index, name in enumerate(names):
            node = tree
            segments = name.split(".")
            for segment in segments[:-1]:
                node = node.setdefault(segment, {})
            node[segments[-1]] = index
            tokens.append(sl.OpaquePythonObject(name))

        def expr(node: Mapping[str, Any]) -> str:
            parts = []
            for key, child in node.items():
                value = f"_mk(_t[{child}], _d, _n)" if isinstance(child, int) else expr(child)
                parts.append(f"{key} = {value}")
            return "struct(" + ", ".join(parts) + ")"

        lines = ['load("env", _mk = "make_native")']
        lines.extend(f"ns_{root} = {expr(node)}" for root, node in tree.items())
        module = sl.Module()
        module["_t"] = tokens
        module["_d"] = depth
        module["_n"] = nodes
        ast = sl.parse("<capabilities>", "\n".join(lines) + "\n", self.load_dialect)
        sl.eval(module, ast, self.helper_globals, self.loader({}))
        return module.freeze(), list(tree)

    def program_module(self, loader: Any, roots: Sequence[str]) -> Any:
        """A fresh module holding exactly the surface names (before the program runs)."""
        prelude = ['load("env", "print", "sum", "attempt", "parallel", json = "json_ns", math = "math_ns")']
        if roots:
            prelude.append('load("natives", ' + ", ".join(f'{r} = "ns_{r}"' for r in roots) + ")")
        module = sl.Module()
        ast = sl.parse("<prelude>", "\n".join(prelude) + "\n", self.load_dialect)
        sl.eval(module, ast, self.globals, loader)
        return module

    def driver(self, max_depth: int, max_nodes: int) -> Any:
        """AST that loads ``main`` from the frozen program module ``user`` and runs it."""
        text = f'load("user", "main")\nload("env", "run_main")\nrun_main(main, {max_depth}, {max_nodes})\n'
        return sl.parse("<driver>", text, self.load_dialect)


_ENVIRONMENT: Environment | None = None
_LOCK = threading.Lock()


def environment() -> Environment:
    """The process-wide environment (built on first use)."""
    global _ENVIRONMENT
    with _LOCK:
        if _ENVIRONMENT is None:
            _ENVIRONMENT = _build()
        return _ENVIRONMENT


def _build() -> Environment:
    dialect = sl.Dialect.standard()
    dialect.enable_load = False
    load_dialect = sl.Dialect.standard()
    load_dialect.enable_load = True
    helper_globals = sl.Globals.extended_by([sl.LibraryExtension.StructType, sl.LibraryExtension.Json])
    module = sl.Module()
    for name, fn in _python_callables().items():
        module.add_callable(name, _guarded(fn))
    module["MAX_BRIDGE_DEPTH"] = MAX_BRIDGE_DEPTH
    source = _builtins_source()
    sl.eval(module, sl.parse("<builtins>", source, dialect), helper_globals)
    return Environment(
        dialect,
        load_dialect,
        sl.Globals.standard(),
        helper_globals,
        module.freeze(),
        {"<builtins>": source},
    )


def _builtins_source() -> str:
    """The ``<builtins>`` module's source: ``_ENV_SOURCE`` and the ``math`` namespace."""
    fields = [f"{name} = math_{name}" for name in MATH_FUNCTIONS]
    fields.extend(f"{name} = {value!r}" for name, value in MATH_CONSTANTS.items())
    return _ENV_SOURCE + "math_ns = struct(" + ", ".join(sorted(fields)) + ")\n"


def _python_callables() -> dict[str, Callable[..., Any]]:
    """The Python functions the ``<builtins>`` source calls, by name."""
    return {
        "mark_float": _mark_float,
        "mark_type": _mark_type,
        "mark_keys": _mark_keys,
        "overflow": _overflow,
        "json_check": json_check,
        "json_fail": json_fail,
        "json_encode_marked": json_encode_marked,
        "json_indent": json_indent,
        "main_begin": _main_begin,
        "main_end": _main_end,
        "native_positional": _native_positional,
        "native_rejected": _native_rejected,
        "native_call": _native_call,
        "attempt_begin": _attempt_begin,
        "attempt_refused": _attempt_refused,
        "parallel_begin": _parallel_begin,
        "parallel_refused": _parallel_refused,
        "parallel_end": _parallel_end,
        "print_wanted": _print_wanted,
        "print_text": _print_text,
        **{f"math_{name}": fn for name, fn in MATH_FUNCTIONS.items()},
    }
