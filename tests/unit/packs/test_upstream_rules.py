"""Naming and text rules shared by the upstream packs (``codemode.packs.upstream``)."""

from __future__ import annotations

import pytest

from codemode.catalog.capability import Capability, validate_catalog
from codemode.packs.upstream import (
    SkipReport,
    UpstreamBuildError,
    argument_names,
    capability_names,
    clean_text,
    description_of,
    search_terms_of,
    snake_case,
    summary_of,
)
from codemode_capabilities.mcp.upstream import UpstreamMCPConfig
from codemode_capabilities.openapi import OpenAPIConfig


@pytest.mark.parametrize(
    ("original", "expected"),
    [
        ("getTinyImage", "get_tiny_image"),
        ("get-tiny-image", "get_tiny_image"),
        ("issues/list-for-repo", "issues_list_for_repo"),
        ("HTTPServerList", "http_server_list"),
        ("3dRender", "op_3d_render"),
        ("def", "def_"),
        ("for", "for_"),
        ("!!!", "op"),
        ("ÜberTool", "ber_tool"),
    ],
)
def test_snake_case(original: str, expected: str) -> None:
    assert snake_case(original) == expected


def test_capability_names_are_collision_free_and_order_independent() -> None:
    originals = ["get-item", "getItem", "get_item", "list"]
    names = capability_names("shop", originals)
    assert names == {
        "getItem": "shop.get_item_3",
        "get-item": "shop.get_item_2",
        "get_item": "shop.get_item",
        "list": "shop.list",
    }
    assert capability_names("shop", list(reversed(originals))) == names
    assert len(set(names.values())) == len(originals)


def test_namespace_rules() -> None:
    assert capability_names("a.b", ["x"]) == {"x": "a.b.x"}
    for bad in ("Shop", "json", "a..b", "1x", "for"):
        with pytest.raises(UpstreamBuildError):
            capability_names(bad, ["x"])
    with pytest.raises(ValueError, match="set namespace"):
        UpstreamMCPConfig(name="json", command="x")
    assert (
        OpenAPIConfig(name="json", namespace="js", document="d", base_url="http://h").resolved_namespace
        == "js"
    )


def test_argument_names_keep_identifiers_and_map_the_rest() -> None:
    assert argument_names(["owner", "per-page", "X-Request-Id", "from", "per_page"]) == {
        "owner": "owner",
        "per_page": "per_page",
        "per-page": "per_page_2",
        "X-Request-Id": "x_request_id",
        "from": "from_",
    }


def test_text_is_bounded_and_clean() -> None:
    assert clean_text("a\x00b\x1b[31m  c\n d", 100, one_line=True) == "a b [31m c d"
    assert clean_text("line1\n\n\n\nline2\t!", 100, one_line=False) == "line1\n\nline2\t!"
    cut = clean_text("é" * 200, 21, one_line=True)
    assert cut.endswith("...") and len(cut.encode()) <= 21
    assert summary_of("Echoes back the input. More text here.", "x") == "Echoes back the input."
    assert summary_of("First line\nsecond line", "x") == "First line"
    assert summary_of(None, "Upstream tool echo.") == "Upstream tool echo."
    assert summary_of("\x01\x02", "") == "Upstream operation."
    assert len(summary_of("word " * 200, "x").encode()) <= 200
    assert description_of(None, "  ") is None
    terms = search_terms_of(*[f"term{i} " * 20 for i in range(40)], None, "")
    assert len(terms) <= 16 and sum(len(t.encode()) for t in terms) <= 1024


def test_compiled_text_passes_capability_validation() -> None:
    nasty = "Do\x07 things.\r\nWith\x00 \u202e control\tcharacters " + "x" * 40000

    async def handler(ctx: object, subject: object, args: dict[str, object]) -> dict[str, object]:
        return {}

    cap = Capability(
        name="ns.op",
        summary=summary_of(nasty, "op"),
        description=description_of(nasty),
        search_terms=search_terms_of("op\x00name", nasty),
        handler=handler,
        input_shape={"t": "record", "fields": []},
        output_shape={"t": "record", "fields": []},
    )
    _, problems = validate_catalog([cap], [])
    assert problems == []


def test_skip_report_fail_lists_every_reason() -> None:
    report = SkipReport("api", "fail")
    report.skip("a", "r1")
    report.skip("b", "r2")
    with pytest.raises(UpstreamBuildError) as info:
        report.finish()
    assert "- a: r1\n- b: r2" in str(info.value)
    SkipReport("api").finish()  # nothing skipped: nothing to say
