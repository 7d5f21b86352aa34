"""``codemode serve --http`` configures logging once: its three listeners (MCP, metrics,
health) are three uvicorn servers in one process, and uvicorn's lifecycle lines (``Started server
process``, ``Shutting down``, ``Finished server process``) came once per listener; now the MCP
listener's alone say them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

LIFECYCLE = ("Started server process", "Shutting down", "Finished server process")


def _command(*args: str) -> list[str]:
    script = Path(sys.executable).with_name("codemode")
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "codemode.cli", *args]


@pytest.mark.timeout(120)
def test_three_listeners_say_each_lifecycle_line_once(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text("{}")
    argv = _command(
        "serve", "--http", "--allow-all", "--runtime", "process",
        "--pack", "codemode_capabilities.records:pack", "--token-file", str(tokens),
        "--data-dir", str(tmp_path / "data"), "--log-level", "info", "--drain-delay", "0",
        "--port", "0", "--metrics-port", "0", "--health-port", "0",
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEMODE_")}
    seen: list[str] = []
    with subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stderr is not None
            for line in proc.stderr:  # until the MCP listener runs (after the metrics and health ones)
                seen.append(line)
                if "Uvicorn running on http://" in line:
                    break
            assert any("health at http://" in line for line in seen), "".join(seen)
            proc.send_signal(signal.SIGTERM)
            rest = proc.stderr.read()  # to the end: the process has exited
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = "".join(seen) + rest
    counts = {what: text.count(what) for what in LIFECYCLE}
    assert counts == dict.fromkeys(LIFECYCLE, 1), text
    assert proc.returncode in (0, -signal.SIGTERM), text  # uvicorn raises the signal again at the end
