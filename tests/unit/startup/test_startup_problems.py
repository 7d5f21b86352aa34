"""The start-up rule in the bootstrap (docs/service.md, "Start-up problems"): a unit that fails is a
one-line ``ConfigError`` (strict) or is left out with its problem (degraded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode.runtimes.base import RuntimeUnavailable
from codemode.startup.bootstrap import StartupProblem, build_server, check_runtime
from codemode.startup.config import ConfigError, Settings

RECORDS = "codemode_capabilities.records:pack"


def settings(tmp_path: Path, *packs: str, **extra: Any) -> Settings:
    bad = tmp_path / "bad_pack.py"
    bad.write_text("raise RuntimeError('cannot reach the backend\\nsecond line')\n")
    return Settings(
        transport="stdio",
        allow_all=True,
        packs=[RECORDS, *packs],
        pack_options=["CODEMODE_RECORDS_DB=:memory:"],
        **extra,
    )


def test_a_failing_pack_is_one_configuration_error_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        build_server(settings(tmp_path, f"{tmp_path}/bad_pack.py:pack"))
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"--pack / CODEMODE_PACKS: pack '{tmp_path}/bad_pack.py:pack': importing")
    assert "RuntimeError: cannot reach the backend; second line" in text


def test_a_degraded_build_leaves_the_failing_pack_out(tmp_path: Path) -> None:
    problems: list[StartupProblem] = []
    spec = f"{tmp_path}/bad_pack.py:pack"
    server = build_server(settings(tmp_path, spec, disable=["bad.thing"]), problems=problems)
    assert sorted(c.name for c in server.capabilities)[:2] == ["records.create", "records.delete"]
    (problem,) = problems
    assert problem.component == f"pack {spec}"
    assert problem.detail.startswith("--pack / CODEMODE_PACKS: ") and "\n" not in problem.detail


def test_a_degraded_build_still_refuses_configuration_errors(tmp_path: Path) -> None:
    # a disabled id nothing registers is a problem when nothing was left out
    with pytest.raises(ConfigError, match=r"disabled id 'bad\.thing' is not a registered capability"):
        build_server(settings(tmp_path, disable=["bad.thing"]), problems=[])


class BrokenRuntime:
    name = "broken"

    async def start(self) -> None:
        return None

    async def spawn(self) -> object:
        raise RuntimeUnavailable("down")

    async def check(self) -> None:
        raise RuntimeUnavailable("docker: image 'x' not found\n(build it)")

    async def aclose(self) -> None:
        return None


async def test_the_runtime_check_is_one_line_naming_the_runtime_settings(tmp_path: Path) -> None:
    server = build_server(settings(tmp_path), runtime=BrokenRuntime())  # type: ignore[arg-type]
    docker = Settings(transport="stdio", allow_all=True, runtime="docker")
    problem = await check_runtime(server, docker)
    assert problem == StartupProblem(
        "runtime docker",
        "--runtime / CODEMODE_RUNTIME, --docker-* / CODEMODE_DOCKER_*: the docker runtime is not usable: "
        "docker: image 'x' not found; (build it)",
    )
    working = build_server(settings(tmp_path), runtime=codemode.ProcessRuntime())
    try:
        assert await check_runtime(working, docker) is None
    finally:
        await working.aclose()  # the check started the worker template
