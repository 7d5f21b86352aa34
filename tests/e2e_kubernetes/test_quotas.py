"""``codemode quotas tune --runtime kubernetes`` on the real cluster: each worker pod's own cgroup
counters, read after its program finished, and pod sizing flags that then run the program."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codemode import cli
from tests.support.cluster import KUBECONFIG, WORKERS, worker_pods

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow, pytest.mark.timeout(300)]

PROGRAM = "def main():\n    xs = [str(i) * 20 for i in range(20000)]\n    return len(xs)\n"


def test_quotas_tune_measures_worker_pods(
    cluster: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = tmp_path / "job.star"
    program.write_text(PROGRAM)
    argv = ["quotas", "tune", "--program", str(program), "--runtime", "kubernetes", "--json", "--runs", "3"]
    argv += ["--kubernetes-kubeconfig", KUBECONFIG, "--kubernetes-namespace", WORKERS, "--burst", "2"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["runtime"] == "kubernetes" and len(report["samples"]) == 3
    for s in report["samples"]:
        # The container's cgroup high-water mark, read by the held worker after its final frame.
        assert s["outcome"] == "ok" and s["counters_final"] is True, s
        assert s["memory_method"] == "cgroup high-water mark"
        assert 4 * 1024 * 1024 < s["memory_peak_bytes"] < 1024**3
        assert 0 < s["cpu_s"] < s["execute_s"] * 4 and 0 < s["spawn_s"] < s["execute_s"]
    rec = report["recommendation"]
    settings = rec["settings"]
    assert set(settings) == {"kubernetes_memory", "kubernetes_cpu", "kubernetes_cpu_request"}
    peak = max(s["memory_peak_bytes"] for s in report["samples"])
    assert int(settings["kubernetes_memory"].removesuffix("Mi")) * 1024 * 1024 >= peak * 1.5
    assert int(settings["kubernetes_cpu_request"].removesuffix("m")) <= int(
        settings["kubernetes_cpu"].removesuffix("m")
    )
    # One deadline, with or without a pool: it counts the pod start, and the burst's two pods.
    assert report["burst"]["outcomes"] == {"ok": 2}
    assert rec["max_execution_time"] >= max(report["burst"]["seconds"]) * 2
    assert rec["max_execution_time"] >= max(s["execute_s"] for s in report["samples"]) * 2
    flags = rec["serve_flags"]
    assert flags[:2] == ["--runtime", "kubernetes"] and "--kubernetes-memory" in flags

    # The recommendation runs the program: measure again with exactly the recommended sizing.
    again = [*argv[:-6], "--runs", "1", "--warmup", "0", "--burst", "0", *argv[-6:-2]]
    for name in ("kubernetes_memory", "kubernetes_cpu", "kubernetes_cpu_request"):
        again += ["--" + name.replace("_", "-"), settings[name]]
    again += ["--max-execution-time", str(rec["max_execution_time"])]
    assert cli.main(again) == 0, capsys.readouterr().err
    (sample,) = json.loads(capsys.readouterr().out)["samples"]
    assert sample["outcome"] == "ok"
    assert not [p.metadata.name for p in worker_pods() if p.metadata.deletion_timestamp is None]
