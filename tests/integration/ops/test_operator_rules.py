"""Operators' tools without Docker: the audit rules, the quota arithmetic, ``codemode bench``, --help."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from codemode import cli
from codemode.ops.image_rules import Check, FsEntry, audit_config, audit_filesystem
from codemode.ops.quota_probes import REPORT_PREFIX, parse_report
from codemode.ops.quotas import MiB, RunSample, recommend
from codemode_worker import PROTOCOL_VERSION

GOOD_CONFIG: dict[str, Any] = {
    "User": "65532:65532",
    "Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1"],
    "Entrypoint": ["python3", "-I", "-m", "codemode_worker"],
    "Cmd": None,
    "Labels": {"io.codemode.protocol-version": str(PROTOCOL_VERSION), "io.codemode.role": "worker"},
}


def statuses(checks: list[Check]) -> dict[str, str]:
    return {c.name: c.status for c in checks}


def by_name(checks: list[Check], name: str) -> Check:
    (check,) = [c for c in checks if c.name == name]
    return check


# ------------------------------------------------------------------------------------------ config


def test_good_config_passes() -> None:
    checks = audit_config(GOOD_CONFIG)
    assert set(statuses(checks).values()) == {"PASS"}, [(c.name, c.status, c.detail) for c in checks]


@pytest.mark.parametrize(
    ("user", "status"),
    [
        ("", "FAIL"),
        ("0", "FAIL"),
        ("0:0", "FAIL"),
        ("root", "FAIL"),
        ("worker", "FAIL"),
        ("65532:staff", "FAIL"),
        ("65532", "WARN"),
        ("65532:0", "WARN"),
        ("1000:1000", "PASS"),
    ],
)
def test_user_rule(user: str, status: str) -> None:
    assert by_name(audit_config({**GOOD_CONFIG, "User": user}), "user").status == status


@pytest.mark.parametrize(
    ("entrypoint", "cmd", "status"),
    [
        (["python3", "-I", "-m", "codemode_worker"], None, "PASS"),
        (["/usr/local/bin/python3.11", "-I", "-B", "-m", "codemode_worker"], [], "PASS"),
        (["python3", "-IS", "-X", "frozen_modules=on", "-m", "codemode_worker"], None, "PASS"),
        (None, ["python3", "-I", "-m", "codemode_worker"], "WARN"),
        (["python3", "-m", "codemode_worker"], None, "FAIL"),  # not isolated
        (["python3", "-I", "-m", "codemode_worker"], ["--debug"], "FAIL"),
        (["python3", "-I", "-m", "codemode_worker.testing_entry"], None, "FAIL"),
        (["/bin/sh", "-c", "python3 -I -m codemode_worker"], None, "FAIL"),
        (["python3", "-I", "-c", "import codemode_worker"], None, "FAIL"),
        (["node", "worker.js"], None, "FAIL"),
        (None, None, "FAIL"),
    ],
)
def test_entrypoint_rule(entrypoint: list[str] | None, cmd: list[str] | None, status: str) -> None:
    checks = audit_config({**GOOD_CONFIG, "Entrypoint": entrypoint, "Cmd": cmd})
    assert by_name(checks, "entrypoint").status == status


def test_labels_env_ports_volumes_healthcheck() -> None:
    bad = {
        **GOOD_CONFIG,
        "Labels": {"io.codemode.protocol-version": "0"},
        "Env": [*GOOD_CONFIG["Env"], "API_TOKEN=hunter2", "db_password=x", "EDITOR=vi"],
        "ExposedPorts": {"8080/tcp": {}},
        "Volumes": {"/data": {}},
        "Healthcheck": {"Test": ["CMD-SHELL", "true"]},
    }
    checks = audit_config(bad)
    got = statuses(checks)
    assert got["protocol label"] == "FAIL" and got["role label"] == "FAIL"
    assert got["exposed ports"] == "FAIL" and got["volumes"] == "FAIL"
    assert got["healthcheck"] == "WARN"
    env = by_name(checks, "environment")
    assert env.status == "FAIL"
    assert any("API_TOKEN" in f for f in env.findings) and any("db_password" in f for f in env.findings)
    assert any("EDITOR" in f for f in env.findings)
    assert "hunter2" not in json.dumps([c.to_dict() for c in checks])  # values never shown
    only_odd = audit_config({**GOOD_CONFIG, "Env": ["PATH=/bin", "EDITOR=vi"]})
    assert by_name(only_odd, "environment").status == "WARN"


# ------------------------------------------------------------------------------------------ file system


def fs(*extra: FsEntry) -> list[FsEntry]:
    return [
        FsEntry("/", "dir", 0o755),
        FsEntry("/bin", "symlink", 0o777, linkname="usr/bin"),
        FsEntry("/usr", "dir", 0o755),
        FsEntry("/usr/bin", "dir", 0o755),
        FsEntry("/usr/bin/python3", "file", 0o755),
        FsEntry("/tmp", "dir", 0o1777),
        FsEntry("/var/tmp", "dir", 0o1777),
        FsEntry("/dev/null", "char", 0o666),
        *extra,
    ]


def test_clean_filesystem() -> None:
    checks = audit_filesystem(fs())
    assert set(statuses(checks).values()) == {"PASS"}
    assert "/tmp" in by_name(checks, "world-writable paths").detail


def test_filesystem_findings() -> None:
    checks = audit_filesystem(
        fs(
            FsEntry("/usr/bin/su", "file", 0o4755),
            FsEntry("/usr/bin/wall", "file", 0o2755),
            FsEntry("/var/mail", "dir", 0o2775),  # setgid directory: not a privilege
            FsEntry("/usr/bin/ping", "file", 0o755, file_caps=True),
            FsEntry("/srv/drop", "dir", 0o777),
            FsEntry("/etc/motd", "file", 0o666),
            FsEntry("/opt/mem", "char", 0o600),
            FsEntry("/opt/app", "dir", 0o755, uid=65532),
            FsEntry("/usr/bin/dash", "file", 0o755),
            FsEntry("/usr/bin/sh", "symlink", 0o777, linkname="dash"),
        ),
        image_uid=65532,
    )
    got = statuses(checks)
    assert got["setuid/setgid files"] == "FAIL"
    suid = by_name(checks, "setuid/setgid files").findings
    assert (
        len(suid) == 2 and any("/usr/bin/su" in f for f in suid) and not any("/var/mail" in f for f in suid)
    )
    assert got["file capabilities"] == "FAIL"
    ww = by_name(checks, "world-writable paths").findings
    assert got["world-writable paths"] == "FAIL" and len(ww) == 2
    assert got["device files"] == "FAIL"
    assert got["owned by the worker user"] == "WARN"
    shell = by_name(checks, "shell")
    assert shell.status == "FAIL" and "/usr/bin/dash" in shell.findings  # /bin/sh -> /usr/bin/sh -> dash
    assert "sh" in shell.detail and "dash" in shell.detail


SLIM_BUT = (
    FsEntry("/usr/bin/dpkg", "file", 0o755),
    FsEntry("/usr/bin/dpkg-query", "file", 0o755),
    FsEntry("/var/lib/dpkg", "dir", 0o755),
    FsEntry("/usr/bin/apt-get", "file", 0o755),
    FsEntry("/usr/local/bin/pip3", "file", 0o755),
    FsEntry("/usr/local/lib/python3.11/site-packages/pip", "dir", 0o755),
    FsEntry("/usr/lib/python3.11/ensurepip", "dir", 0o755),
    FsEntry("/opt/codemode/site/codemode_worker/testing_entry.py", "file", 0o644),
    FsEntry("/opt/codemode/site/codemode_worker/__pycache__/testing_entry.cpython-311.pyc", "file", 0o644),
    FsEntry("/usr/bin/bash", "file", 0o755),
)


def test_shells_package_managers_and_test_entries_fail() -> None:
    checks = audit_filesystem(fs(*SLIM_BUT))
    got = statuses(checks)
    assert got["shell"] == "FAIL" and by_name(checks, "shell").findings == ["/usr/bin/bash"]
    managers = by_name(checks, "package managers")
    assert (
        managers.status == "FAIL" and "dpkg, apt, pip" in managers.detail.replace("apt, dpkg", "dpkg, apt")
    ) or (managers.status == "FAIL" and all(n in managers.detail for n in ("dpkg", "apt", "pip")))
    assert (
        "/var/lib/dpkg" in managers.findings
        and "/usr/local/lib/python3.11/site-packages/pip" in managers.findings
    )
    tests = by_name(checks, "test entries")
    assert tests.status == "FAIL" and len(tests.findings) == 2


def test_allow_turns_a_deliberate_exception_into_a_warning() -> None:
    checks = audit_filesystem(fs(*SLIM_BUT), allow=["bash", "dpkg", "apt", "pip", "testing_entry"])
    got = statuses(checks)
    assert got["shell"] == got["package managers"] == got["test entries"] == "WARN"
    assert any("--allow bash" in f for f in by_name(checks, "shell").findings)
    # Allowing one name leaves the others failing.
    partial = statuses(audit_filesystem(fs(*SLIM_BUT), allow=["pip"]))
    assert partial["package managers"] == "FAIL"


def test_slim_filesystem_passes() -> None:
    checks = audit_filesystem(fs(FsEntry("/opt/codemode/site/codemode_worker/entry.py", "file", 0o644)))
    got = statuses(checks)
    assert got["shell"] == got["package managers"] == got["test entries"] == "PASS"


# ------------------------------------------------------------------------------------------ quotas


def test_recommendation_arithmetic() -> None:
    samples = [
        RunSample("ok", execute_s=0.30, spawn_s=0.25, memory_peak_bytes=20 * MiB, cpu_s=0.12, pids_peak=2),
        RunSample("ok", execute_s=0.41, spawn_s=0.26, memory_peak_bytes=33 * MiB, cpu_s=0.30, pids_peak=3),
        RunSample("resource limit exceeded", execute_s=9.0, memory_peak_bytes=900 * MiB),
    ]
    rec = recommend(samples)
    assert rec is not None and rec.runtime == "docker"
    # 33 MiB x 1.5 = 49.5 -> 64 MiB; 0.30/0.41 = 0.73 x 1.25 = 0.91 -> 1.0; 2 x 3 = 6 -> floor 16
    assert rec.settings == {"docker_memory": "64m", "docker_cpus": 1.0, "docker_max_processes": 16}
    assert rec.max_execution_time == 1.0  # slowest 0.41 x 2 = 0.82 -> 0.9, at least the floor of 1 s
    assert rec.serve_flags()[-4:] == ["--docker-max-processes", "16", "--max-execution-time", "1"]
    assert recommend([samples[2]]) is None


def test_kubernetes_recommendation_arithmetic() -> None:
    samples = [
        RunSample("ok", execute_s=1.0, spawn_s=0.9, memory_peak_bytes=11 * MiB, cpu_s=0.06),
        RunSample("ok", execute_s=2.0, spawn_s=1.0, memory_peak_bytes=40 * MiB, cpu_s=1.2),
        RunSample("ok", execute_s=1.0, spawn_s=0.9, memory_peak_bytes=12 * MiB, cpu_s=0.1),
    ]
    rec = recommend(samples, "kubernetes")
    assert rec is not None
    # 40 MiB x 1.5 = 60 -> 64Mi; max utilisation 0.6 x 1.25 = 0.75 -> 750m; median 0.1 x 1.25 -> 150m
    assert rec.settings == {
        "kubernetes_memory": "64Mi",
        "kubernetes_cpu": "750m",
        "kubernetes_cpu_request": "150m",
    }
    assert rec.max_execution_time == 4.0  # slowest 2.0 x 2, with or without a pool
    assert rec.serve_flags()[:3] == ["--runtime", "kubernetes", "--kubernetes-memory"]
    idle = [RunSample("ok", execute_s=1.0, spawn_s=0.9, memory_peak_bytes=MiB, cpu_s=0.001)]
    low = recommend(idle, "kubernetes")
    assert low is not None and low.settings["kubernetes_cpu_request"] == "50m"  # the floor
    assert low.settings["kubernetes_cpu"] == "250m" and low.settings["kubernetes_memory"] == "16Mi"


def test_process_recommendation_arithmetic() -> None:
    samples = [
        RunSample(
            "ok",
            execute_s=0.06,
            spawn_s=0.05,
            address_space_peak_bytes=410 * MiB,
            cpu_s=0.04,
            fds_peak=5,
            threads_peak=2,
        ),
        RunSample(
            "ok",
            execute_s=0.5,
            spawn_s=0.05,
            address_space_peak_bytes=700 * MiB,
            cpu_s=1.3,
            fds_peak=12,
            threads_peak=5,
        ),
    ]
    rec = recommend(samples, "process")
    assert rec is not None
    # 700 MiB x 1.5 = 1050 -> 1056 MiB; 1.3 s x 2 = 2.6 -> 3 s; 12 x 2 = 24 fds; 5 x 2 = 10 threads
    assert rec.settings == {
        "process_memory": "1056m",
        "process_cpu_seconds": 3.0,
        "process_open_files": 24,
        "process_max_processes": 10,
    }
    assert rec.serve_flags()[:4] == ["--runtime", "process", "--process-memory", "1056m"]
    assert "--process-cpu-seconds" in rec.serve_flags() and "3" in rec.serve_flags()


def test_the_hold_report_is_parsed_from_the_end_of_stderr() -> None:
    line = REPORT_PREFIX + '{"VmPeak": 4096, "cgroup_memory_peak": 123}'
    assert parse_report(f"noise\n{line}\n".encode()) == {"VmPeak": 4096, "cgroup_memory_peak": 123}
    assert parse_report(b"no report here\n") == {}
    assert parse_report((REPORT_PREFIX + '{"cut').encode()) == {}  # a line not yet whole
    assert parse_report((REPORT_PREFIX + "[1]\n").encode()) == {}


# ------------------------------------------------------------------------------------------ CLI


@pytest.mark.parametrize(
    ("argv", "flags"),
    [
        (["image", "audit"], ["IMAGE", "--json", "--no-probe"]),
        (["quotas", "tune"], ["--program", "--runs", "--runtime", "--pack", "--memory", "--json"]),
        (["bench"], ["--runtime", "--pool", "--n", "--clients", "--load", "--json"]),
    ],
)
def test_operator_help(argv: list[str], flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in flags:
        assert flag in out


def test_quotas_tune_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["quotas", "tune", "--program", "/nonexistent/program.star"]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert cli.main(["quotas", "tune", "--program", __file__, "--runs", "0"]) == 2


def test_bench_process_runtime() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "codemode.cli", "bench", "--runtime", "process", "--n", "5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("codemode bench: runtime process, pool 4, n=5")
    for label in (
        "trivial execute, cold (no pool)",
        "trivial execute, warm (pool 4)",
        "one native call, warm (pool 4)",
    ):
        (row,) = [ln for ln in lines if ln.startswith(label)]
        assert "n=5" in row and "p50=" in row and "p99=" in row and row.endswith("ms")
    (row,) = [ln for ln in lines if ln.startswith("sustained, 20 in flight (pool 4)")]
    assert "n=200" in row and "executes/s" in row and "ms per execute" in row


def test_bench_json() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "codemode.cli", "bench", "--n", "3", "--pool", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["runtime"] == "process" and report["n"] == 3
    assert set(report["series"]) == {"trivial_cold", "trivial_warm", "one_call_warm", "hundred_calls_warm"}
    for series in report["series"].values():
        assert 0 < series["p50"] <= series["p99"]
    load = report["load"]
    assert load["executes"] == 200 and load["rate"] > 0 and 0 < load["p50"] <= load["p99"]
    assert load["cpu_ms_per_execute"] > 0  # the service's own CPU at least
