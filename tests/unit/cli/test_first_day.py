"""What a new user meets first: the documented spellings work, and configuration typos
say where they are and what was meant."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from codemode.authz import AuthorizationInput, Subject
from codemode.cli import main

POLICY = """package app

default allow := false

allow if input.subject.id == "alice"
"""


@pytest.fixture(autouse=True)
def _no_codemode_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("CODEMODE_"):
            monkeypatch.delenv(key)


def test_rego_authorizer_from_files_is_the_documented_spelling(tmp_path: Path) -> None:
    """docs/authz.md and reference/authorization.md name ``from_files`` under ``RegoAuthorizer``."""
    from codemode.authz.rego import InvalidPolicy, RegoAuthorizer

    policy = tmp_path / "app.rego"
    policy.write_text(POLICY, encoding="utf-8")
    authorizer = RegoAuthorizer.from_files("data.app.allow", [policy], bounded_inline=False)
    try:
        assert isinstance(authorizer, RegoAuthorizer)
        assert authorizer.decision == "data.app.allow"
        alice = AuthorizationInput(Subject("alice"), "records.entry.get", "records.get", {})
        bob = AuthorizationInput(Subject("bob"), "records.entry.get", "records.get", {})
        assert authorizer.decide(alice) is True
        assert authorizer.decide(bob) is False
    finally:
        authorizer.close()
    with pytest.raises(InvalidPolicy, match="cannot read Rego policy"):
        RegoAuthorizer.from_files("data.app.allow", [tmp_path / "missing.rego"])


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        (
            "[limits]\nmax_excution_time = 2\n",
            "unknown limit 'max_excution_time' in [limits] (did you mean 'max_execution_time'?)",
        ),
        (
            "limits = { max_native_cals = 3 }\n",
            "unknown limit 'max_native_cals' in [limits] (did you mean 'max_native_calls'?)",
        ),
        ("[limits]\nfrobnicate = 1\n", "unknown limit 'frobnicate' in [limits]"),
    ],
)
def test_a_limits_typo_names_the_file_and_the_close_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, problem: str
) -> None:
    bad = tmp_path / "codemode.toml"
    bad.write_text(table, encoding="utf-8")
    assert main(["serve", "--stdio", "--allow-all", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == f"codemode: --config / CODEMODE_CONFIG: {str(bad)!r}: {problem}\n"


def test_a_misspelt_table_name_gets_the_close_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``[limit]`` for ``[limits]`` (found by a new-user run): as close as a
    misspelt top-level key, which gets its suggestion."""
    bad = tmp_path / "codemode.toml"
    bad.write_text("[limit]\nmax_execution_time = 2\n", encoding="utf-8")
    assert main(["serve", "--stdio", "--allow-all", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"codemode: --config / CODEMODE_CONFIG: {str(bad)!r}: unknown setting 'limit' "
        "(did you mean 'limits'?)\n"
    )


def test_a_typo_in_an_upstream_table_names_the_file_and_the_close_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt key of an ``[[openapi]]`` table says where it is and what was meant, as a
    ``[limits]`` typo does (a new-user run got 'Extra inputs are not permitted')."""
    bad = tmp_path / "codemode.toml"
    bad.write_text(
        '[[openapi]]\nname = "todo"\ndocument = "todo.json"\nbase_url = "http://127.0.0.1:9"\nrenam = {}\n',
        encoding="utf-8",
    )
    assert main(["serve", "--stdio", "--allow-all", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"codemode: --config / CODEMODE_CONFIG: {str(bad)!r}: upstreams: ")
    assert "openapi[0].renam: unknown key (did you mean 'rename'?)" in err
    assert err.count("\n") == 1
