"""Source checks and error texts, and the Python-written builtins' helpers."""

from __future__ import annotations

import pytest

from codemode_worker.diagnostics import bounded, describe_error, has_valid_main, program_error, tokens
from codemode_worker.pybuiltins import indent_text, json_check


def test_tokens_skip_strings_comments_and_numbers() -> None:
    source = 'x = \'def main()\' + """\ndef main():\n""" # def main():\ny = r\'\\\'\' + 1e5\n'
    assert [t for t, _ in tokens(source)] == ["x", "=", "+", "y", "=", "+"]
    assert tokens("  def  main") == [("def", 2), ("main", 7)]


@pytest.mark.parametrize(
    ("source", "ok"),
    [
        ("def main():\n  return 1\n", True),
        ("def main( ):\n  return 1\n", True),
        ("def main(\n):\n  return 1\n", True),
        ("def main(x):\n  return 1\n", False),
        ("def main(*a):\n  return 1\n", False),
        ("def main(**k):\n  return 1\n", False),
        ("def f():\n  def main():\n    pass\n", False),
        ("def main():\n  pass\ndef main():\n  pass\n", False),
        ("x = '''\ndef main():\n'''\n", False),
        ("x = 1\n", False),
        ("def mainx():\n  pass\n", False),
    ],
)
def test_has_valid_main(source: str, ok: bool) -> None:
    assert has_valid_main(source) is ok


def test_describe_error_uses_program_span() -> None:
    text = "error: Variable `x` not found\n --> <codemode>:3:7\n  |\n3 |   y = x\n  |       ^\n"
    assert describe_error(text, "") == ("3:7", "Variable `x` not found")
    assert program_error(text, "") == "<codemode>:3:7: Variable `x` not found"


def test_describe_error_falls_back_to_the_call_site() -> None:
    text = (
        "Traceback (most recent call last):\n"
        "  * <driver>:3, in <module>\n      run_main(main)\n"
        "  * <builtins>:5, in run_main\n      value = main()\n"
        "  * <codemode>:2, in main\n      return  sum(x)\n"
        "error: Operation `+` not supported\n --> <builtins>:3:9\n  |\n"
    )
    helpers = {"<builtins>": "x = 1\ndef sum(a):\n    t + a\n"}
    source = "def main():\n    return  sum(x)\n"
    assert describe_error(text, source, helpers=helpers) == ("2:13", "Operation `+` not supported")
    assert describe_error(text, source) == ("2:5", "Operation `+` not supported")
    assert describe_error(text, "def main():\n    return  math.sqrt(x)\n", callee="sqrt")[0] == "2:13"


def test_describe_error_strips_python_exception_prefixes() -> None:
    text = "error: CallError: math.sqrt: math domain error\n --> <codemode>:1:1\n"
    assert describe_error(text, "")[1] == "math.sqrt: math domain error"
    text = "error: StarlarkError: Operation `x` not supported\n --> <codemode>:1:1\n"
    assert describe_error(text, "")[1] == "Operation `x` not supported"


def test_bounded() -> None:
    assert bounded("a\nb\x00c") == "a b c"
    long = bounded("é" * 1000)
    assert len(long.encode()) <= 1024 and long.endswith("...")
    assert bounded("short") == "short"


def test_indent_text_like_go() -> None:
    assert indent_text('{"a":[1,{}],"b":[]}', "", "  ") == '{\n  "a": [\n    1,\n    {}\n  ],\n  "b": []\n}'
    assert indent_text(' [ "x\\"]" , 2 ] ', ">", "\t") == '[\n>\t"x\\"]",\n>\t2\n>]'
    assert indent_text("3", "", "\t") == "3"


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('[1, 2.5, -3, null, true, "x"]', True),
        ("18446744073709551615", True),
        ("-9223372036854775808", True),
        ("18446744073709551616", False),
        ("-9223372036854775809", False),
        ("1e400", False),
        ("NaN", False),
        ("-Infinity", False),
        ("[" * 100 + "]" * 100, True),
        ("[" * 101 + "]" * 101, False),
        ("[" * 100_000, False),
        ("{", False),
    ],
)
def test_json_check(text: str, ok: bool) -> None:
    assert (json_check(text) == "") is ok
