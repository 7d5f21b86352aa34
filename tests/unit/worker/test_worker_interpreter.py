"""The Starlark interpreter: language surface, main rules, natives, limits and error texts."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from codemode_worker import environment, interpreter
from codemode_worker.interpreter import (
    ExecLimits,
    HostProtocolError,
    NativeAborted,
    Outcome,
    Reply,
    run_program,
    warm_up,
)

LIMITS = ExecLimits(
    max_steps=1_000_000,
    max_value_depth=32,
    max_value_bytes=1 << 20,
    max_native_calls=100,
    max_callstack=200,
)

STR = {"t": "str"}
INT = {"t": "int"}
FLOAT = {"t": "float"}


def opt(of: dict[str, Any]) -> dict[str, Any]:
    return {"t": "opt", "of": of}


def rec(**fields: dict[str, Any]) -> dict[str, Any]:
    return {"t": "record", "fields": [{"name": k, "shape": v} for k, v in fields.items()]}


MANIFEST = [
    {"name": "records.lookup", "input": rec(key=STR, limit=opt(INT))},
    {"name": "records.status", "input": rec()},
    {"name": "records.entry.delete", "input": rec(key=STR)},
    {
        "name": "metrics.push",
        "input": rec(values={"t": "list", "of": FLOAT}, tags=opt({"t": "dict", "of": STR})),
    },
    {"name": "data.echo", "input": rec(value=opt({"t": "list", "of": opt(INT)}))},
]


class Host:
    """A fake host: records calls, answers from ``results`` (or echoes the arguments). Like the
    real host it ends the program on a call its binding rejected, unless the call asked to
    recover (``attempt``); ``fail`` names capabilities whose calls fail (recoverably)."""

    def __init__(self, results: list[Any] | None = None, fail: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.attempts: list[bool] = []
        self.invalid_calls: list[tuple[str, str, bool]] = []
        self.printed: list[tuple[str, bool]] = []
        self.results = results
        self.fail = fail

    def call(self, name: str, args: dict[str, Any], attempt: bool) -> Reply:
        self.calls.append((name, args))
        self.attempts.append(attempt)
        if name in self.fail:
            if not attempt:
                raise NativeAborted("the call failed")
            return Reply.failed("permission denied")
        if self.results is not None:
            return Reply.succeeded(self.results.pop(0))
        return Reply.succeeded({"name": name, "args": args})

    def invalid(self, name: str, message: str, attempt: bool) -> Reply:
        self.invalid_calls.append((name, message, attempt))
        if not attempt:
            raise NativeAborted("invalid capability arguments")
        return Reply.failed("invalid capability arguments: " + message)

    def prints(self, text: str, cut: bool) -> None:
        self.printed.append((text, cut))

    def batch(self, calls: list[dict[str, Any]]) -> list[Reply]:
        raise AssertionError("these programs make no parallel calls")


def run(source: str, limits: ExecLimits = LIMITS, host: Host | None = None) -> Outcome:
    return run_program(source, MANIFEST, limits, host or Host())


def value_of(source: str, **kw: Any) -> Any:
    outcome = run(source, **kw)
    assert outcome.kind == "final", outcome
    return outcome.value


def error_of(source: str, **kw: Any) -> tuple[str, str]:
    outcome = run(source, **kw)
    assert outcome.kind == "error", outcome
    return outcome.error, outcome.message


POSITIONAL = "positional arguments are not accepted; "
DEEP_100K = "def main():\n    x = []\n    for i in range(100000):\n        x = [x]\n"


def main_returning(expr: str) -> str:
    return f"def main():\n    return {expr}\n"


def test_warm_up_is_repeatable() -> None:
    warm_up()
    warm_up()
    assert value_of(main_returning("1")) == 1


# --------------------------------------------------------------------------- language surface

SURFACE = [
    "False",
    "None",
    "True",
    "abs",
    "all",
    "any",
    "bool",
    "chr",
    "dict",
    "dir",
    "enumerate",
    "fail",
    "float",
    "getattr",
    "hasattr",
    "hash",
    "int",
    "json",
    "len",
    "list",
    "math",
    "max",
    "min",
    "ord",
    "print",
    "range",
    "repr",
    "reversed",
    "sorted",
    "str",
    "sum",
    "tuple",
    "type",
    "zip",
]


@pytest.mark.parametrize("name", SURFACE)
def test_surface_name_is_available(name: str) -> None:
    assert value_of(f"x = {name}\ndef main():\n    return 1\n") == 1


@pytest.mark.parametrize(
    "name",
    [
        "set",
        "struct",
        "map",
        "filter",
        "partial",
        "isinstance",
        "debug",
        "call_stack",
        "record",
        "enum",
        "breakpoint",
        "pprint",
        "sanitize",
        "run_main",
        "make_native",
        "native_call",
        "json_ns",
        "math_ns",
        "ns_records",
        "main_begin",
        "_t",
        "math_sqrt",
        "MAX_BRIDGE_DEPTH",
        "open",
        "eval",
        "exec",
    ],
)
def test_other_names_are_unavailable(name: str) -> None:
    error, message = error_of(main_returning(name))
    assert error == "invalid_program"
    # A Python builtin the dialect lacks gets the execute tool's advice (hints._MISSING) instead of
    # Starlark's nearest spelling; every other name is simply not found.
    if name in {"set", "map", "filter", "isinstance", "open", "eval", "exec"}:
        assert message.startswith(f"<codemode>:2:12: `{name}` is not available: ")
        assert "did you mean" not in message
    else:
        assert message.startswith(f"<codemode>:2:12: Variable `{name}` not found")


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ('load("x.star", "y")\ndef main():\n    return 1\n', "load"),
        ("def main():\n    x = 0\n    while x < 3:\n        x += 1\n    return x\n", "while"),
        ('def main():\n    x = 1\n    return f"{x}"\n', "f-strings"),
        ("import os\ndef main():\n    return 1\n", ""),
        ("for i in range(3):\n    pass\ndef main():\n    return 1\n", "`for` cannot be used outside `def`"),
        ("if True:\n    pass\ndef main():\n    return 1\n", "`if` cannot be used outside `def`"),
        ("def f(*, a):\n    return a\ndef main():\n    return 1\n", "keyword-only"),
        ("def f(a, /):\n    return a\ndef main():\n    return 1\n", "positional-only"),
        ("def f(a: int):\n    return a\ndef main():\n    return 1\n", "type annotations"),
        ("def main():\n    return 2 ** 3\n", "Parse error"),
    ],
)
def test_unavailable_syntax(source: str, fragment: str) -> None:
    error, message = error_of(source)
    assert error == "invalid_program"
    assert message.startswith("<codemode>:")
    assert fragment in message


def test_load_is_unavailable_even_for_internal_modules() -> None:
    error, message = error_of('load("env", "sanitize")\ndef main():\n    return 1\n')
    assert error == "invalid_program"
    assert message.startswith("<codemode>:1:1:")


def test_print_is_dropped(capfd: pytest.CaptureFixture[str]) -> None:
    source = 'def main():\n    print("hello", 1, [2], sep="-")\n    print()\n    return "done"\n'
    host = Host()
    assert value_of(source, host=host) == "done"
    out, err = capfd.readouterr()
    assert "hello" not in out + err
    assert host.printed == []  # without max_print_bytes nothing is sent either


def test_sum() -> None:
    assert value_of(main_returning("sum([1, 2, 3])")) == 6
    assert value_of(main_returning("sum(range(101))")) == 5050
    assert value_of(main_returning("sum([0.5, 1], 10)")) == 11.5
    assert value_of(main_returning("sum([], start=7)")) == 7
    error, message = error_of(main_returning("sum([1, 'a'])"))
    assert error == "invalid_program"
    assert message.startswith("<codemode>:2:12: ")


def test_math_functions() -> None:
    names = [
        "acos",
        "acosh",
        "asin",
        "asinh",
        "atan",
        "atan2",
        "atanh",
        "ceil",
        "copysign",
        "cos",
        "cosh",
        "degrees",
        "e",
        "exp",
        "fabs",
        "floor",
        "gamma",
        "hypot",
        "log",
        "mod",
        "pi",
        "pow",
        "radians",
        "remainder",
        "round",
        "sin",
        "sinh",
        "sqrt",
        "tan",
        "tanh",
    ]
    assert value_of(main_returning("dir(math)")) == sorted(names)
    got = value_of(
        main_returning(
            "[math.sqrt(16), math.floor(2.7), math.ceil(2.1), math.floor(-2.5), math.round(2.5), "
            "math.round(-2.5), math.round(2.4), math.log(8, 2), math.log(math.e), math.pow(2, 10), "
            "math.mod(7, 3), math.remainder(7, 4), math.hypot(3, 4), math.atan2(1, 1), "
            "math.copysign(2, -1), math.fabs(-3), math.degrees(math.pi), math.radians(180), "
            "math.exp(0), math.gamma(5), math.sin(0), math.cos(0), math.tan(0), math.asin(1), "
            "math.acos(1), math.atan(0), math.sinh(0), math.cosh(0), math.tanh(0), math.asinh(0), "
            "math.acosh(1), math.atanh(0), math.e, math.pi, type(math.floor(1.5)), math.sqrt(x = 4)]"
        )
    )
    expected = [
        4.0, 2, 3, -3, 3.0, -3.0, 2.0, 3.0, 1.0, 1024.0, 1.0, -1.0, 5.0, math.pi / 4, -2.0, 3.0, 180.0,
        math.pi, 1.0, 24.0, 0.0, 1.0, 0.0, math.pi / 2, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, math.e,
        math.pi, "int", 2.0,
    ]  # fmt: skip
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("math.sqrt(-1)", "math.sqrt: math domain error"),
        ("math.log(0)", "math.log: math domain error"),
        ("math.exp(1000)", "math.exp: result out of range"),
        ("math.sqrt('a')", "math.sqrt: want a finite float or int, got str"),
        ("math.sqrt(True)", "got bool"),
        ("math.sqrt(float('inf'))", "want a finite float or int"),
        ("math.floor(float('nan'))", "want a finite float or int"),
        ("math.pow(2)", "math.pow: missing argument 'y'"),
        ("math.sqrt(1, 2)", "math.sqrt: got 2 arguments"),
        ("math.sqrt(y = 1)", "unexpected keyword argument 'y'"),
    ],
)
def test_math_errors(expr: str, fragment: str) -> None:
    error, message = error_of(main_returning(expr))
    assert error == "invalid_program"
    assert message.startswith("<codemode>:2:12: ")
    assert fragment in message


def test_json_functions() -> None:
    assert value_of(main_returning("dir(json)")) == ["decode", "encode", "indent"]
    assert value_of(main_returning("json.encode({'a': [1, 2.0, None, True, 'é'], 'b': (1,)})")) == (
        '{"a":[1,2.0,null,true,"é"],"b":[1]}'
    )
    assert value_of(main_returning('json.decode(\'{"a": [1, -2, 2.5, null, true, "x"]}\')')) == {
        "a": [1, -2, 2.5, None, True, "x"]
    }
    assert value_of(main_returning("json.decode('[1', default = 'fallback')")) == "fallback"
    assert value_of(main_returning("json.decode('1e400', None)")) is None
    indented = value_of(main_returning('json.indent(\'{"a":[1,{}],"b":[]}\')'))
    assert indented == '{\n\t"a": [\n\t\t1,\n\t\t{}\n\t],\n\t"b": []\n}'
    prefixed = value_of(main_returning("json.indent('[1,2]', prefix='> ', indent='  ')"))
    assert prefixed == "[\n>   1,\n>   2\n> ]"
    assert value_of(main_returning("json.decode(json.encode([1, [2, {'k': 'v'}]]))")) == [1, [2, {"k": "v"}]]


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("json.decode('1e400')", "json.decode: number out of range"),
        ("json.decode('NaN')", "json.decode: invalid number NaN"),
        ("json.decode('[1')", "json.decode: "),
        ("json.decode(1)", "json.decode: got int, want str"),
        ("json.decode('1' * 30)", "json.decode: integer out of range"),
        ("json.decode('[' * 200 + ']' * 200)", "json.decode: nesting too deep"),
        ("json.encode(float('nan'))", "json.encode: cannot encode non-finite float nan"),
        ("json.encode([float('inf')])", "json.encode: cannot encode non-finite float +inf"),
        ("json.encode({1: 2})", "json.encode: dict keys must be strings"),
        ("json.encode(len)", "json.encode: cannot encode function"),
        ("json.encode(math)", "json.encode: cannot encode struct"),
        ("json.encode(range(3))", "json.encode: cannot encode range"),
        ("json.indent('nope')", "json.indent: invalid JSON"),
        ("json.indent(1)", "json.indent: str must be str, got int"),
    ],
)
def test_json_errors(expr: str, fragment: str) -> None:
    error, message = error_of(main_returning(expr))
    assert error == "invalid_program"
    assert message.startswith("<codemode>:2:")
    assert fragment in message


def test_json_encode_of_deep_value_is_an_error_not_a_crash() -> None:
    source = DEEP_100K + "    return json.encode(x)\n"
    error, message = error_of(source)
    assert error == "invalid_program"
    assert "json.encode: value nested too deeply" in message


# -------------------------------------------------------------------------------------- main


@pytest.mark.parametrize(
    "source",
    [
        "x = 1\n",
        "def main(x):\n    return x\n",
        "def main(x = 1):\n    return x\n",
        "def main(*args):\n    return 1\n",
        "def main(**kwargs):\n    return 1\n",
        "main = lambda: 1\n",
        "def f():\n    return 1\nmain = f\n",
        "def main():\n    return 1\nmain = len\n",
        "def main():\n    return 1\ndef main():\n    return 2\n",
        "def f():\n    def main():\n        return 1\n    return main\nmain = f()\n",
        "def main():\n    return 1\nmain = 1\n",
        's = """\ndef main():\n"""\n',
        "# def main():\ndef mainly():\n    return 1\n",
    ],
)
def test_bad_main(source: str) -> None:
    error, message = error_of(source)
    assert error == "invalid_program"
    # Every program message carries a position: the first `def main` or 1:1.
    assert re.fullmatch(
        r"<codemode>:[0-9]+:[0-9]+: program must define `def main\(\):` \(no parameters\) at top level",
        message,
    )


def test_main_may_be_aliased_and_spaced() -> None:
    assert value_of("def main( ):\n    return 1\nalias = main\n") == 1
    assert value_of('def main(\n    # no params\n):\n    return "ok"\n') == "ok"
    assert value_of("main_thing = 2\ndef main():\n    return main_thing\n") == 2


def test_top_level_runs_before_main_and_globals_are_frozen() -> None:
    assert value_of("X = [1, 2]\nY = sum(X)\ndef main():\n    return [X, Y]\n") == [[1, 2], 3]
    error, message = error_of("X = []\ndef main():\n    X.append(1)\n    return X\n")
    assert error == "invalid_program"
    assert message.startswith("<codemode>:3:5: ")


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("None", None),
        ("True", True),
        ("-7", -7),
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)),
        ("1.5", 1.5),
        ("-0.0", -0.0),
        ("'é😀'", "é😀"),
        ("(1, (2, 3))", [1, [2, 3]]),
        ("{'a': {'b': [1, None]}}", {"a": {"b": [1, None]}}),
        ("[]", []),
        ("{}", {}),
        ("[x * 2 for x in range(3)]", [0, 2, 4]),
    ],
)
def test_return_values(expr: str, expected: Any) -> None:
    value = value_of(main_returning(expr))
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("len", "function"),
        ("range(3)", "range"),
        ("math", "struct"),
        ("records", "struct"),
        ("[1, records.lookup]", "function"),
        ("{1: 2}", "dict key is not a str"),
        ("float('inf')", "not finite"),
        ("[float('nan')]", "not finite"),
        ("9223372036854775808", "int overflows int64"),
        ("'abc'.elems()", "iterator"),
    ],
)
def test_unsupported_return_values(expr: str, fragment: str) -> None:
    error, message = error_of(main_returning(expr))
    assert error == "invalid_program"
    assert message.startswith("<codemode>:1:1: main() returned an unsupported value: ")
    assert fragment in message


def test_final_value_depth_and_bytes_limits() -> None:
    def nested(depth: int) -> str:
        return "[" * (depth - 1) + "1" + "]" * (depth - 1)

    assert value_of(main_returning(nested(32))) is not None
    assert error_of(main_returning(nested(33))) == ("resource_limit", "value size")
    small = LIMITS._replace(max_value_bytes=7)
    assert value_of(main_returning("'x' * 5"), limits=small) == "xxxxx"  # "xxxxx" is 7 bytes
    assert error_of(main_returning("'x' * 6"), limits=small) == ("resource_limit", "value size")
    assert error_of(main_returning("[1] * 10000"), limits=small) == ("resource_limit", "value size")


def test_deeply_nested_data_is_a_limit_not_a_crash() -> None:
    source = "def main():\n    x = []\n    for i in range(%d):\n        x = [x]\n    return x\n"
    assert error_of(source % 10_000) == ("resource_limit", "value size")
    assert error_of(source % 200_000) == ("resource_limit", "value size")


def test_deeply_nested_source_does_not_crash() -> None:
    depth = 20_000
    outcome = run("x = " + "[" * depth + "]" * depth + "\ndef main():\n    return 1\n")
    assert outcome == Outcome.final(1)


def test_cyclic_value_is_a_limit() -> None:
    source = "def main():\n    x = []\n    x.append(x)\n    return x\n"
    assert error_of(source) == ("resource_limit", "value size")


# --------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def main():\n    return 1 +\n", "<codemode>:2:15: Parse error: unexpected new line here"),
        ("def main():\n    return undefined_name\n", "<codemode>:2:12: Variable `undefined_name` not found"),
        ("def main():\n    return 10 // 0\n", "<codemode>:2:12: Floor division by zero: 10 // 0"),
        ('def main():\n    fail("boom")\n', "<codemode>:2:5: fail: boom"),
        ("def main():\n    return [1][5]\n", "<codemode>:2:12: Index `5` is out of bound"),
        ("def main():\n    return {}['k']\n", '<codemode>:2:12: Key `"k"` was not found'),
        ("def main():\n  x = 1\n   y = 2\n", "<codemode>:3:"),
        ("def f(a, a):\n    pass\ndef main():\n    return 1\n", "<codemode>:1:"),
        ("def main():\n    return len(a = 1, a = 2)\n", "<codemode>:2:23: repeated named argument"),
    ],
)
def test_error_messages_have_line_and_column(source: str, message: str) -> None:
    error, got = error_of(source)
    assert error == "invalid_program"
    assert got.startswith(message), got
    assert "\n" not in got
    assert "Traceback" not in got
    assert "/" not in got.split(":", 3)[-1] or "//" in got


def test_error_message_is_bounded_and_printable() -> None:
    error, message = error_of('def main():\n    fail("x" * 5000 + "\\n\\x01tail")\n')
    assert error == "invalid_program"
    assert len(message.encode()) <= 1024
    assert message.endswith("...")
    assert message.isprintable()


def test_errors_inside_builtins_point_at_the_call_site() -> None:
    source = "def main():\n    values = [1, 2]\n    return  sum(values + ['a'])\n"
    assert error_of(source)[1].startswith("<codemode>:3:13: ")


def test_runtime_error_at_top_level() -> None:
    error, message = error_of("x = 1 // 0\ndef main():\n    return 1\n")
    assert (error, message.split(" ", 1)[0]) == ("invalid_program", "<codemode>:1:5:")


def test_rust_panic_is_internal_without_text(monkeypatch: pytest.MonkeyPatch) -> None:
    # starlark-rust's json.decode panics on numbers like 1e309; the worker normally refuses them
    # before decoding. Build an environment without that guard to get a real Rust panic.
    monkeypatch.setattr(environment, "json_check", lambda *args, **kwargs: "")
    monkeypatch.setattr(environment, "_ENVIRONMENT", None)
    try:
        assert run(main_returning("json.decode('1e309')")) == Outcome.failed("internal", "")
    finally:
        monkeypatch.undo()
        environment._ENVIRONMENT = None
    assert error_of(main_returning("json.decode('1e309')"))[0] == "invalid_program"
    assert value_of(main_returning("'still fine'")) == "still fine"


# ------------------------------------------------------------------------------ step budget


def test_steps_exactly_at_budget_pass_and_one_check_over_fails() -> None:
    loop = "def main():\n    x = 0\n    for i in range(%d):\n        x += 1\n    return x\n"
    assert value_of(loop % 999_000) == 999_000
    assert value_of(loop % 1_000_000) == 1_000_000
    assert error_of(loop % 1_001_000) == ("resource_limit", "steps")
    small = LIMITS._replace(max_steps=5_000)
    assert value_of(loop % 4_990, limits=small) == 4_990
    assert error_of(loop % 6_000, limits=small) == ("resource_limit", "steps")


def test_steps_count_function_calls_and_top_level() -> None:
    # (a function returning a constant is inlined by starlark-rust: its calls do not tick)
    calls = (
        "def f(i):\n    return i %% 2\n"
        "def main():\n    t = 0\n    for i in range(%d):\n        t += f(i)\n    return t\n"
    )
    small = LIMITS._replace(max_steps=10_000)
    assert value_of(calls % 4_900, limits=small) == 2_450  # ~9,800 ticks
    assert error_of(calls % 6_000, limits=small) == ("resource_limit", "steps")
    top = "X = [i for i in range(20000)]\ndef main():\n    return 1\n"
    assert error_of(top, limits=small) == ("resource_limit", "steps")


def test_zero_steps_still_allows_tiny_programs() -> None:
    assert value_of(main_returning("[i for i in range(500)][-1]"), limits=LIMITS._replace(max_steps=0)) == 499


def test_callstack_limit_is_a_resource_limit() -> None:
    source = (
        "def f(n):\n    if n == 0:\n        return 0\n    return f(n - 1)\ndef main():\n    return f(%d)\n"
    )
    assert value_of(source % 150) == 0
    assert error_of(source % 250) == ("resource_limit", "steps")
    assert error_of(source % 100_000, limits=LIMITS._replace(max_callstack=10**9)) == (
        "resource_limit",
        "steps",
    )


# ---------------------------------------------------------------------------------- natives


def test_native_call_round_trip() -> None:
    host = Host(results=[{"n": 3, "neg": -5, "f": 2.5, "l": [None, True], "s": "é"}])
    source = (
        "def main():\n"
        '    r = records.lookup(key = "alpha", limit = 2)\n'
        '    return [r, type(r["f"]), type(r["n"])]\n'
    )
    assert value_of(source, host=host) == [
        {"n": 3, "neg": -5, "f": 2.5, "l": [None, True], "s": "é"},
        "float",
        "int",
    ]
    assert host.calls == [("records.lookup", {"key": "alpha", "limit": 2})]


def test_native_namespaces_and_nesting() -> None:
    host = Host()
    source = (
        "def main():\n"
        "    return [records.status(), records.entry.delete(key = 'k'), type(records), type(records.entry),\n"
        "            dir(records), hasattr(records, 'lookup'), getattr(records.entry, 'delete') != None]\n"
    )
    assert value_of(source, host=host) == [
        {"name": "records.status", "args": {}},
        {"name": "records.entry.delete", "args": {"key": "k"}},
        "struct",
        "struct",
        ["entry", "lookup", "status"],
        True,
        True,
    ]
    assert [name for name, _ in host.calls] == ["records.status", "records.entry.delete"]


def test_arguments_are_normalized_before_leaving() -> None:
    host = Host()
    source = "def main():\n    return metrics.push(values = (1, 2.5), tags = {'env': 'x'})\n"
    value_of(source, host=host)
    args = host.calls[0][1]
    assert args == {"values": [1.0, 2.5], "tags": {"env": "x"}}
    assert [type(v) for v in args["values"]] == [float, float]
    value_of("def main():\n    return records.lookup(key = 'a', limit = None)\n", host=host)
    assert host.calls[1][1] == {"key": "a"}
    value_of("def main():\n    return data.echo(value = [1, None])\n", host=host)
    assert host.calls[2][1] == {"value": [1, None]}


def test_top_level_native_call_is_rejected() -> None:
    host = Host()
    error, message = error_of('x = records.lookup(key = "a")\ndef main():\n    return x\n', host=host)
    assert error == "invalid_program"
    assert message.startswith("<codemode>:1:5: capability records.lookup called outside main()")
    assert host.calls == []
    source = "def main():\n    return records.status()\nx = main()\n"
    assert error_of(source, host=host)[0] == "invalid_program"
    assert host.calls == []


@pytest.mark.parametrize(
    ("call", "diagnostic"),
    [
        ('records.lookup("a")', POSITIONAL + "call records.lookup(key=...) with keywords"),
        ("records.status(1)", POSITIONAL + "call records.status() without arguments"),
        ("records.lookup(*['a'])", POSITIONAL + "call records.lookup(key=...) with keywords"),
        ("records.lookup()", 'missing required argument "key"'),
        ("records.lookup(key = 'a', extra = 1)", 'unknown argument "extra"'),
        ("records.lookup(key = 1)", 'argument "key" must be str, got int'),
        ("records.lookup(key = 'a', limit = 9223372036854775808)", 'argument "limit" overflows int64'),
        ("records.lookup(key = 'a', limit = True)", 'argument "limit" must be int | None, got bool'),
        ("records.lookup(key = len)", 'argument "key" must be str, got function'),
        ("records.lookup(key = range(2))", 'argument "key" must be str, got range'),
        ("records.lookup(key = math)", 'argument "key" must be str, got struct'),
        ("records.lookup(key = math.sqrt)", 'argument "key" must be str, got function'),
        ("metrics.push(values = [1, float('inf')])", 'argument "values[1]" must be a finite float'),
        ("metrics.push(values = [1, 'x'])", 'argument "values[1]" must be float, got str'),
        ("metrics.push(values = [], tags = {1: 'x'})", 'argument "tags" keys must be str'),
        ("metrics.push(values = [], tags = {'env': 2})", "argument \"tags['env']\" must be str, got int"),
        ("metrics.push(values = [], tags = {'a': len})", "argument \"tags['a']\" must be str, got function"),
        ("records.lookup(**{'key': 'a', 'nope': 1})", 'unknown argument "nope"'),
    ],
)
def test_invalid_native_arguments(call: str, diagnostic: str) -> None:
    # The worker's diagnostic goes to the host, which ends the program (or answers an attempt).
    host = Host()
    with pytest.raises(NativeAborted):
        run(main_returning(call), host=host)
    name = call.split("(", 1)[0]
    assert host.invalid_calls == [(name, diagnostic, False)]
    assert host.calls == []
    tried = value_of(
        main_returning(call.replace(name + "(", f"attempt({name}, ", 1).replace(", )", ")")), host=host
    )
    assert tried == {"ok": False, "error": "invalid capability arguments: " + diagnostic}
    assert host.invalid_calls[1] == (name, diagnostic, True)
    assert host.calls == []


def test_duplicate_keyword_is_a_parse_error() -> None:
    error, message = error_of(main_returning("records.lookup(key = 'a', key = 'b')"))
    assert error == "invalid_program"
    assert "repeated named argument" in message


def test_native_call_count_limit() -> None:
    host = Host(results=[1] * 10)
    source = "def main():\n    for i in range(%d):\n        records.status()\n    return 1\n"
    limits = LIMITS._replace(max_native_calls=3)
    assert value_of(source % 3, limits=limits, host=host) == 1
    assert error_of(source % 4, limits=limits, host=host) == ("resource_limit", "native calls")
    assert len(host.calls) == 6
    zero = LIMITS._replace(max_native_calls=0)
    assert error_of(main_returning("records.status()"), limits=zero, host=host) == (
        "resource_limit",
        "native calls",
    )


def test_native_argument_limits() -> None:
    host = Host()
    deep = "[" * 40 + "1" + "]" * 40
    assert error_of(main_returning(f"data.echo(value = {deep})"), host=host) == (
        "resource_limit",
        "value size",
    )
    small = LIMITS._replace(max_value_bytes=30)
    assert error_of(main_returning("records.lookup(key = 'x' * 100)"), limits=small, host=host) == (
        "resource_limit",
        "value size",
    )
    hostile = DEEP_100K + "    return data.echo(value = x)\n"
    assert error_of(hostile, host=host) == ("resource_limit", "value size")
    assert host.calls == []


def test_native_argument_depth_counts_each_value_exactly() -> None:
    shape: dict[str, Any] = INT
    for _ in range(31):
        shape = {"t": "list", "of": shape}  # 31 list levels around an int: value depth 32
    manifest = [*MANIFEST, {"name": "deep.take", "input": rec(v=shape)}]

    def nested(depth: int) -> str:
        return "[" * (depth - 1) + "1" + "]" * (depth - 1)

    host = Host(results=["ok"])
    ok = run_program(main_returning(f"deep.take(v = {nested(32)})"), manifest, LIMITS, host)
    assert ok == Outcome.final("ok")
    assert len(host.calls) == 1
    over = run_program(main_returning(f"deep.take(v = [{nested(32)}])"), manifest, LIMITS, host)
    assert over == Outcome.failed("resource_limit", "value size")
    assert len(host.calls) == 1


def test_native_result_limits() -> None:
    too_deep: Any = 1
    for _ in range(40):
        too_deep = [too_deep]
    assert error_of(main_returning("records.status()"), host=Host([too_deep])) == (
        "resource_limit",
        "value size",
    )
    small = LIMITS._replace(max_value_bytes=20)
    assert error_of(main_returning("records.status()"), limits=small, host=Host(["x" * 100])) == (
        "resource_limit",
        "value size",
    )


def test_non_plain_native_result_is_a_host_protocol_error() -> None:
    with pytest.raises(HostProtocolError):
        run(main_returning("records.status()"), host=Host([float("nan")]))


def test_abort_stops_the_program_at_once() -> None:
    host = Host(fail=("records.status",))
    source = "def main():\n    records.status()\n    records.status()\n    return 1\n"
    with pytest.raises(NativeAborted):
        run_program(source, MANIFEST, LIMITS, host)
    assert len(host.calls) == 1


def test_intermediate_results_are_not_returned() -> None:
    source = "def main():\n    records.lookup(key = 'secret')\n    return 'only this'\n"
    assert value_of(source) == "only this"


def test_many_native_calls() -> None:
    source = (
        "def main():\n    t = 0\n    for i in range(100):\n"
        "        if records.lookup(key = str(i))['args']['key'] == str(i):\n"
        "            t += 1\n"
        "    return t\n"
    )
    assert value_of(source) == 100


def test_deep_native_results_cross_intact() -> None:
    deep: Any = "leaf"
    for _ in range(90):
        deep = {"a": [deep]} if _ % 2 else [deep]  # depth 136
    limits = LIMITS._replace(max_value_depth=200)
    assert value_of(main_returning("records.status()"), limits=limits, host=Host([deep])) == deep


def test_invalid_manifest_is_rejected() -> None:
    with pytest.raises(ValueError):
        run_program(main_returning("1"), [{"name": "json.x", "input": rec()}], LIMITS, Host())


# ---------------------------------------------------------------------------------- attempt


def test_attempt_returns_the_result_or_the_hosts_error_as_a_value() -> None:
    host = Host(fail=("records.status",))
    source = (
        "def main():\n"
        "    a = attempt(records.lookup, key = 'k', limit = 2)\n"
        "    b = attempt(records.status)\n"
        "    c = attempt(records.lookup, key = 1)\n"
        "    return [a, b, c, records.lookup(key = 'z')]\n"
    )
    assert value_of(source, host=host) == [
        {"ok": True, "value": {"name": "records.lookup", "args": {"key": "k", "limit": 2}}},
        {"ok": False, "error": "permission denied"},
        {"ok": False, "error": 'invalid capability arguments: argument "key" must be str, got int'},
        {"name": "records.lookup", "args": {"key": "z"}},
    ]
    assert host.attempts == [True, True, False]
    assert host.invalid_calls == [("records.lookup", 'argument "key" must be str, got int', True)]


@pytest.mark.parametrize(
    "call",
    [
        "attempt()",
        "attempt(len, 1)",
        "attempt('records.lookup', key = 'a')",
        "attempt(capability, key = 'a')",
    ],
)
def test_attempt_needs_a_capability(call: str) -> None:
    source = f"def capability(key):\n    return key\n\ndef main():\n    return {call}\n"
    host = Host()
    error, message = error_of(source, host=host)
    assert (error, message) == ("invalid_program", "<codemode>:5:12: " + interpreter.ATTEMPT_MESSAGE)
    assert host.calls == [] and host.invalid_calls == []


def test_attempt_outside_main_and_over_the_call_limit_still_end_the_program() -> None:
    host = Host()
    error, message = error_of("x = attempt(records.status)\ndef main():\n    return x\n", host=host)
    assert error == "invalid_program" and "called outside main()" in message
    source = "def main():\n    for i in range(4):\n        attempt(records.status)\n    return 1\n"
    limits = LIMITS._replace(max_native_calls=3)
    assert error_of(source, limits=limits, host=host) == ("resource_limit", "native calls")
    assert len(host.calls) == 3  # attempts count like any call


def test_attempt_does_not_recover_from_limits() -> None:
    small = LIMITS._replace(max_value_bytes=30)
    host = Host()
    assert error_of(main_returning("attempt(records.lookup, key = 'x' * 100)"), limits=small, host=host) == (
        "resource_limit",
        "value size",
    )
    big = Host(results=["y" * 100])
    assert error_of(main_returning("attempt(records.status)"), limits=small, host=big) == (
        "resource_limit",
        "value size",
    )
    assert host.calls == [] and host.invalid_calls == []


def test_attempt_applies_to_exactly_one_call() -> None:
    host = Host(fail=("records.status",))
    source = "def main():\n    attempt(records.lookup, key = 'a')\n    return records.status()\n"
    with pytest.raises(NativeAborted):
        run(source, host=host)
    assert host.attempts == [True, False]


class _Answering(Host):
    """A host that answers an error to calls that asked no recovery (a protocol violation)."""

    def call(self, name: str, args: dict[str, Any], attempt: bool) -> Reply:
        return Reply.failed("permission denied")

    def invalid(self, name: str, message: str, attempt: bool) -> Reply:
        return Reply.failed("invalid capability arguments")


@pytest.mark.parametrize("call", ["records.status()", "records.lookup(key = 1)"])
def test_an_error_answer_without_attempt_is_a_host_protocol_error(call: str) -> None:
    with pytest.raises(HostProtocolError):
        run(main_returning(call), host=_Answering())


def test_attempt_of_deep_results_crosses_intact() -> None:
    deep: Any = "leaf"
    for _ in range(90):
        deep = [deep]
    limits = LIMITS._replace(max_value_depth=200)
    value = value_of(main_returning("attempt(records.status)"), limits=limits, host=Host([deep]))
    assert value == {"ok": True, "value": deep}


# ---------------------------------------------------------------------------------- prints

PRINTING = LIMITS._replace(max_print_bytes=64)


def test_prints_are_sent_before_each_call_and_at_the_end() -> None:
    host = Host()
    source = (
        "def main():\n"
        "    print('a', 1, [2], None)\n"
        "    print('b', 'c', sep = '-', end = '!')\n"
        "    records.status()\n"
        "    print(sep = None, end = None)\n"
        "    return 1\n"
    )
    assert value_of(source, limits=PRINTING, host=host) == 1
    assert host.printed == [("a 1 [2] None\nb-c!", False), ("\n", False)]


def test_prints_are_cut_at_the_budget_on_a_character_boundary() -> None:
    host = Host()
    source = "def main():\n    print('é' * 40)\n    print('after the cut')\n    return 1\n"
    assert value_of(source, limits=PRINTING, host=host) == 1
    assert host.printed == [("é" * 32, True)]  # 64 bytes of two-byte characters, nothing after


def test_prints_reach_the_host_when_the_program_fails() -> None:
    host = Host()
    source = "def main():\n    print('before')\n    fail('boom')\n"
    assert error_of(source, limits=PRINTING, host=host)[0] == "invalid_program"
    assert host.printed == [("before\n", False)]
    steps = "def main():\n    print('looping')\n    for i in range(10000000):\n        pass\n"
    host = Host()
    assert error_of(steps, limits=PRINTING._replace(max_steps=5000), host=host) == ("resource_limit", "steps")
    assert host.printed == [("looping\n", False)]


def test_prints_are_sent_at_step_checks() -> None:
    # A program the host kills at its deadline has its prints sent as it runs, not only at the end.
    host = Host()
    run_state = interpreter._Run(PRINTING, {}, host)
    run_state.print_text("early\n")
    assert host.printed == []
    assert run_state.check_cancelled() is False
    assert host.printed == [("early\n", False)]
    assert run_state.check_cancelled() is False
    assert host.printed == [("early\n", False)]  # nothing new: nothing sent
    run_state.print_text("later\n")
    assert run_state.check_cancelled() is False  # check 3: not a power of two, kept for later
    assert host.printed == [("early\n", False)]
    assert run_state.check_cancelled() is False  # check 4
    assert host.printed == [("early\n", False), ("later\n", False)]


def test_a_host_gone_while_prints_are_sent_stops_the_program() -> None:
    class Gone(Host):
        def prints(self, text: str, cut: bool) -> None:
            raise NativeAborted("host closed the stream")

    source = "def main():\n    print('x')\n    for i in range(100000):\n        pass\n    return 1\n"
    with pytest.raises(NativeAborted):
        run(source, limits=PRINTING, host=Gone())
