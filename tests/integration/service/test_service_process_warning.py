"""serve --http on the process runtime says at startup that it does not isolate tenants."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.support.service import service, settings, write_token_file


@pytest.mark.parametrize("runtime", ["process"])
async def test_process_runtime_startup_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, runtime: str
) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    with caplog.at_level(logging.WARNING, logger="codemode"):
        async with service(settings(token_file=tokens.path, runtime=runtime)):
            pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("NOT tenant isolation" in w and "--runtime docker" in w for w in warnings), warnings
