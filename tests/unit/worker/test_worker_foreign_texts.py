"""codemode_worker.foreign_texts: which first lines of an error are the machinery's, and what
replaces them. The programs that produce each text run in tests/integration/execution/test_program_texts.py;
here are the rules no honest program reaches (a Python exception of the worker's own)."""

from __future__ import annotations

import sys

import pytest

from codemode_worker.foreign_texts import digit_limit_text, translate


def test_the_digit_limit_text_is_measured_from_this_interpreter() -> None:
    with pytest.raises(ValueError) as info:
        int("7" * (sys.get_int_max_str_digits() + 1))
    assert digit_limit_text(str(info.value))
    assert translate(f"ValueError: {info.value}") == ("resource_limit", "value size")
    assert not digit_limit_text("Exceeds the budget")


@pytest.mark.parametrize(
    "message",
    ["KeyError: 'x'", "TypeError: unsupported operand", "ValueError: invalid literal", "RuntimeWarning: x"],
)
def test_any_other_python_exception_text_is_internal(message: str) -> None:
    assert translate(message) == ("internal", "")


@pytest.mark.parametrize(
    "message",
    [
        "fail: ValueError: Exceeds the limit (4300 digits) for integer string conversion",
        "Variable `x` not found",
        "Integer value is too big to fit in i32: 2147483648",
        "Type of parameter `a` doesn't match, expected `str`, actual `int (repr: 1)`",
        "json.decode: integer out of range: 1111",
    ],
)
def test_the_languages_own_texts_stay(message: str) -> None:
    assert translate(message) is None


def test_unpacking_a_parameter_that_takes_no_int() -> None:
    assert translate("Error unpacking value for parameter `sep` of type `str") == (
        "invalid_program",
        "invalid value for parameter `sep`",
    )
    assert translate("Error unpacking value for parameter `n` of type `None | int`") == (
        "invalid_program",
        "integer out of range for parameter `n`",
    )
