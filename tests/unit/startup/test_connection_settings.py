"""The per-subject connection bound's setting: always less than the connection limit."""

from __future__ import annotations

import pytest

from codemode.service.app import subject_connection_limit
from codemode.startup.config import ConfigError, Settings


def _settings(**kwargs: object) -> Settings:
    return Settings(allow_all=True, **kwargs)  # type: ignore[arg-type]


def test_the_default_is_four_times_the_open_requests_of_a_subject_at_most_half_the_limit() -> None:
    assert subject_connection_limit(_settings(max_connections=1000)) == 64
    assert subject_connection_limit(_settings(max_connections=1000, max_open_requests_per_subject=2)) == 8
    assert subject_connection_limit(_settings(max_connections=10)) == 5
    assert subject_connection_limit(_settings(max_connections=1)) == 1


def test_a_bound_not_below_the_connection_limit_is_refused_naming_both_settings() -> None:
    problems = _settings(max_connections=10, max_connections_per_subject=10).http_problems()
    assert any(
        p.startswith(
            "--max-connections-per-subject / CODEMODE_MAX_CONNECTIONS_PER_SUBJECT: must be less than"
        )
        and "--max-connections / CODEMODE_MAX_CONNECTIONS" in p
        for p in problems
    )
    assert not any(
        "per-subject" in p
        for p in _settings(max_connections=10, max_connections_per_subject=9).http_problems()
    )
    # max_connections unset: its default (from the descriptor limit) is known when the app is built.
    with pytest.raises(
        ConfigError, match="--max-connections-per-subject / CODEMODE_MAX_CONNECTIONS_PER_SUBJECT"
    ):
        subject_connection_limit(_settings(max_connections_per_subject=1_000_000))
