"""The start-up rule (docs/service.md, "Start-up problems") for ``codemode serve --http``, run as the
real command (real uvicorn): a pack, an upstream or the runtime that fails at start stops it with
exit 2 and one line, unless ``--start-degraded``: then ``/readyz`` fails coarsely and the detail is
only in the log and on the metrics port. The runtime half is tested with a real Docker engine (the
``docker_api`` fixture); run this file under the engines lock."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.mcp_client import RECORDS_PACK, child_env, cli_command
from tests.support.service import mcp_client, tool_value, write_token_file
from tests.support.upstreams import free_port, stop, wait_listening

pytestmark = pytest.mark.slow

LOG_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING) codemode[.\w]*: ")
MISSING_IMAGE = "codemode-worker:no-such-tag-startup-rule"


@dataclass
class Started:
    proc: subprocess.Popen[str]
    url: str
    metrics_url: str
    token: str
    log: Path

    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8")


def gone_table() -> str:
    return (
        f'[[upstream_mcp]]\nname = "gone"\nurl = "http://127.0.0.1:{free_port()}/mcp"\nconnect_timeout = 5\n'
    )


def http_argv(tmp_path: Path, tables: str, *flags: str) -> tuple[list[str], str, int, int]:
    tokens = write_token_file(tmp_path, ["alice"])
    config = tmp_path / "codemode.toml"
    config.write_text(tables, encoding="utf-8")
    port, metrics_port = free_port(), free_port()
    argv = cli_command(
        "serve", "--http", "--allow-all", "--pack", RECORDS_PACK,
        "--pack-option", "CODEMODE_RECORDS_DB=:memory:",
        "--config", str(config), "--token-file", str(tokens.path), "--port", str(port),
        "--metrics-port", str(metrics_port), "--audit-log", "none", *flags,
    )  # fmt: skip
    return argv, tokens["alice"], port, metrics_port


def exit_of(argv: list[str]) -> tuple[int, list[str]]:
    proc = subprocess.run(
        argv, env=child_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    return proc.returncode, proc.stderr.splitlines()


@contextlib.contextmanager
def started(tmp_path: Path, tables: str, *flags: str) -> Iterator[Started]:
    argv, token, port, metrics_port = http_argv(tmp_path, tables, *flags)
    log = tmp_path / "serve.log"
    with log.open("w", encoding="utf-8") as err:
        proc = subprocess.Popen(
            argv, env=child_env(), stdin=subprocess.DEVNULL, stdout=err, stderr=err, text=True
        )
        try:
            wait_listening(
                proc, port, 60, lambda: f"serve --http exited {proc.returncode}: {log.read_text()[-2000:]}"
            )
            yield Started(
                proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", token, log
            )
        finally:
            stop(proc, 30)


def readyz(url: str) -> httpx.Response:
    return httpx.get(url + "/readyz", timeout=30)


def one_line_exit(code: int, lines: list[str]) -> str:
    """Exit 2 and the problem in one line, the last; before it only the host's own log records at
    the configured level (serve --http logs at info by default), no traceback."""
    assert code == 2 and lines and lines[-1].startswith("codemode: "), (code, lines)
    assert all(LOG_RECORD.match(line) for line in lines[:-1]), lines
    assert not any("Traceback" in line or " ERROR " in line for line in lines), lines
    return lines[-1]


# --- packs and upstreams -------------------------------------------------------------------------


def test_an_unreachable_upstream_stops_serve_http_in_one_line(tmp_path: Path) -> None:
    argv, *_ = http_argv(tmp_path, gone_table())
    # unfixed: exit 1, "serve --http failed: UpstreamBuildError: ... ExceptionGroup ..."
    line = one_line_exit(*exit_of(argv))
    assert line.startswith(
        "codemode: --config / CODEMODE_CONFIG: upstream 'gone': cannot connect and list tools"
    )


async def test_a_degraded_start_serves_the_rest_and_keeps_the_detail_off_the_open_port(
    tmp_path: Path,
) -> None:
    with started(tmp_path, gone_table(), "--start-degraded") as srv:
        ready = readyz(srv.url)
        assert ready.status_code == 503
        assert ready.json() == {"status": "not ready", "reason": "start-up problem"}
        assert "gone" not in ready.text and "127.0.0.1" not in ready.text
        assert httpx.get(srv.url + "/healthz", timeout=30).status_code == 200
        # the operator's detail: on the metrics port ...
        metrics = httpx.get(srv.metrics_url, timeout=30).text
        (sample,) = [line for line in metrics.splitlines() if line.startswith("codemode_startup_problem{")]
        assert 'component="upstream_mcp gone"' in sample and "cannot connect and list tools" in sample
        assert sample.endswith(" 1.0")
        # ... and what loaded is served to authenticated clients
        async with mcp_client(srv.url + "/mcp", srv.token) as client:
            found = tool_value(await client.call_tool("search_api", {"query": "create record"}))
            assert "records.create" in [r["name"] for r in found["results"]]
            src = 'def main():\n    return records.create(title="t")["title"]\n'
            assert tool_value(await client.call_tool("execute", {"source": src})) == {"result": "t"}
        assert readyz(srv.url).status_code == 503  # stays until a restart
    # ... and in the log
    log = srv.stderr()
    assert "start-up problem, upstream_mcp gone left out (degraded start)" in log
    assert "readyz answers 503 until a restart" in log


def test_a_pack_that_cannot_load_stops_serve_http_in_one_line(tmp_path: Path) -> None:
    argv, *_ = http_argv(tmp_path, "", "--pack", "no_such_module_xyz:pack")
    line = one_line_exit(*exit_of(argv))
    assert line.startswith("codemode: --pack / CODEMODE_PACKS: pack 'no_such_module_xyz:pack': no module")


def test_a_degraded_start_leaves_out_a_pack_that_cannot_load(tmp_path: Path) -> None:
    with started(tmp_path, "", "--pack", "no_such_module_xyz:pack", "--start-degraded") as srv:
        assert readyz(srv.url).json() == {"status": "not ready", "reason": "start-up problem"}
        metrics = httpx.get(srv.metrics_url, timeout=30).text
        assert 'component="pack no_such_module_xyz:pack"' in metrics


def test_a_healthy_start_is_ready(tmp_path: Path) -> None:
    with started(tmp_path, "", "--start-degraded") as srv:
        deadline = time.monotonic() + 30
        while readyz(srv.url).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert "codemode_startup_problem{" not in httpx.get(srv.metrics_url, timeout=30).text


# --- the runtime (Docker: hold the engines lock) ---------------------------------------------------


@pytest.mark.usefixtures("docker_api")
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--docker-image", MISSING_IMAGE), f"worker image '{MISSING_IMAGE}' not found"),
        (
            ("--docker-oci-runtime", "no-such-oci-runtime"),
            "OCI runtime 'no-such-oci-runtime' is not registered",
        ),
    ],
)
def test_a_runtime_that_cannot_work_stops_serve_stdio_in_one_line(
    flags: tuple[str, ...], expected: str
) -> None:
    argv = cli_command(
        "serve", "--stdio", "--allow-all", "--pack", RECORDS_PACK, "--runtime", "docker", *flags
    )
    # unfixed: served, and the first execute failed with "internal failure" and a traceback
    line = one_line_exit(*exit_of(argv))
    assert line.startswith(
        "codemode: --runtime / CODEMODE_RUNTIME, --docker-* / CODEMODE_DOCKER_*: "
        "the docker runtime is not usable: "
    )
    assert expected in line


@pytest.mark.usefixtures("docker_api")
def test_a_runtime_that_cannot_work_stops_serve_http_in_one_line(tmp_path: Path) -> None:
    argv, *_ = http_argv(tmp_path, "", "--runtime", "docker", "--docker-image", MISSING_IMAGE)
    # unfixed: served, /readyz said "runtime unavailable" for ever
    line = one_line_exit(*exit_of(argv))
    assert "the docker runtime is not usable" in line and MISSING_IMAGE in line


@pytest.mark.usefixtures("docker_api")
def test_a_degraded_start_with_a_missing_image_reports_it_on_the_metrics_port(tmp_path: Path) -> None:
    with started(
        tmp_path, "", "--runtime", "docker", "--docker-image", MISSING_IMAGE, "--start-degraded"
    ) as srv:
        ready = readyz(srv.url)
        assert ready.json() == {"status": "not ready", "reason": "runtime unavailable"}
        assert MISSING_IMAGE not in ready.text
        metrics = httpx.get(srv.metrics_url, timeout=30).text
        (sample,) = [line for line in metrics.splitlines() if line.startswith("codemode_startup_problem{")]
        assert 'component="runtime docker"' in sample and MISSING_IMAGE in sample
    assert "degraded start: --runtime / CODEMODE_RUNTIME" in srv.stderr()
