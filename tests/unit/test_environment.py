"""A missing test requirement is a visible skip locally and a failure under CI=true."""

from __future__ import annotations

import pytest

from tests import environment


def test_missing_requirement_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="a Docker engine: not reachable"):
        environment.unavailable("a Docker engine", "not reachable")


def test_missing_requirement_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="a Docker engine is required in CI: not reachable"):
        environment.unavailable("a Docker engine", "not reachable")
