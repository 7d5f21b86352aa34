"""One command error for the exit-status ladders: ``image audit``, ``quotas tune``,
``bench`` and ``token`` raise :class:`~codemode.common.command.CommandError` with their exit status
and one line, and the command prints it once, as ``codemode <command>: <line>``."""

from __future__ import annotations

from pathlib import Path

import pytest

from codemode.cli.main import build_parser, main


def _cases(tmp_path: Path) -> list[tuple[list[str], int, str]]:
    tokens = tmp_path / "codemode.tokens"
    missing = tmp_path / "missing.tokens"
    return [
        (["bench", "--n", "0"], 2, "codemode bench: --n must be positive"),
        (
            ["quotas", "tune", "--program", __file__, "--runtime", "process", "--runs", "0"],
            2,
            "codemode quotas tune: --runs must be positive and --warmup not negative",
        ),
        (
            ["image", "audit", "img:1", "--probe-timeout", "0"],
            2,
            "codemode image audit: --probe-timeout must be positive",
        ),
        (
            ["token", "revoke", "bob", "--token-file", str(tokens)],
            1,
            f"codemode token: no token of 'bob' in {tokens}",
        ),
        (
            ["token", "list", "--token-file", str(missing)],
            2,
            f"codemode token: --token-file / CODEMODE_TOKEN_FILE: token file {str(missing)!r} does not exist",
        ),
    ]


def _with_a_token_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "new", "alice", "--token-file", str(tmp_path / "codemode.tokens")]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("case", range(5), ids=["bench", "quotas-tune", "image-audit", "revoke", "list"])
def test_a_command_error_is_one_line_with_its_status(
    case: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CODEMODE_TOKEN_FILE", raising=False)
    _with_a_token_file(tmp_path, capsys)
    argv, status, line = _cases(tmp_path)[case]
    assert main(argv) == status
    captured = capsys.readouterr()
    assert captured.err == line + "\n"
    assert captured.out == ""


@pytest.mark.parametrize("case", range(5), ids=["bench", "quotas-tune", "image-audit", "revoke", "list"])
def test_the_tools_raise_it_and_print_nothing_themselves(
    case: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from codemode.cli.token import run_token
    from codemode.common.command import CommandError
    from codemode.ops import bench, image_audit, quotas

    monkeypatch.delenv("CODEMODE_TOKEN_FILE", raising=False)
    _with_a_token_file(tmp_path, capsys)
    argv, status, line = _cases(tmp_path)[case]
    run = {"bench": bench.run, "quotas": quotas.run, "image": image_audit.run, "token": run_token}[argv[0]]
    with pytest.raises(CommandError) as caught:
        run(build_parser().parse_args(argv))
    assert caught.value.status == status
    assert line.endswith(": " + str(caught.value))
    assert capsys.readouterr().err == ""


def test_an_interrupt_is_status_130_without_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from codemode.ops import bench

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run", interrupted)
    assert main(["bench", "--n", "1"]) == 130
    assert capsys.readouterr().err == ""
