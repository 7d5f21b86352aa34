"""The operator tools tell the truth: a reader that closes the pipe early ends the
command quietly, ``quotas tune`` shows why a run failed (the approved detail an execute's client
gets) and says which runtime it measures and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from codemode import cli

pytestmark = [pytest.mark.timeout(300)]

TINY = "def main():\n    return 1\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["image", "audit", "--json", "codemode-test-no-such-image:pipe"],
        ["quotas", "tune", "--program", "{program}", "--runtime", "process", "--json", "--runs", "1"],
        ["bench", "--runtime", "process", "--n", "2", "--pool", "0", "--clients", "0", "--json"],
    ],
    ids=["image-audit", "quotas-tune", "bench"],
)
def test_a_pipe_closed_early_ends_the_command_quietly(argv: list[str], tmp_path: Path) -> None:
    """``codemode ... --json | head``: the reader is gone before the command writes (a real pipe,
    its read end closed at once); the command ends with no traceback and SIGPIPE's status."""
    program = tmp_path / "tiny.star"
    program.write_text(TINY)
    argv = [a.replace("{program}", str(program)) for a in argv]
    proc = subprocess.Popen(
        [sys.executable, "-m", "codemode.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # as `head` does once it has its lines
    with proc.stderr:
        err = proc.stderr.read().decode()
    code = proc.wait(timeout=240)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert code == 141, (code, err)


def test_quotas_tune_shows_why_a_run_failed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A program calling a capability no ``--pack`` provides: the table and the JSON carry the
    client's approved detail, not the bare 'invalid program'."""
    program = tmp_path / "calls.star"
    program.write_text("def main():\n    return todo.list_todos()\n")
    argv = ["quotas", "tune", "--program", str(program), "--runtime", "process", "--runs", "1"]
    assert cli.main([*argv, "--json", "--warmup", "0"]) == 1
    (sample,) = json.loads(capsys.readouterr().out)["samples"]
    assert sample["outcome"] == "invalid program", sample
    assert sample["detail"].startswith("invalid program: <codemode>:2:"), sample
    assert "todo" in sample["detail"], sample
    assert cli.main([*argv, "--warmup", "0"]) == 1
    out = capsys.readouterr().out
    assert sample["detail"] in out, out


def test_quotas_tune_defaults_to_the_process_runtime_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``serve`` and ``bench`` default to ``--runtime process``; so does ``quotas tune``, and its
    first line says which runtime it measures and why."""
    program = tmp_path / "tiny.star"
    program.write_text(TINY)
    assert cli.main(["quotas", "tune", "--program", str(program), "--runs", "1", "--warmup", "0"]) == 0
    captured = capsys.readouterr()
    assert "on process workers of" in captured.out, captured.out
    assert "--runtime process (the default, as for serve and bench" in captured.err, captured.err
    args = cli.build_parser().parse_args(["bench"])
    assert args.runtime == "process"
