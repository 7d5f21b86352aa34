"""A dead Docker daemon: the client sees ``internal failure``, the operator a precise reason."""

from __future__ import annotations

import logging
import time

import pytest

import codemode
from codemode.common.errors import client_text
from codemode.runtimes.base import RuntimeUnavailable
from codemode.runtimes.docker import DockerOptions
from tests.support.recorder import ALICE, Recorder, make_capabilities


async def test_execute_against_a_dead_daemon_is_internal_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = codemode.DockerRuntime(DockerOptions(base_url="unix:///nonexistent/docker.sock"))
    rec = Recorder()
    server = (
        codemode.Builder(authorizer=rec, runtime=runtime, disabled=["util.hidden.v1"])
        .register(*make_capabilities(rec))
        .build()
    )
    try:
        with pytest.raises(RuntimeUnavailable) as ready:
            await runtime.check()
        assert "nonexistent" in str(ready.value) or "docker" in str(ready.value).lower()
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING), pytest.raises(codemode.CodeModeError) as err:
            await server.execute("def main():\n    return 1\n", subject=ALICE)
        assert client_text(err.value) == "internal failure"
        assert "nonexistent" not in str(err.value)
        assert time.monotonic() - t0 < 6
        logged = " ".join(r.getMessage() for r in caplog.records)
        assert "docker daemon unreachable" in logged and "nonexistent" in logged
        assert rec.authz_inputs == []
    finally:
        await server.aclose()
