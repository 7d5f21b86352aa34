"""One "did you mean": a mistyped flag, a misspelt settings key and a misspelt key of an
``[[openapi]]`` table are answered by the same rule, ``codemode.common.did_you_mean`` (the packs
reach it as ``codemode.packs.did_you_mean``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from codemode.cli.main import main
from codemode.common import did_you_mean as rule


def _three_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What the flag ``--alow-all``, the key ``alow_all`` and the table key ``namespce`` are told."""
    said = []
    try:
        main(["serve", "--stdio", "--alow-all"])
    except SystemExit as exc:
        assert exc.code == 2
    said.append(capsys.readouterr().err)
    for name, text in (
        ("setting.toml", "alow_all = true\n"),
        (
            "table.toml",
            '[[openapi]]\nname = "todo"\ndocument = "todo.json"\nbase_url = "http://127.0.0.1:9"\n'
            'namespce = "todo"\n',
        ),
    ):
        config = tmp_path / name
        config.write_text(text, encoding="utf-8")
        assert main(["serve", "--stdio", "--allow-all", "--config", str(config)]) == 2
        said.append(capsys.readouterr().err)
    return said


def test_three_paths_one_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    flag, setting, table = _three_paths(tmp_path, capsys)
    assert "--alow-all: did you mean --allow-all?" in flag
    assert "unknown setting 'alow_all' (did you mean 'allow_all'?)" in setting
    assert "openapi[0].namespce: unknown key (did you mean 'namespace'?)" in table
    monkeypatch.setattr(rule, "CUTOFF", 1.0)  # the one rule, made to suggest nothing
    said = _three_paths(tmp_path, capsys)
    assert [s.count("did you mean") for s in said] == [0, 0, 0], said


def test_the_hint() -> None:
    assert rule.did_you_mean("pol", ["port", "pool"]) == " (did you mean 'pool'?)"
    assert rule.did_you_mean("zzz", ["port", "pool"]) == ""
    assert rule.closest("--allow-al", ["--allow-all", "--pool"]) == "--allow-all"
    assert rule.closest("renam", ["rename"], cutoff=0.99) is None


def test_the_packs_reach_it() -> None:
    from codemode import packs

    assert packs.did_you_mean is rule.did_you_mean
