"""Operators' tools against a real Docker engine: ``image audit`` and ``quotas tune``.

Skips locally without Docker (visible reason); fails under CI=true. See the ``docker_api`` fixture in
tests/conftest.py.
The deliberately bad image is built here from ``codemode-base:bookworm`` and removed afterwards.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from codemode import cli
from codemode.ops.image_audit import writable_check
from codemode.runtimes.docker import DEFAULT_IMAGE, WORKER_USER
from codemode.startup.config import parse_size
from tests.support.docker_engine import build_image, worker_containers

# Containers started by this test process (other hosts may share the daemon).
MINE = f"io.codemode.owner-pid={os.getpid()}"

pytestmark = pytest.mark.docker

# FROM is filled in with the base image from the ``docker_base_image`` fixture.
BAD_DOCKERFILE = """\
FROM {base}
RUN ["python3", "-c", "import os\\nos.makedirs('/usr/local/bin', exist_ok=True)\\np = '/usr/local/bin/escalate'\\nopen(p, 'w').write('#!/bin/true\\\\n')\\nos.chmod(p, 0o4755)\\nos.makedirs('/srv/drop', exist_ok=True)\\nos.chmod('/srv/drop', 0o777)\\nq = '/srv/' + chr(27) + '[2J' + chr(0x202e) + 'gnp.x'\\nos.makedirs(q)\\nos.chmod(q, 0o777)\\n"]
ENV API_TOKEN=not-a-real-token-0123456789
EXPOSE 8080
VOLUME /data
USER root
ENTRYPOINT ["python3", "-m", "codemode_worker"]
"""  # noqa: E501


@pytest.fixture(scope="module")
def bad_image(docker_api: Any, docker_base_image: str) -> Iterator[str]:
    tag = build_image(
        docker_api, "codemode-test-bad-worker", BAD_DOCKERFILE.replace("{base}", docker_base_image)
    )
    try:
        yield tag
    finally:
        docker_api.remove_image(tag, force=True)


def docker_volumes(api: Any) -> list[str]:
    return [v["Name"] for v in api.volumes().get("Volumes") or []]


def audit_json(image: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(["image", "audit", image, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


#: The production worker image (CODEMODE_TEST_WORKER_IMAGE overrides, e.g. a freshly built tag).
WORKER_IMAGE = os.environ.get("CODEMODE_TEST_WORKER_IMAGE") or DEFAULT_IMAGE


def test_audit_worker_image_passes(docker_api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["image", "audit", WORKER_IMAGE])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "result: PASS" in out
    for name in (
        "user",
        "entrypoint",
        "protocol label",
        "role label",
        "setuid/setgid files",
        "protocol probe",
        "writable mounts",
    ):
        (row,) = [ln for ln in out.splitlines() if ln.startswith(name + " ")]
        assert " PASS " in row, row
    assert "MB" in out  # image size

    code, report = audit_json(WORKER_IMAGE, capsys)
    assert code == 0 and report["ok"] is True
    assert report["size_bytes"] > 10_000_000
    checks = {c["name"]: c for c in report["checks"]}
    assert all(c["status"] != "FAIL" for c in checks.values())
    # The production image has no shell, package manager or test entry.
    assert checks["shell"]["status"] == checks["package managers"]["status"] == "PASS"
    assert checks["test entries"]["status"] == "PASS"
    assert checks["protocol probe"]["status"] == "PASS"
    # a process of the worker's user beside the worker tried the image's directories, the mount
    # points and the masked directories, and could create a file in none
    assert checks["writable mounts"]["status"] == "PASS"
    assert int(checks["writable mounts"]["detail"].split()[2]) > 50
    assert not worker_containers(docker_api, MINE)
    assert not docker_api.containers(all=True, filters={"label": ["io.codemode.role=audit"]})


async def test_the_writable_check_names_each_place_the_workers_user_can_write(docker_api: Any) -> None:
    """The check's failing side, on a real container of the worker image created without the
    runtime's hardening and with what the runtime never gives (crun 1.8.1 left its masked
    directories so, docs/docker.md "Which OCI runtime"): read-write tmpfs mounts of mode 1777, two
    under ``/sys`` that only the probe's mount table step reaches (one with a space, escaped there
    as ``\\040``). The root file system is read-only as in a worker container."""
    scratch = "rw,mode=1777,size=64k"
    container = docker_api.create_container(
        WORKER_IMAGE,
        entrypoint=["python3", "-I", "-c", "import time; time.sleep(120)"],
        user=WORKER_USER,
        network_disabled=True,
        labels={"io.codemode.owner-pid": str(os.getpid())},
        host_config=docker_api.create_host_config(
            read_only=True,
            network_mode="none",
            tmpfs={"/scratch": scratch, "/sys/fs/cgroup/xy": scratch, "/sys/fs/cgroup/x y": scratch},
        ),
    )["Id"]
    try:
        docker_api.start(container)
        check = await writable_check(docker_api, container)
        # a probe that outlives its deadline is a failed check, not a hung audit
        stuck = await writable_check(docker_api, container, seconds=0.001)
    finally:
        docker_api.remove_container(container, force=True, v=True)
    # the tmpfs mounts, and the two the engine mounts writable by default and the runtime takes away
    # (IpcMode none: no /dev/shm; a read-only /dev/mqueue); nothing of the read-only image
    assert sorted(check.findings) == [
        "/dev/mqueue",
        "/dev/shm",
        "/scratch",
        "/sys/fs/cgroup/x y",
        "/sys/fs/cgroup/xy",
    ], check
    assert check.status == "FAIL" and check.detail.startswith("the worker's user can write in 5 of")
    assert stuck.status == "FAIL" and "ran longer than" in stuck.detail


def test_audit_bad_image_reports_each_failure(
    docker_api: Any, bad_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    volumes = set(docker_volumes(docker_api))
    code, report = audit_json(bad_image, capsys)
    assert code == 1 and report["ok"] is False
    checks = {c["name"]: c for c in report["checks"]}
    expected_failures = {
        "user",  # USER root
        "entrypoint",  # no -I
        "protocol label",
        "role label",
        "environment",  # API_TOKEN
        "exposed ports",
        "volumes",
        "setuid/setgid files",
        "world-writable paths",
        "protocol probe",  # no codemode_worker in the image
    }
    failed = {name for name, c in checks.items() if c["status"] == "FAIL"}
    assert expected_failures <= failed, failed
    assert any("API_TOKEN" in f for f in checks["environment"]["findings"])
    assert "not-a-real-token" not in json.dumps(report)
    assert any("/usr/local/bin/escalate" in f for f in checks["setuid/setgid files"]["findings"])
    assert any("/srv/drop" in f for f in checks["world-writable paths"]["findings"])
    assert checks["shell"]["status"] == "FAIL"  # built on a Debian base: dash, bash

    code = cli.main(["image", "audit", bad_image, "--no-probe"])
    out = capsys.readouterr().out
    assert code == 1 and "result: FAIL" in out
    assert "protocol probe" not in out
    assert not worker_containers(docker_api, MINE)
    # The world-writable directory whose name clears the screen and reverses the text after it is
    # named in the table with those characters escaped; the JSON report escapes them itself.
    hostile = "/srv/\x1b[2J\u202egnp.x"
    assert any(hostile in f for f in checks["world-writable paths"]["findings"])
    assert "\x1b" not in out and "\u202e" not in out
    assert "/srv/\\x1b[2J\\u202egnp.x" in out
    # VOLUME /data: the export's (and the probe's) container left no anonymous volume behind.
    assert set(docker_volumes(docker_api)) <= volumes


def test_audit_missing_image(docker_api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["image", "audit", f"codemode-test-no-such-image:{uuid.uuid4().hex[:8]}"])
    assert code == 2
    assert "not found" in capsys.readouterr().err


def test_quotas_tune_tiny_program(
    docker_api: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = tmp_path / "tiny.star"
    program.write_text("def main():\n    xs = [i * i for i in range(1000)]\n    return sum(xs)\n")
    code = cli.main(
        ["quotas", "tune", "--program", str(program), "--runtime", "docker", "--runs", "2", "--json"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert len(report["samples"]) == 2
    for s in report["samples"]:
        assert s["outcome"] == "ok" and s["counters_final"] is True
        assert s["memory_method"] in ("max_usage", "sampled usage")
        assert (
            1024 * 1024 < s["memory_peak_bytes"] < parse_size(report["measurement_limits"]["docker_memory"])
        )
        assert s["cpu_s"] > 0 and s["pids_peak"] >= 1
        assert 0 < s["spawn_s"] < s["execute_s"]
    rec = report["recommendation"]
    peak = max(s["memory_peak_bytes"] for s in report["samples"])
    memory = parse_size(rec["settings"]["docker_memory"])
    assert memory % (16 * 1024 * 1024) == 0 and memory >= peak * 1.5
    assert rec["settings"]["docker_max_processes"] >= 16 and rec["settings"]["docker_cpus"] >= 0.25
    p99 = max(s["execute_s"] for s in report["samples"])
    assert rec["max_execution_time"] >= p99 * 2
    assert rec["max_execution_time"] >= max(report["burst"]["seconds"]) * 2
    flags = rec["serve_flags"]
    assert flags[flags.index("--docker-memory") + 1] == rec["settings"]["docker_memory"]

    code = cli.main(
        ["quotas", "tune", "--program", str(program), "--runtime", "docker", "--runs", "1", "--warmup", "0"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "recommendation" in out and "serve flags: --runtime docker --docker-memory" in out
    assert not worker_containers(docker_api, MINE)


def test_quotas_tune_oom_is_reported(
    docker_api: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = tmp_path / "big.star"
    program.write_text(
        'def main():\n    s = "x" * 40000000\n    return len([s + str(i) for i in range(4)])\n'
    )
    argv = [
        "quotas",
        "tune",
        "--program",
        str(program),
        "--runs",
        "1",
        "--warmup",
        "0",
        "--runtime",
        "docker",
        "--docker-memory",
        "48m",
    ]
    code = cli.main([*argv, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    (sample,) = report["samples"]
    assert sample["outcome"] == "resource limit exceeded" and sample["oom_killed"] is True
    assert sample["detail"] == "resource limit exceeded: memory"  # what the client is told
    assert report["recommendation"] is None
    assert not worker_containers(docker_api, MINE)
