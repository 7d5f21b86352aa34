"""A port in use, for any of the service's three listeners (MCP, health, metrics), is one line on
stderr naming its flag and variable, exit 2, and nothing before it: every port is bound before
anything starts."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mcp_client import child_env, cli_command
from tests.support.service import write_token_file


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port another program listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def _serve(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    tokens = write_token_file(tmp_path, ["alice"])
    argv = cli_command(
        "serve", "--http", "--allow-all", "--pack", "codemode_capabilities.records:pack",
        "--token-file", str(tokens.path), "--data-dir", str(tmp_path / "data"), *flags,
    )  # fmt: skip
    return subprocess.run(
        argv, env=child_env(), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )


@pytest.mark.parametrize(
    ("flag", "variable", "others"),
    [
        ("--port", "CODEMODE_PORT", ["--health-port", "0", "--metrics-port", "0"]),
        ("--health-port", "CODEMODE_HEALTH_PORT", ["--port", "0", "--metrics-port", "0"]),
        ("--metrics-port", "CODEMODE_METRICS_PORT", ["--port", "0", "--health-port", "0"]),
    ],
)
@pytest.mark.timeout(120)
def test_a_port_in_use_is_the_only_line(
    tmp_path: Path, taken: int, flag: str, variable: str, others: list[str]
) -> None:
    proc = _serve(tmp_path, flag, str(taken), *others)
    assert proc.stderr.splitlines() == [
        f"codemode: {flag} / {variable}: cannot listen on 127.0.0.1:{taken}: Address already in use"
    ], proc.stderr
    assert proc.returncode == 2
    assert proc.stdout == ""
