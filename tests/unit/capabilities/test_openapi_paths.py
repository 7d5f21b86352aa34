"""Path parameter values stay inside their segment (codemode_capabilities.openapi.paths).

The integration tests (tests/integration/capabilities/test_openapi_routes.py) send the same kinds of values to
real servers; here the rule itself, value by value."""

from __future__ import annotations

import pytest

import codemode
from codemode_capabilities.openapi.paths import ONE_SEGMENT, SEGMENTS, encode_path_value


@pytest.mark.parametrize(
    ("value", "sent"),
    [
        ("42", "42"),
        ("a b?c#d", "a%20b%3Fc%23d"),
        ("50% off", "50%25%20off"),
        ("a.b", "a.b"),
        (".hidden", ".hidden"),
        ("ü", "%C3%BC"),
        ("1;v=2", "1%3Bv%3D2"),
    ],
)
def test_one_segment_values_are_encoded(value: str, sent: str) -> None:
    assert encode_path_value("id", value) == sent


@pytest.mark.parametrize(
    "value",
    ["", ".", "..", "...", " ", ". .", "..;x", ";x", "a/b", "a\\b", "%2e", "%2F", "%252f", "%c0%ae",
     "%u002e", "\uff0e\uff0e", "a\uff0fb", "a\x00", "a\r\nb", "a\u2028b", "a\u200bb"],
)  # fmt: skip
def test_escaping_values_are_refused(value: str) -> None:
    with pytest.raises(codemode.InvalidArguments) as info:
        encode_path_value("id", value)
    assert info.value.detail == f'argument "id" {ONE_SEGMENT}'


def test_multi_segment_values() -> None:
    assert encode_path_value("path", "docs/a b/c.md", multi_segment=True) == "docs/a%20b/c.md"
    for bad in [
        "",
        "/a",
        "a/",
        "a//b",
        "a/./b",
        "a/../b",
        "a/..;x/b",
        "a\\b",
        "a/%2e%2e/b",
        "a/\uff0e\uff0e",
    ]:
        with pytest.raises(codemode.InvalidArguments) as info:
            encode_path_value("path", bad, multi_segment=True)
        assert info.value.detail == f'argument "path" {SEGMENTS}', bad
