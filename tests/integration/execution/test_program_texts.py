"""No text of the interpreter's machinery reaches a client: CPython's integer
digit limit ("Exceeds the limit (4300 digits) ... use sys.set_int_max_str_digits()"), starlark-pyo3's
conversion messages ("... to Python object", "serde::serialize") and starlark-rust's parameter
unpacking message ("Error unpacking value for parameter `a1` of type `int") each become an approved
text of docs/reference/errors.md. Through the real execute path: a worker process and the host's
checks of what it says."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import codemode
from codemode.common.errors import client_text
from tests.support.recorder import ALICE, make_server

#: An 8,000-digit integer: Starlark computes it, CPython will not parse it from text.
BIG = "    big = int('9' * 4000) * int('9' * 4000)\n"
OUT_OF_RANGE = "invalid program: <codemode>:2:12: json.decode: integer out of range: "
VALUE_SIZE = "resource limit exceeded: value size"

FAILING: list[tuple[str, object]] = [
    # json.decode of a number literal past CPython's digit limit: like any integer beyond 64 bits.
    ("    return json.decode('1' * 5000)\n", OUT_OF_RANGE + "1" * 32),
    ("    return json.decode('-' + '9' * 5000)\n", OUT_OF_RANGE + "-" + "9" * 31),
    ("    return json.decode('[1, ' + '2' * 4301 + ']')\n", OUT_OF_RANGE + "2" * 32),
    # A huge integer handed to a builtin: too large to cross, like a result or an argument.
    (BIG + "    return math.floor(big)\n", VALUE_SIZE),
    (BIG + "    return math.log(big, 10)\n", VALUE_SIZE),
    (BIG + "    return json.indent('[1]', prefix=big)\n", VALUE_SIZE),
    (BIG + "    return json.encode([big, range(3)])\n", VALUE_SIZE),
    (BIG + "    return util.echo(value=[big, range(3)])\n", VALUE_SIZE),
    (BIG + "    return [big, float('nan')]\n", VALUE_SIZE),  # was internal failure
    # Too deep for the bridge to a builtin.
    ("    x = []\n    for i in range(2000):\n        x = [x]\n    return math.floor(x)\n", VALUE_SIZE),
    # Not a number, not a JSON text: the builtin's own words, not the bridge's.
    (
        "    return math.floor(main)\n",
        "invalid program: <codemode>:2:12: unsupported argument of type `function`",
    ),
    (
        "    return json.indent(range(3))\n",
        "invalid program: <codemode>:2:12: unsupported argument of type `range`",
    ),
    (
        BIG + "    return json.decode(big)\n",
        "invalid program: <codemode>:3:12: json.decode: got int, want str",
    ),
    (
        "    return json.decode(main)\n",
        "invalid program: <codemode>:2:12: json.decode: got function, want str",
    ),
    # An integer an interpreter builtin cannot take (32 bits): named as such, with the parameter.
    (
        "    return range(int('9' * 30))\n",
        "invalid program: <codemode>:2:12: integer out of range for parameter `a1`",
    ),
    (
        "    return [1].pop(int('9' * 30))\n",
        "invalid program: <codemode>:2:12: integer out of range for parameter `index`",
    ),
    (
        "    return 'a b'.split(' ', int('9' * 30))\n",
        "invalid program: <codemode>:2:12: integer out of range for parameter `maxsplit`",
    ),
    (
        "    return chr(int('9' * 30))\n",
        "invalid program: <codemode>:2:12: integer out of range for parameter `i`",
    ),
    # A lone surrogate escape: json.decode's own refusal (it used to be serde_json's words).
    (
        "    return json.decode('\"\\\\ud800\"')\n",
        "invalid program: <codemode>:2:12: json.decode: lone surrogate in a \\u escape",
    ),
]

SUCCEEDING: list[tuple[str, object]] = [
    # Every bad input of json.decode gives `default` (these used to fail instead).
    (BIG + "    return json.decode(big, default='d')\n", "d"),
    ("    return json.decode('1' * 5000, default='d')\n", "d"),
    ("    return json.decode('\"\\\\ud800\"', default='d')\n", "d"),
    # What stays: a surrogate pair, and big integers the bridge never sees.
    ("    return json.decode('\"\\\\ud83d\\\\ude00\"')\n", "\U0001f600"),
    (BIG + "    return len(str(big))\n", 8000),
    ("    return str(json.decode('18446744073709551615'))\n", "18446744073709551615"),
]


def cases(pairs: list[tuple[str, object]]) -> list[Any]:
    """The pairs as pytest params named by the body's last line."""
    return [
        pytest.param(body, out, id=body.splitlines()[-1].strip().removeprefix("return "))
        for body, out in pairs
    ]


@pytest.fixture
async def server() -> AsyncIterator[codemode.Server]:
    srv, _ = make_server(max_execution_time=60.0)
    yield srv
    await srv.aclose()


@pytest.mark.parametrize(("body", "expected"), cases(FAILING))
async def test_no_interpreter_text_reaches_the_client(
    server: codemode.Server, body: str, expected: str
) -> None:
    with pytest.raises(codemode.CodeModeError) as info:
        await server.execute("def main():\n" + body, subject=ALICE)
    text = client_text(info.value)
    assert text == expected
    for internal in ("sys.", "4300", "Python", "serde", "ValueError", "unpacking", "hex escape"):
        assert internal not in text


@pytest.mark.parametrize(("body", "expected"), cases(SUCCEEDING))
async def test_the_same_builtins_still_work(server: codemode.Server, body: str, expected: object) -> None:
    assert await server.execute("def main():\n" + body, subject=ALICE) == expected
