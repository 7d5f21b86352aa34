"""``serve --http`` checks its HTTP settings once: ``Settings.http_problems`` ran in the
command and again in the service; now the service checks, before it binds a port."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from codemode.cli.main import main
from codemode.startup.config import Settings


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Settings]]:
    """Every call of ``Settings.http_problems``, without a CODEMODE_* variable of the environment."""
    for key in list(os.environ):
        if key.startswith("CODEMODE_"):
            monkeypatch.delenv(key)
    calls: list[Settings] = []
    original = Settings.http_problems

    def counted(self: Settings) -> list[str]:
        calls.append(self)
        return original(self)

    monkeypatch.setattr(Settings, "http_problems", counted)
    yield calls


def _serve(tmp_path: Path, *flags: str) -> int:
    tokens = tmp_path / "tokens.json"
    tokens.write_text("{}")
    return main(
        [
            "serve",
            "--http",
            "--allow-all",
            "--token-file",
            str(tokens),
            "--data-dir",
            str(tmp_path / "data"),
            *flags,
        ]
    )


def test_a_start_that_fails_later_checked_the_settings_once(
    tmp_path: Path, checks: list[Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ("--pack", "no_such_pack_mod:pack", "--port", "0", "--metrics-port", "0", "--health-port", "0")
    assert _serve(tmp_path, *flags) == 2
    assert capsys.readouterr().err.startswith(
        "codemode: --pack / CODEMODE_PACKS: pack 'no_such_pack_mod:pack'"
    )
    assert len(checks) == 1


def test_a_settings_problem_is_said_before_any_port_is_bound(
    tmp_path: Path, checks: list[Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as holder:  # the port is in use: binding first would say that instead
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = str(holder.getsockname()[1])
        assert _serve(tmp_path, "--port", port, "--metrics-port", port, "--health-port", "0") == 2
    err = capsys.readouterr().err
    assert (
        err == "codemode: --metrics-port / CODEMODE_METRICS_PORT: must differ from --port / CODEMODE_PORT\n"
    )
    assert len(checks) == 1
