"""The compile loop of the two upstream packs is written once, in the pack-author API
(``codemode.packs.compile_each``): an item whose schema cannot be represented is skipped with its
reason, an output field left out is reported, a capability whose answers would not fit is skipped
(never cut), and the report is finished."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest

from codemode import Capability
from codemode.packs import AnswerBounds, SkipReport, Unsupported
from codemode.packs import upstream as rules
from codemode_capabilities.mcp.upstream import UpstreamMCPConfig, UpstreamMCPPack, _compile_tools
from codemode_capabilities.openapi.calls import HTTP
from codemode_capabilities.openapi.config import OpenAPIConfig
from codemode_capabilities.openapi.pack import compile_document

OUT: dict[str, Any] = {"t": "record", "fields": [{"name": "text", "shape": {"t": "str"}}]}


async def _handler(ctx: Any, subject: Any, args: dict[str, Any]) -> dict[str, Any]:
    return {"text": ""}


def _cap(name: str, description: str | None = None) -> Capability:
    return Capability(
        id=f"t:{name}",
        name=f"t.{name}",
        summary="A tool.",
        description=description,
        handler=_handler,
        input_shape={"t": "record", "fields": []},
        output_shape=OUT,
    )


def test_the_loop() -> None:
    from codemode.packs import compile_each

    def build(name: str, omissions: list[Unsupported]) -> Capability:
        if name == "odd":
            raise Unsupported("/x", "oneOf is not supported")
        if name == "partial":
            omissions.append(Unsupported("(output)/blob", "binary is not supported"))
        return _cap(name, "words " * 400 + "end." if name == "wordy" else None)  # 2,404 bytes

    report = SkipReport("up")
    caps = compile_each(
        ["fine", "odd", "partial", "wordy"],
        lambda n: n,
        build,
        report,
        AnswerBounds(max_describe_response_bytes=1024),
    )
    assert [c.name for c in caps] == ["t.fine", "t.partial"]
    assert report.converted == ["fine", "partial"]
    assert [item for item, _ in report.skipped] == ["odd", "wordy"]
    assert report.skipped[0][1] == "/x: oneOf is not supported"
    assert "over max_describe_response_bytes" in report.skipped[1][1]
    assert report.omitted == [("partial", "(output)/blob: binary is not supported")]


def test_fail_raises_at_the_end() -> None:
    from codemode.packs import UpstreamBuildError, compile_each

    def build(name: str, omissions: list[Unsupported]) -> Capability:
        raise Unsupported("", "no")

    with pytest.raises(UpstreamBuildError, match="2 tool"):
        compile_each(["a", "b"], lambda n: n, build, SkipReport("up", "fail"))


@pytest.fixture
def nothing_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one loop's size rule, made to refuse every capability."""
    monkeypatch.setattr(rules, "answer_problem", lambda cap, bounds: "too large (test)")


def test_the_mcp_pack_compiles_through_it(nothing_fits: None) -> None:
    config = UpstreamMCPConfig(name="up", command="unused")
    tools = [types.Tool(name=n, input_schema={"type": "object"}) for n in ("a", "b")]
    caps, report = _compile_tools(UpstreamMCPPack([config]), config, tools)
    assert caps == []
    assert report.skipped == [("a", "too large (test)"), ("b", "too large (test)")]


def test_the_openapi_pack_compiles_through_it(nothing_fits: None) -> None:
    config = OpenAPIConfig(name="api", document="unused.json", base_url="http://127.0.0.1:9")
    doc = {
        "openapi": "3.1.0",
        "paths": {
            "/a": {"get": {"operationId": "getA", "responses": {"200": {"description": "ok"}}}},
            "/b": {"get": {"operationId": "getB", "responses": {"200": {"description": "ok"}}}},
        },
    }
    caps, report = compile_document(config, doc, HTTP(config))
    assert caps == []
    assert report.skipped == [("getA", "too large (test)"), ("getB", "too large (test)")]
