"""Program errors that say what to write instead (codemode_worker.hints), unit and through a real
worker."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import codemode
from codemode import authz
from codemode.common.errors import client_text
from codemode_worker.hints import explain


def test_a_missing_capability_names_the_namespace_and_the_way_to_find_one() -> None:
    source = "def main():\n    return records.fetch(id=1)\n"
    text = explain("Object of type `struct` has no attribute `fetch`", source, "2:12")
    assert text.startswith("records has no capability `fetch`: search_api finds capabilities")


def test_nested_namespaces_and_builtin_modules() -> None:
    source = "def main():\n    return github.issues.lst(owner='a')\n"
    assert explain("Object of type `struct` has no attribute `lst`", source, "2:12").startswith(
        "github.issues has no capability `lst`"
    )
    math = "def main():\n    return math.cosine(1)\n"
    message = "Object of type `struct` has no attribute `cosine`, did you mean `cos`?"
    assert explain(message, math, "2:12") == "math has no function `cosine` (did you mean `cos`?)"


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Variable `set` not found, did you mean `s`?", "`set` is not available: use dict keys"),
        ("Variable `map` not found, did you mean `max`?", "`map` is not available: use a list comprehension"),
        ("Variable `filter` not found", "`filter` is not available: use a list comprehension"),
        ("Variable `round` not found", "`round` is not available: use `math.round(x)`"),
    ],
)
def test_a_missing_python_builtin_gets_the_tools_advice_not_the_nearest_spelling(
    message: str, expected: str
) -> None:
    text = explain(message, "def main():\n    return 1\n", "2:12")
    assert text.startswith(expected), text
    assert "did you mean" not in text


def test_other_messages_pass_unchanged() -> None:
    assert explain("Variable `recordz` not found", "x", "1:1") == "Variable `recordz` not found"
    # A location that does not show the attribute: the interpreter's text stays.
    assert explain("Object of type `struct` has no attribute `a`", "def main():\n    return 1\n", "2:5") == (
        "Object of type `struct` has no attribute `a`"
    )


@dataclass
class Empty:
    pass


PROGRAMS = [
    ("def main():\n    return records.fetch(id=1)\n", "2:12: records has no capability `fetch`"),
    ("def main():\n    x = 1\n    return f'{x}'\n", "3:12: f-strings are not available: use"),
    (
        "def main():\n    while True:\n        pass\n",
        "2:5: `while` is not available: loop over a bounded range",
    ),
    (
        "def main():\n    try:\n        pass\n    except:\n        pass\n",
        "2:5: `try` is not available: to handle a failing capability call, make it with `attempt(",
    ),
    ("def main():\n    import os\n", "2:5: `import` is not available"),
    ("def main():\n    return json.foo\n", "2:12: json has no function `foo`"),
    ("def main():\n    s = set([1])\n    return 1\n", "2:9: `set` is not available: use dict keys"),
    ("def main():\n    return map(str, [1])\n", "2:12: `map` is not available: use a list comprehension"),
]


@pytest.mark.parametrize(("source", "expected"), PROGRAMS)
async def test_through_a_real_worker(source: str, expected: str) -> None:
    async def get(ctx: codemode.CallContext, subject: authz.Subject) -> Empty:
        return Empty()

    cap = codemode.Capability(id="records.get", name="records.get", summary="Get.", handler=get)
    async with codemode.Builder(authorizer=authz.allow_all()).register(cap).build() as server:
        with pytest.raises(codemode.InvalidProgram) as info:
            await server.execute(source, subject=authz.Subject("a"))
    assert client_text(info.value).startswith(f"invalid program: <codemode>:{expected}"), client_text(
        info.value
    )
