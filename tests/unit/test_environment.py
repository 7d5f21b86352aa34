"""A missing test requirement is a visible skip locally and a failure under CI=true."""

from __future__ import annotations

import pytest

from tests.support import environment


def test_missing_requirement_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="a Docker engine: not reachable"):
        environment.unavailable("a Docker engine", "not reachable")


def test_missing_requirement_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="a Docker engine is required in CI: not reachable"):
        environment.unavailable("a Docker engine", "not reachable")


def test_the_suite_keeps_out_of_the_real_home() -> None:
    from pathlib import Path

    from codemode.startup.config import default_data_dir, default_token_file

    for path in (default_data_dir(), default_token_file()):
        assert not path.is_relative_to(Path.home()), path


def test_the_header_says_which_engines_are_used() -> None:
    for line in (environment.docker_found(), environment.cluster_found()):
        assert line.startswith("using ") or "skipped with the reason" in line or "fail (CI=true)" in line
