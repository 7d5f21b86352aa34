"""Coverage of published OpenAPI documents: every operation becomes a capability or
is skipped with its reason, at least 95 % of the classic documents' operations together convert,
and the table in docs/packs.md is what this run measures (``python -m
tests.support.openapi_coverage`` rewrites it)."""

from __future__ import annotations

import pytest

from tests.support import openapi_coverage as coverage

pytestmark = pytest.mark.slow


# The first run downloads three npm packages (up to 300 s each) before the test itself.
@pytest.mark.timeout(900)
def test_published_documents_convert_and_the_table_is_current() -> None:
    rows = coverage.measure_all()
    generated = coverage.table(rows)
    print("\n" + generated)
    for row in rows:
        # nothing is lost silently: every operation of the document is converted or skipped
        assert row.converted + sum(row.skipped.values()) == row.operations, row.document.title
        assert all(reason.strip() for reason in row.skipped), row.document.title
    classic = [r for r in rows if r.document.classic]
    assert len(classic) >= 5
    assert any(r.document.file.endswith("3.0/json/petstore.json") for r in classic)
    converted = sum(r.converted for r in classic)
    operations = sum(r.operations for r in classic)
    assert converted >= 0.95 * operations, f"{converted} of {operations}"
    assert generated == coverage.documented(), (
        "docs/packs.md's coverage table is stale: run python -m tests.support.openapi_coverage"
    )


@pytest.mark.timeout(900)
def test_the_docs_stapi_example(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/packs.md's STAPI table (no operationIds, a query-string key) gives what it says."""
    import re
    import tomllib

    import codemode
    from codemode import authz
    from codemode_capabilities.openapi import openapi_pack

    text = coverage.DOCS.read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```toml\n(.*?)```", text, re.S) if 'name = "stapi"' in b)
    table = tomllib.loads(block)["openapi"][0]
    stapi = next(d for d in coverage.DOCUMENTS if d.file.endswith("star-trek.json"))
    table["document"] = str(coverage.location(stapi))
    monkeypatch.setenv(table["auth_value_from_env"], "stapi-key")
    pack = openapi_pack([table])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*pack.capabilities()).build()
    signatures = {c.id: c.signature for c in server.capabilities}
    assert signatures["openapi:stapi:GET:/character"] == "stapi.get_character(*, uid: str)"
    assert signatures["openapi:stapi:GET:/character/search"] == (
        "stapi.get_character_search(*, pageNumber: int | None, pageSize: int | None)"
    )
    assert signatures["openapi:stapi:POST:/character/search"].startswith(
        "stapi.post_character_search(*, pageNumber: int | None, pageSize: int | None, sort: str | None,"
        " body: {name: str | None, gender: str | None, "
    )
    assert len(signatures) == 3
    for signature in signatures.values():
        assert "apiKey" not in signature  # auth_query: set by the host, never by a program
