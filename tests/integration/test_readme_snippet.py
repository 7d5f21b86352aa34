"""The README's "Library use" snippet runs as written and gives the results it implies.

The first ```python block under the "## Library use" heading is taken from README.md verbatim. It uses
top-level ``await``, so it is compiled with ``ast.PyCF_ALLOW_TOP_LEVEL_AWAIT`` and the resulting
coroutine is run with ``asyncio.run``. The only change made to it: the value of each top-level
expression statement (``server.search(...)``, ``await server.execute(...)``, ...) is recorded instead
of discarded, so the test can check what a reader would see in a REPL.
"""

from __future__ import annotations

import ast
import asyncio
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
RECORD = "__readme_values__"


def library_snippet(text: str) -> str:
    """The first ```python block after the "## Library use" heading (before the next ## heading)."""
    section = re.search(r"^## Library use[ \t]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, 'README.md has no "## Library use" section'
    block = re.search(r"^```python[ \t]*\n(.*?)^```", section.group(1), re.M | re.S)
    assert block, 'the "## Library use" section has no ```python block'
    return block.group(1)


def run_snippet(source: str) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """Run ``source`` at module level; return its namespace and (expression text, value) pairs."""
    tree = ast.parse(source, filename="README.md")
    texts: list[str] = []
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.Expr):
            texts.append(ast.get_source_segment(source, node) or "")
            call = ast.Call(
                func=ast.Attribute(ast.Name(RECORD, ast.Load()), "append", ast.Load()),
                args=[node.value],
                keywords=[],
            )
            tree.body[i] = ast.copy_location(ast.Expr(call), node)
    ast.fix_missing_locations(tree)
    # dont_inherit: this test module's `from __future__ import annotations` must not leak into it.
    code = compile(
        tree, "README.md (Library use)", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
    )
    # A real module, as a reader's script would be (dataclasses and type hints look classes up in it).
    module = types.ModuleType("readme_snippet")
    namespace: dict[str, Any] = module.__dict__
    namespace[RECORD] = []

    async def main() -> None:
        result = eval(code, namespace)  # a coroutine when the snippet awaits at top level
        if asyncio.iscoroutine(result):
            await result

    sys.modules[module.__name__] = module
    try:
        asyncio.run(main())
    finally:
        del sys.modules[module.__name__]
    return namespace, list(zip(texts, namespace[RECORD], strict=True))


def value_of(values: list[tuple[str, Any]], prefix: str) -> Any:
    found = [value for text, value in values if text.startswith(prefix)]
    assert len(found) == 1, f"expected one top-level `{prefix}...` in the snippet, got {len(found)}"
    return found[0]


def test_snippet_is_found() -> None:
    snippet = library_snippet(README.read_text(encoding="utf-8"))
    assert "codemode.Builder" in snippet and "await server.execute(" in snippet


@pytest.mark.timeout(120)
def test_library_snippet_runs_as_written() -> None:
    namespace, values = run_snippet(library_snippet(README.read_text(encoding="utf-8")))

    search = value_of(values, "server.search(")
    names = [hit["name"] for hit in search["results"]]
    assert names == ["records.lookup"], search
    assert search["truncated"] is False

    describe = value_of(values, "server.describe(")
    assert describe["name"] == "records.lookup"
    assert describe["signature"] == "records.lookup(*, key: str, limit: int | None)"
    assert [(f["name"], f["required"]) for f in describe["input"]] == [("key", True), ("limit", False)]

    # The handler answers count=len(key) for key='a'; the value crossed worker and host intact.
    assert value_of(values, "await server.execute(") == {"key": "a", "count": 1}

    # The snippet ends by closing the server (the names it defines are the ones the prose uses).
    assert value_of(values, "await server.aclose(") is None
    assert {"builder", "server", "lookup", "LookupInput", "LookupOutput"} <= set(namespace)


def test_snippet_extraction_takes_only_that_section() -> None:
    text = (
        "# t\n\n## Other\n\n```python\nwrong = 1\n```\n\n## Library use\n\nIntro.\n\n"
        "```sh\nnot python\n```\n\n```python\nright = 1\n```\n\n```python\nsecond = 1\n```\n\n## Next\n"
    )
    assert library_snippet(text) == "right = 1\n"
    with pytest.raises(AssertionError, match="no ```python block"):
        library_snippet("## Library use\n\ntext only\n\n## Next\n```python\nx = 1\n```\n")
