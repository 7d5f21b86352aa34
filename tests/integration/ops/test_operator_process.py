"""``codemode quotas tune --runtime process``: process workers measured with psutil (and their own
``VmPeak``), and process limits that then run the program."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from codemode import cli
from codemode.startup.config import parse_size

pytestmark = [pytest.mark.timeout(300)]

PROGRAM = "def main():\n    xs = [str(i) * 20 for i in range(50000)]\n    return len(xs)\n"


def test_quotas_tune_measures_process_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    me = psutil.Process()
    # Processes an earlier test left are not this one's: only what quotas tune starts must be gone.
    earlier = {c.pid for c in me.children(recursive=True)}
    program = tmp_path / "job.star"
    program.write_text(PROGRAM)
    argv = ["quotas", "tune", "--program", str(program), "--runtime", "process", "--json", "--runs", "3"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["runtime"] == "process" and len(report["samples"]) == 3
    for s in report["samples"]:
        assert s["outcome"] == "ok" and s["counters_final"] is True, s
        # VmHWM (peak RSS) below VmPeak (address space); the list of 50,000 strings is in both.
        assert 8 * 1024 * 1024 < s["memory_peak_bytes"] < s["address_space_peak_bytes"]
        assert s["fds_peak"] >= 3 and s["threads_peak"] >= 1 and s["cpu_s"] > 0
    rec = report["recommendation"]
    settings = rec["settings"]
    space = max(s["address_space_peak_bytes"] for s in report["samples"])
    assert parse_size(settings["process_memory"]) >= space * 1.5
    assert settings["process_open_files"] >= 16 and settings["process_max_processes"] >= 8
    assert settings["process_cpu_seconds"] >= 1
    flags = rec["serve_flags"]
    assert flags[:2] == ["--runtime", "process"]
    assert flags[flags.index("--process-memory") + 1] == settings["process_memory"]

    # The recommended limits run the program; the measurement limits are really applied (a worker
    # cannot even start in 32 MiB of address space).
    again = ["quotas", "tune", "--program", str(program), "--runtime", "process", "--json", "--runs", "1"]
    again += ["--warmup", "0", *flags[2:]]
    assert cli.main(again) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["samples"][0]["outcome"] == "ok"
    tight = [*again[: -len(flags[2:])], "--process-memory", "32m"]
    assert cli.main(tight) == 1
    (failed,) = json.loads(capsys.readouterr().out)["samples"]
    assert failed["outcome"] != "ok"
    left = [c for c in me.children(recursive=True) if c.pid not in earlier]
    assert not [c for c in left if c.is_running() and c.status() != "zombie"]
