"""One pack lifecycle (docs/packs.md, "A pack's lifecycle"): every pack, by every loading path, has
its ``capabilities(settings)`` taken once, ``open()`` awaited once before serving and ``aclose()``
awaited once at shutdown (in reverse order), also when the start fails part of the way. The test
pack (tests/support/lifecycle_pack.py) logs each step to a file."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

import codemode
from codemode.packs import PackSettings
from codemode.runtimes.process import ProcessRuntime
from codemode.startup.bootstrap import StartupProblem, build_server, check_runtime
from codemode.startup.config import ConfigError, Settings
from tests.support import lifecycle_pack
from tests.support.lifecycle_pack import steps

ROOT = Path(__file__).resolve().parents[3]
FILE_PACK = f"{ROOT}/tests/support/lifecycle_pack.py"


def lifecycle(names: list[str], opened: bool = True) -> list[str]:
    """What the log holds after loading ``names`` in order, starting and closing."""
    out = [f"{n} capabilities" for n in names]
    if opened:
        out += [f"{n} open" for n in names]
    return out + [f"{n} close" for n in reversed(names)]


def settings_for(log: Path, *packs: str, options: tuple[str, ...] = ()) -> Settings:
    return Settings(
        allow_all=True, packs=list(packs), pack_options=[f"LIFECYCLE_LOG={log}", *options], pool=0
    )


def second_fails_to_load(log: Path) -> Settings:
    """``--pack`` first, second and third, the second's ``capabilities()`` raising."""
    packs = [f"tests.support.lifecycle_pack:{name}" for name in ("first", "second", "third")]
    return settings_for(log, *packs, options=("LIFECYCLE_FAIL_LOAD=second",))


def pack_settings(log: Path, **options: str) -> PackSettings:
    return PackSettings(environ={}, options={"LIFECYCLE_LOG": str(log), **options})


# ---------------------------------------------------------------------------------------- library


async def test_builder_add_pack_opens_before_serving_and_closes_at_exit(tmp_path: Path) -> None:
    log = tmp_path / "log"
    builder = codemode.Builder(authorizer=codemode.allow_all(), runtime=ProcessRuntime())
    builder.add_pack(lifecycle_pack.first, pack_settings(log))
    builder.add_pack("tests.support.lifecycle_pack:factory", pack_settings(log))
    async with builder.build() as server:
        assert steps(log) == ["first capabilities", "made capabilities", "first open", "made open"]
        assert await server.execute(
            'def main():\n    return first.ping(text="hi")\n', subject=codemode.Subject("a")
        ) == {"text": "first: hi"}
    assert steps(log) == lifecycle(["first", "made"])


async def test_builder_add_pack_closes_the_packs_when_build_fails(tmp_path: Path) -> None:
    log = tmp_path / "log"
    builder = codemode.Builder(runtime=ProcessRuntime())  # no authorizer: build() refuses
    builder.add_pack(lifecycle_pack.first, pack_settings(log))
    builder.add_pack(lifecycle_pack.second, pack_settings(log))
    with pytest.raises(codemode.InvalidRegistration):
        builder.build()
    assert steps(log) == lifecycle(["first", "second"], opened=False)


async def test_builder_add_pack_whose_capabilities_fail_is_closed_at_once(tmp_path: Path) -> None:
    log = tmp_path / "log"
    builder = codemode.Builder(authorizer=codemode.allow_all(), runtime=ProcessRuntime())
    with pytest.raises(codemode.packs.PackError, match=r"^pack 'second': building its capabilities failed"):
        builder.add_pack(lifecycle_pack.second, pack_settings(log, LIFECYCLE_FAIL_LOAD="second"))
    assert steps(log) == ["second capabilities", "second close"]


async def test_a_failing_open_closes_what_was_opened_and_names_the_pack(tmp_path: Path) -> None:
    log = tmp_path / "log"
    builder = codemode.Builder(authorizer=codemode.allow_all(), runtime=ProcessRuntime())
    for pack in (lifecycle_pack.first, lifecycle_pack.second, lifecycle_pack.third):
        builder.add_pack(pack, pack_settings(log, LIFECYCLE_FAIL_OPEN="second"))
    server = builder.build()
    with pytest.raises(codemode.PackOpenError) as caught:
        async with server:
            pytest.fail("served although a pack did not open")
    assert str(caught.value) == (
        "pack 'second': open failed: ConnectionError: second database is unreachable"
    )
    loaded = [f"{n} capabilities" for n in ("first", "second", "third")]
    closed = ["third close", "second close", "first close"]
    assert steps(log) == [*loaded, "first open", "second open", *closed]
    await server.aclose()  # nothing is closed twice
    with pytest.raises(codemode.PackOpenError):
        await server.start()  # nor opened again
    assert steps(log) == [*loaded, "first open", "second open", *closed]


