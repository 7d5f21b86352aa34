"""execute end to end on the process runtime: pipeline order, error texts, limits, deadlines."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.common.errors import client_text
from codemode.runtimes.process import ProcessOptions
from tests.support.recorder import ALICE, Recorder, make_capabilities, make_server


@pytest.fixture
async def server() -> AsyncIterator[codemode.Server]:
    srv, _ = make_server()
    yield srv
    await srv.aclose()


async def run(source: str, **limits: Any) -> tuple[Any, Recorder]:
    srv, rec = make_server(**limits)
    try:
        return await srv.execute(source, subject=ALICE), rec
    finally:
        await srv.aclose()


async def fails(source: str, **limits: Any) -> tuple[str, Recorder]:
    srv, rec = make_server(**limits)
    try:
        with pytest.raises(codemode.CodeModeError) as info:
            await srv.execute(source, subject=ALICE)
        return client_text(info.value), rec
    finally:
        await srv.aclose()


async def test_trivial_and_plain_values(server: codemode.Server) -> None:
    src = "def main():\n    return {'a': [1, 2.5, True, None, 'x'], 'b': (1, 2)}\n"
    assert await server.execute(src, subject=ALICE) == {"a": [1, 2.5, True, None, "x"], "b": [1, 2]}


async def test_native_call_pipeline_order_and_canonical_map() -> None:
    src = (
        "def main():\n"
        "    r = records.lookup(key='abc', limit=2, ratio=1, tags=['a', 'b'], labels={'env': 'p'})\n"
        "    return r['count']\n"
    )
    value, rec = await run(src)
    assert value == 5
    assert len(rec.authz_inputs) == 1
    inp = rec.authz_inputs[0]
    assert inp.subject == ALICE
    assert inp.capability_id == "records.entry.lookup"
    assert inp.capability_name == "records.lookup"
    assert inp.arguments == {
        "key": "abc",
        "limit": 2,
        "ratio": 1.0,
        "tags": ["a", "b"],
        "labels": {"env": "p"},
    }
    assert isinstance(inp.arguments["ratio"], float)
    ((_name, args),) = rec.handler_calls
    assert args.ratio == 1.0 and isinstance(args.ratio, float)
    assert args.tags is not inp.arguments["tags"]  # the handler's input is separate from the map


async def test_omitted_and_none_optionals_are_absent() -> None:
    _, rec = await run("def main():\n    return records.lookup(key='k', limit=None)\n")
    assert rec.authz_inputs[0].arguments == {"key": "k"}


async def test_binding_failure_never_reaches_authorizer() -> None:
    text, rec = await fails("def main():\n    return records.lookup(key=1)\n")
    assert text == 'invalid capability arguments: argument "key" must be str, got int'
    assert rec.authz_inputs == [] and rec.handler_calls == []
    text, rec = await fails("def main():\n    return records.lookup()\n")
    assert text == 'invalid capability arguments: missing required argument "key"'
    text, rec = await fails("def main():\n    return records.lookup(key='a', tags=['a', 2])\n")
    assert text == 'invalid capability arguments: argument "tags[1]" must be str, got int'
    text, rec = await fails("def main():\n    return records.lookup(key='a', labels={'env': 1})\n")
    assert text == "invalid capability arguments: argument \"labels['env']\" must be str, got int"
    text, rec = await fails("def main():\n    return records.lookup(key='a', limit=9223372036854775808)\n")
    assert text == 'invalid capability arguments: argument "limit" overflows int64'
    text, rec = await fails("def main():\n    return records.lookup('a')\n")
    assert text.startswith("invalid capability arguments")
    assert rec.authz_inputs == []


async def test_int64_limit_exactly_passes() -> None:
    value, _ = await run(
        "def main():\n    return records.lookup(key='', limit=9223372036854775807)['count']\n"
    )
    assert value == 9223372036854775807


async def test_denied_and_policy_failure_never_run_handler() -> None:
    rec = Recorder(deny={"records.lookup"}, fail_policy={"util.echo"})
    srv, _ = make_server(rec)
    try:
        with pytest.raises(codemode.PermissionDenied) as denied:
            await srv.execute("def main():\n    return records.lookup(key='a')\n", subject=ALICE)
        assert client_text(denied.value) == "permission denied"
        with pytest.raises(codemode.PolicyFailure) as failed:
            await srv.execute("def main():\n    return util.echo(value='a')\n", subject=ALICE)
        assert client_text(failed.value) == "authorization policy failure"
        assert rec.handler_calls == []
        assert len(rec.authz_inputs) == 2
    finally:
        await srv.aclose()


async def test_handler_failures() -> None:
    text, _ = await fails("def main():\n    return util.boom(value='plain')\n")
    assert text == "capability failed"
    text, _ = await fails("def main():\n    return util.boom(value='agent')\n")
    assert text == "capability failed: record 7 is locked  by another user"
    text, _ = await fails("def main():\n    return util.badout()\n")
    assert text == "capability failed"


async def test_program_errors_carry_position() -> None:
    text, _ = await fails("def main():\n    return 1 +\n")
    assert text.startswith("invalid program: <codemode>:2:")
    text, _ = await fails("def main():\n    return undefined_name\n")
    assert text.startswith("invalid program: <codemode>:2:")
    text, _ = await fails("def main():\n    return 1 // 0\n")
    assert text.startswith("invalid program")
    text, _ = await fails("x = 1\n")
    assert text.startswith("invalid program")
    text, _ = await fails("def main(a):\n    return a\n")
    assert text.startswith("invalid program")
    text, _ = await fails("def main():\n    return records.lookup\n")
    assert text.startswith("invalid program")


async def test_top_level_native_call_rejected() -> None:
    text, rec = await fails("x = records.lookup(key='a')\ndef main():\n    return x\n")
    assert text.startswith("invalid program")
    assert rec.authz_inputs == []


async def test_disabled_capability_is_absent() -> None:
    text, rec = await fails("def main():\n    return util.hidden(value='a')\n")
    assert text.startswith("invalid program")
    assert rec.handler_calls == []


async def test_print_is_dropped_and_no_state_carries_over(server: codemode.Server) -> None:
    src = "leak = 41\ndef main():\n    print('hello')\n    return leak + 1\n"
    assert await server.execute(src, subject=ALICE) == 42
    with pytest.raises(codemode.InvalidProgram):
        await server.execute("def main():\n    return leak\n", subject=ALICE)
    frozen = "seen = []\ndef main():\n    seen.append(1)\n    return len(seen)\n"
    with pytest.raises(codemode.InvalidProgram):  # top-level values are frozen before main runs
        await server.execute(frozen, subject=ALICE)


async def test_subject_is_trusted(server: codemode.Server) -> None:
    assert await server.execute("def main():\n    return util.whoami()['value']\n", subject=ALICE) == "alice"
    with pytest.raises(codemode.Unauthenticated):
        await server.execute("def main():\n    return 1\n", subject=authz.Subject(""))


# --- limits: exactly at the limit passes, one over fails -------------------------------------------


async def test_max_source_bytes() -> None:
    src = "def main():\n    return 1\n"
    pad = 100 - len(src)
    value, _ = await run(src + "#" * (pad - 1) + "\n", max_source_bytes=100)
    assert value == 1
    text, _ = await fails(src + "#" * pad + "\n", max_source_bytes=100)
    assert text == "resource limit exceeded: source size"


async def test_max_native_calls() -> None:
    src = "def main():\n    for i in range({n}):\n        util.echo(value='x')\n    return 'ok'\n"
    assert (await run(src.format(n=3), max_native_calls=3))[0] == "ok"
    text, rec = await fails(src.format(n=4), max_native_calls=3)
    assert text == "resource limit exceeded: native calls"
    assert len(rec.handler_calls) == 3


async def test_max_value_bytes_final_and_result() -> None:
    # '"' + n chars + '"' is the encoded size of a string.
    assert (await run("def main():\n    return 'x' * 98\n", max_value_bytes=100))[0] == "x" * 98
    text, _ = await fails("def main():\n    return 'x' * 99\n", max_value_bytes=100)
    assert text == "resource limit exceeded: value size"
    # A native result {"data": "..."} is 11 bytes of framing plus the string.
    ok = "def main():\n    return len(util.blob(size=89)['data'])\n"
    assert (await run(ok, max_value_bytes=100))[0] == 89
    text, _ = await fails("def main():\n    return len(util.blob(size=90)['data'])\n", max_value_bytes=100)
    assert text == "resource limit exceeded: value size"


async def test_max_value_depth() -> None:
    at = "def main():\n    return [[[1]]]\n"  # depth 4
    assert (await run(at, max_value_depth=4))[0] == [[[1]]]
    text, _ = await fails("def main():\n    return [[[[1]]]]\n", max_value_depth=4)
    assert text == "resource limit exceeded: value size"
    text, rec = await fails(
        "def main():\n    return records.lookup(key='a', tags=[[['x']]])\n", max_value_depth=3
    )
    assert text.startswith(("resource limit exceeded", "invalid capability arguments"))
    assert rec.authz_inputs == []


async def test_max_intermediate_value_bytes() -> None:
    src = "def main():\n    for i in range({n}):\n        util.blob(size=89)\n    return 1\n"
    assert (await run(src.format(n=3), max_intermediate_value_bytes=300))[0] == 1
    text, _ = await fails(src.format(n=4), max_intermediate_value_bytes=300)
    assert text == "resource limit exceeded: intermediate bytes"


async def test_max_execution_steps() -> None:
    src = "def main():\n    t = 0\n    for i in range({n}):\n        t += i\n    return t\n"
    assert (await run(src.format(n=1000)))[0] == sum(range(1000))
    text, _ = await fails(src.format(n=10_000_000), max_execution_steps=1000)
    assert text == "resource limit exceeded: steps"


# --- deadlines and cancellation -------------------------------------------------------------------


async def test_long_builtin_is_killed_within_deadline() -> None:
    srv, _ = make_server(max_execution_time=1.0, max_execution_steps=10**12)
    try:
        await srv.execute("def main():\n    return 1\n", subject=ALICE)  # spawn path warm
        t0 = time.monotonic()
        with pytest.raises(codemode.ResourceLimit) as info:
            # Long builtins that stay far below the memory limit (a single sorted(range(10**8)) may
            # run out of memory first on a fast machine: a different, also correct, outcome).
            src = (
                "def main():\n    n = 0\n    for i in range(1000):\n"
                "        n += len(sorted(range(3000000)))\n    return n\n"
            )
            await srv.execute(src, subject=ALICE)
        elapsed = time.monotonic() - t0
        assert isinstance(info.value, TimeoutError)
        assert elapsed < 1.0 + 0.5, elapsed
    finally:
        await srv.aclose()


async def test_the_workers_own_cpu_limit_is_the_same_deadline_error() -> None:
    # The worker's CPU-seconds rlimit (1 s) fires long before the host's deadline (60 s): the
    # caller gets the same TimeoutError as at the host's deadline, not a plain ResourceLimit.
    srv, _ = make_server(
        runtime=codemode.ProcessRuntime(ProcessOptions(cpu_seconds=1)),
        max_execution_time=60.0,
        max_execution_steps=10**15,
    )
    spin = (
        "def main():\n    n = 0\n    for i in range(1000000):\n"
        "        for j in range(1000000):\n            n += 1\n    return n\n"
    )
    try:
        with pytest.raises(codemode.ResourceLimit) as info:
            await srv.execute(spin, subject=ALICE)
    finally:
        await srv.aclose()
    assert isinstance(info.value, TimeoutError)
    assert client_text(info.value) == "resource limit exceeded: time"


@pytest.mark.parametrize("cap", ["util.sleepy", "util.stubborn", "util.blocking"])
async def test_deadline_returns_on_time_even_if_handler_ignores_it(cap: str) -> None:
    srv, _ = make_server(max_execution_time=0.8)
    try:
        t0 = time.monotonic()
        with pytest.raises(codemode.ResourceLimit):
            await srv.execute(f"def main():\n    return {cap}()\n", subject=ALICE)
        assert time.monotonic() - t0 < 0.8 + 0.4
    finally:
        await srv.aclose()


async def test_client_cancellation_propagates_and_reaps() -> None:
    srv, _ = make_server(max_execution_time=10.0)
    try:
        task = asyncio.create_task(srv.execute("def main():\n    return util.sleepy()\n", subject=ALICE))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await srv.aclose()
    assert srv.runtime._live == set()  # type: ignore[attr-defined]


async def test_concurrent_executes_are_isolated(server: codemode.Server) -> None:
    src = "def main():\n    return util.echo(value='{v}')['value']\n"
    # Three subjects, four each: within a per-subject quota of 4 (if one is set) and the 8 slots.
    subjects = [codemode.authz.Subject(f"tenant{i % 3}") for i in range(12)]
    results = await asyncio.gather(
        *(server.execute(src.format(v=i), subject=s) for i, s in enumerate(subjects))
    )
    assert results == [str(i) for i in range(12)]


async def test_source_that_is_not_text_is_an_invalid_program(server: codemode.Server) -> None:
    for bad in ("def main():\n    return '\ud800'\n", b"def main():\n    return 1\n"):
        with pytest.raises(codemode.InvalidProgram):
            await server.execute(bad, subject=ALICE)  # type: ignore[arg-type]
    assert await server.execute("def main():\n    return 'é€😀'\n", subject=ALICE) == "é€😀"


async def test_exec_frame_carries_only_the_namespaces_the_source_names() -> None:
    rec = Recorder()
    caps = make_capabilities(rec)
    echo = next(c for c in caps if c.name == "util.echo").handler
    caps += [
        codemode.Capability(name=f"bulk{i % 64}.op{i}", summary="Bulk.", handler=echo) for i in range(3000)
    ]
    server = (
        codemode.Builder(authorizer=rec, disabled=["util.hidden.v1"], runtime=codemode.ProcessRuntime())
        .register(*caps)
        .build()
    )
    try:
        executor = server._executor
        names = [e["name"] for e in json.loads(executor.manifest_for("def main():\n    return util.echo"))]
        assert names and all(n.startswith("util.") for n in names)
        assert json.loads(executor.manifest_for("def main():\n    return 1\n")) == []
        bulk = json.loads(executor.manifest_for("x = bulk7  # and records in a comment\n"))
        # Names in comments count too: a harmless superset.
        assert {e["name"].split(".")[0] for e in bulk} == {"bulk7", "records"}
        src = "def main():\n    return [bulk5.op5(value='a')['value'], util.echo(value='b')['value']]\n"
        assert await server.execute(src, subject=ALICE) == ["a", "b"]
        with pytest.raises(codemode.InvalidProgram):
            await server.execute("def main():\n    return bulk5.op6(value='a')\n", subject=ALICE)
    finally:
        await server.aclose()
