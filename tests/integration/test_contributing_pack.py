"""The pack example in CONTRIBUTING.md works as written: saved as weather.py, loaded by file path
the way ``--pack ./weather.py:pack`` loads it, searched, described and called from a program."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import codemode
from codemode import authz
from codemode.packs import load_pack

CONTRIBUTING = Path(__file__).resolve().parents[2] / "CONTRIBUTING.md"


def pack_example() -> str:
    section = re.search(
        r"^## Add a capability pack[ \t]*\n(.*?)(?=^## |\Z)", CONTRIBUTING.read_text(), re.M | re.S
    )
    assert section, 'CONTRIBUTING.md has no "## Add a capability pack" section'
    block = re.search(r"^```python[ \t]*\n(.*?)^```", section.group(1), re.M | re.S)
    assert block, "the pack section has no ```python block"
    assert block.group(1).startswith("# weather.py\n"), "the example names the file it is saved as"
    return block.group(1)


@pytest.mark.timeout(120)
async def test_pack_example_loads_and_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "weather.py").write_text(pack_example())
    monkeypatch.chdir(tmp_path)
    capabilities = load_pack("./weather.py:pack")
    assert [c.name for c in capabilities] == ["weather.forecast"]

    builder = codemode.Builder(authorizer=authz.allow_all())
    builder.register(*capabilities)
    server = builder.build()
    try:
        hits = server.search("weather").to_dict()["results"]
        assert [h["name"] for h in hits] == ["weather.forecast"]
        assert server.describe("weather.forecast").to_dict()["signature"] == (
            "weather.forecast(*, city: str, days: int | None)"
        )
        value = await server.execute(
            "def main():\n    return weather.forecast(city='Oslo', days=3)\n", subject=authz.Subject("alice")
        )
        assert value == {"city": "Oslo", "summary": "sunny for 3 day(s)"}
    finally:
        await server.aclose()