# ---------------------------------------------------------------------- --pack (build_server)


async def test_every_pack_spec_form_is_opened_and_closed_once(tmp_path: Path) -> None:
    log = tmp_path / "log"
    settings = settings_for(
        log,
        "tests.support.lifecycle_pack:first",
        f"{FILE_PACK}:second",
        "tests.support.lifecycle_pack:factory",
    )
    server = build_server(settings)
    assert steps(log) == ["first capabilities", "second capabilities", "made capabilities"]
    assert await check_runtime(server, settings) is None
    await server.aclose()
    await server.aclose()
    assert steps(log) == lifecycle(["first", "second", "made"])


async def test_a_pack_that_fails_to_load_closes_the_ones_loaded_before(tmp_path: Path) -> None:
    log = tmp_path / "log"
    settings = second_fails_to_load(log)
    with pytest.raises(ConfigError, match=re.escape("pack 'tests.support.lifecycle_pack:second'")):
        build_server(settings)
    assert steps(log) == ["first capabilities", "second capabilities", "second close", "first close"]


async def test_degraded_start_closes_the_pack_left_out_and_serves_the_rest(tmp_path: Path) -> None:
    log = tmp_path / "log"
    settings = second_fails_to_load(log)
    problems: list[StartupProblem] = []
    server = build_server(settings, problems=problems)
    assert len(problems) == 1
    assert await check_runtime(server, settings) is None
    await server.aclose()
    assert steps(log) == [
        "first capabilities",
        "second capabilities",
        "second close",
        "third capabilities",
        "first open",
        "third open",
        "third close",
        "first close",
    ]


async def test_a_build_failure_after_loading_closes_every_pack(tmp_path: Path) -> None:
    log = tmp_path / "log"
    settings = settings_for(log, "tests.support.lifecycle_pack:first", "tests.support.lifecycle_pack:third")
    settings = settings.model_copy(update={"disable": ["no.such.id"]})
    with pytest.raises(ConfigError):
        build_server(settings)
    assert steps(log) == lifecycle(["first", "third"], opened=False)


async def test_a_pack_whose_open_fails_is_one_start_up_problem(tmp_path: Path) -> None:
    log = tmp_path / "log"
    settings = settings_for(
        log,
        "tests.support.lifecycle_pack:first",
        f"{FILE_PACK}:second",
        "tests.support.lifecycle_pack:third",
        options=("LIFECYCLE_FAIL_OPEN=second",),
    )
    server = build_server(settings)
    problem = await check_runtime(server, settings)
    assert problem is not None
    assert problem.component == f"pack {FILE_PACK}:second"
    assert problem.detail == (
        f"--pack / CODEMODE_PACKS: pack '{FILE_PACK}:second': open failed: "
        "ConnectionError: second database is unreachable"
    )
    await server.aclose()
    assert steps(log) == [
        "first capabilities",
        "second capabilities",
        "third capabilities",
        "first open",
        "second open",
        "third close",
        "second close",
        "first close",
    ]


class GatedPack:
    """A pack whose open() waits for the test (a slow database), counting its steps."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.steps: list[str] = []

    def capabilities(self, settings: PackSettings) -> list[codemode.Capability]:
        return []

    async def open(self) -> None:
        self.steps.append("open")
        await self.gate.wait()
        self.steps.append("opened")

    async def aclose(self) -> None:
        self.steps.append("close")


async def test_a_start_cut_short_leaves_the_open_running_and_the_next_start_waits_for_it() -> None:
    """A bounded start (a readiness probe's timeout) that ends while a pack is opening neither tears
    the open apart nor runs it twice: the next start waits for the same open."""
    pack = GatedPack()
    builder = codemode.Builder(authorizer=codemode.allow_all(), runtime=ProcessRuntime())
    server = builder.add_pack(pack, name="gated").build()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await server.start()
    assert pack.steps == ["open"]
    pack.gate.set()
    await server.start()
    assert pack.steps == ["open", "opened"]
    await server.aclose()
    assert pack.steps == ["open", "opened", "close"]


async def test_closing_while_a_pack_is_opening_stops_the_open_and_closes_it_once() -> None:
    pack = GatedPack()
    builder = codemode.Builder(authorizer=codemode.allow_all(), runtime=ProcessRuntime())
    server = builder.add_pack(pack).build()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await server.start()
    await server.aclose()
    assert pack.steps == ["open", "close"]
