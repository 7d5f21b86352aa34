"""describe_api answers are bounded like search_api responses (docs/reference/describe.md, "Bound"):
a capability whose answer cannot fit is refused at registration, an upstream tool is skipped."""

from __future__ import annotations

import json
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.catalog.answers import DEFAULT_MAX_DESCRIBE_RESPONSE_BYTES, AnswerBounds
from codemode.common.errors import InvalidRegistration
from codemode.packs.upstream import answer_problem


async def _handler(ctx: Any, subject: Any, args: dict[str, Any]) -> dict[str, Any]:
    return {}


def wide(n: int, name: str = "up.wide", *, description: str | None = None) -> codemode.Capability:
    fields = [{"name": f"p{i:04d}", "shape": {"t": "opt", "of": {"t": "str"}}} for i in range(n)]
    return codemode.Capability(
        name=name,
        summary="A tool with very many parameters.",
        description=description,
        handler=_handler,
        input_shape={"t": "record", "fields": fields},
        output_shape={"t": "record", "fields": [{"name": "text", "shape": {"t": "str"}}]},
    )


def answer_bytes(server: codemode.Server, name: str) -> int:
    text = json.dumps(server.describe(name).to_dict(), separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-8"))


def build(*caps: codemode.Capability, **limits: Any) -> codemode.Server:
    builder = codemode.Builder(authorizer=authz.allow_all(), limits=codemode.Limits(**limits))
    return builder.register(*caps).build()


def test_default_bound_is_the_search_bound() -> None:
    resolved = codemode.Limits()
    assert resolved.max_describe_response_bytes == DEFAULT_MAX_DESCRIBE_RESPONSE_BYTES == 65536
    assert resolved.max_describe_response_bytes == resolved.max_search_response_bytes


def test_a_capability_whose_answer_cannot_fit_is_refused_at_registration() -> None:
    # 3,000 parameters: its search result (the signature) fits 64 KiB, its describe answer does not
    with pytest.raises(InvalidRegistration) as info:
        build(wide(3000), wide(1, "up.narrow"))
    assert info.value.problems == [
        "capability 'up.wide': its describe_api answer alone exceeds the response bound "
        "(max_describe_response_bytes)"
    ]


@pytest.mark.parametrize("bound", [1024, 4096, 65536])
def test_every_registered_answer_fits_its_bound(bound: int) -> None:
    # grow the capability until registration refuses it: the largest accepted answer is within the bound
    accepted = 0
    for n in range(0, 3000, 7):
        try:
            server = build(wide(n), max_describe_response_bytes=bound)
        except InvalidRegistration:
            break
        accepted = answer_bytes(server, "up.wide")
        assert accepted <= bound
    else:
        pytest.fail("the bound never refused a capability")
    assert accepted > bound // 2


def test_the_bound_has_a_minimum() -> None:
    with pytest.raises(InvalidRegistration) as info:
        build(wide(1), max_describe_response_bytes=1023)
    assert info.value.problems[0].startswith("limits: max_describe_response_bytes must be at least 1024 (")


def test_upstream_tools_over_the_bound_are_skipped_with_the_reason() -> None:
    assert answer_problem(wide(3000), AnswerBounds()) == (
        "its describe_api answer would be 219,205 bytes, over max_describe_response_bytes"
    )
    narrow = wide(2, "up.narrow")
    assert answer_problem(narrow, AnswerBounds()) is None
    # what is kept registers and answers within the bound
    assert answer_bytes(build(narrow), "up.narrow") < 1024


def test_upstream_admission_follows_the_configured_bounds() -> None:
    small = AnswerBounds(max_search_response_bytes=65536, max_describe_response_bytes=2048)
    assert "max_describe_response_bytes" in (answer_problem(wide(40), small) or "")
    assert answer_problem(wide(20), small) is None
    # a search result that cannot fit is reported the same way
    tiny_search = AnswerBounds(max_search_response_bytes=256)
    assert "max_search_response_bytes" in (answer_problem(wide(40), tiny_search) or "")
    # a capability with other problems is left to the builder, which names them
    assert answer_problem(wide(1, "nodots"), AnswerBounds()) is None
