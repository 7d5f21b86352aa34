"""The call ledger, recoverable calls and prints through the official MCP client (in memory, both
client modes): the shapes of docs/reference/tools.md, checked by ``support_mcp.execute_report``."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import mcp_types as types
import pytest
from mcp import Client

import codemode
from codemode.mcp import tool_definitions
from tests.support.mcp_client import (
    CLIENT_MODES,
    CountingResolver,
    assert_coarse,
    build,
    call,
    call_raw,
    error_text,
    execute_report,
    execute_value,
    ledger,
    mcp_for,
)
from tests.support.recorder import Recorder

pytestmark = pytest.mark.parametrize("mode", CLIENT_MODES)

EXECUTE_SCHEMA = next(t for t in tool_definitions() if t.name == "execute").output_schema


def conforms(result: types.CallToolResult) -> dict[str, Any]:
    """The execute report, which also satisfies the published output schema (errors included: the
    client validates only successes)."""
    out = execute_report(result)
    jsonschema.validate(out, EXECUTE_SCHEMA)
    return out


async def execute_once(server: codemode.Server, mode: str, source: str) -> types.CallToolResult:
    """One execute through a fresh client; the server is closed afterwards."""
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            return await call(client, "execute", source=source)
    finally:
        await server.aclose()


async def test_every_execute_result_carries_the_ledger(mode: str) -> None:
    server = build(authorizer=Recorder(deny={"records.delete"}))
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            ok = await call(
                client, "execute", source="def main():\n    return records.create(title='a')['id']\n"
            )
            assert execute_value(ok) == 1
            assert ledger(ok) == [("records.create", "ok")]
            assert ok.content[0].text == '{"result":1}'  # type: ignore[union-attr]  # as before the ledger
            assert ok.content[1].text == '{"calls":[{"capability":"records.create","outcome":"ok"}]}'  # type: ignore[union-attr]

            src = (
                "def main():\n"
                "    r = records.create(title='b')\n"
                "    records.get(id=r['id'])\n"
                "    return records.delete(id=r['id'])\n"
            )
            denied = await call(client, "execute", source=src)
            assert error_text(denied) == "permission denied"
            assert conforms(denied)["error"] == "permission denied"
            assert ledger(denied) == [
                ("records.create", "ok"),
                ("records.get", "ok"),
                ("records.delete", "denied"),
            ]

            bad = await call(client, "execute", source="def main(:\n")
            assert error_text(bad).startswith("invalid program: <codemode>:1:")
            assert ledger(bad) == []
            wrong = await call_raw(client, "execute", {"source": 1})
            assert (
                error_text(wrong)
                == 'invalid tool arguments: execute takes exactly one argument, "source", a string'
            )
            assert conforms(wrong)["calls"] == []
            # search_api and describe_api keep their one-block shapes.
            missing = await call(client, "describe_api", name="records.nope")
            assert missing.structured_content is None and error_text(missing) == "capability not found"
    finally:
        await server.aclose()


async def test_the_ledger_of_a_refused_request_is_empty(mode: str) -> None:
    server = build()
    resolver = CountingResolver(fail=RuntimeError("token db at /var/secret"))
    try:
        async with Client(mcp_for(server, resolver), mode=mode) as client:
            refused = await call(client, "execute", source="def main():\n    return 1\n")
        assert error_text(refused) == "unauthenticated"
        assert conforms(refused) == {"error": "unauthenticated", "calls": []}
        assert "secret" not in refused.model_dump_json()
    finally:
        await server.aclose()


async def test_the_ledger_shows_what_ran_before_a_limit(mode: str) -> None:
    server = build(limits=codemode.Limits(max_native_calls=3))
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            src = "def main():\n    for i in range(10):\n        records.create(title='t%d' % i)\n"
            result = await call(client, "execute", source=src)
            assert error_text(result) == "resource limit exceeded: native calls"
            assert ledger(result) == [("records.create", "ok")] * 3
            found = await call(
                client, "execute", source="def main():\n    return len(records.search()['records'])\n"
            )
            assert execute_value(found) == 3  # exactly what the ledger said had happened
    finally:
        await server.aclose()


async def test_no_host_detail_reaches_the_ledger(mode: str) -> None:
    server = build(authorizer=Recorder(deny={"records.get"}, fail_policy={"records.search"}))
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            for src in (
                "def main():\n    return attempt(records.get, id=1)\n",
                "def main():\n    return records.search()\n",
                "def main():\n    return records.get(id=99)\n",
            ):
                result = await call(client, "execute", source=src)
                text = result.model_dump_json()
                assert "SECRET" not in text and "records.entry" not in text  # no policy text, no ids
                for entry in conforms(result)["calls"]:
                    assert entry["capability"].startswith("records.")
                if result.is_error:
                    assert_coarse(error_text(result))
    finally:
        await server.aclose()


# ------------------------------------------------------------------------------ recoverable calls


async def test_a_program_recovers_from_a_denial_with_attempt(mode: str) -> None:
    server = build(authorizer=Recorder(deny={"records.delete"}))
    src = (
        "def main():\n"
        "    r = records.create(title='draft')\n"
        "    d = attempt(records.delete, id=r['id'])\n"
        "    if not d['ok']:\n"
        "        records.update(id=r['id'], title='draft (could not delete: %s)' % d['error'])\n"
        "    missing = attempt(records.get, id=999)\n"
        "    typo = attempt(records.get, id='1')\n"
        "    title = records.get(id=r['id'])['title']\n"
        "    return {'delete': d, 'missing': missing, 'typo': typo, 'title': title}\n"
    )
    result = await execute_once(server, mode, src)
    value = execute_value(result)
    assert value["delete"] == {"ok": False, "error": "permission denied"}
    assert value["missing"]["ok"] is False and value["missing"]["error"].startswith("capability failed")
    assert value["typo"] == {
        "ok": False,
        "error": 'invalid capability arguments: argument "id" must be int, got str',
    }
    assert value["title"] == "draft (could not delete: permission denied)"
    assert ledger(result) == [
        ("records.create", "ok"),
        ("records.delete", "denied"),
        ("records.update", "ok"),
        ("records.get", "failed"),
        ("records.get", "invalid arguments"),
        ("records.get", "ok"),
    ]


async def test_attempt_does_not_recover_from_a_limit(mode: str) -> None:
    server = build(limits=codemode.Limits(max_value_bytes=300))
    src = (
        "def main():\n"
        "    records.create(title='x' * 100)\n"
        "    records.create(title='y' * 100)\n"
        "    big = attempt(records.search)\n"
        "    return 'recovered'\n"
    )
    result = await execute_once(server, mode, src)
    assert error_text(result) == "resource limit exceeded: value size"
    assert ledger(result) == [
        ("records.create", "ok"),
        ("records.create", "ok"),
        ("records.search", "limit exceeded"),
    ]


# ------------------------------------------------------------------------------------------ prints


async def test_prints_are_off_by_default(mode: str) -> None:
    result = await execute_once(build(), mode, "def main():\n    print('hello')\n    return 1\n")
    assert conforms(result) == {"result": 1, "calls": []}
    assert len(result.content) == 2


async def test_prints_come_back_beside_the_result_bounded_and_marked(mode: str) -> None:
    server = build(limits=codemode.Limits(max_print_bytes=40))
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            src = (
                "def main():\n    print('start', 1)\n    r = records.create(title='p')\n"
                "    print('id', r['id'])\n    return r['id']\n"
            )
            result = await call(client, "execute", source=src)
            out = conforms(result)
            assert out == {
                "result": 1,
                "calls": [{"capability": "records.create", "outcome": "ok"}],
                "prints": "start 1\nid 1\n",
            }
            assert result.content[2].text == json.dumps({"prints": "start 1\nid 1\n"}, separators=(",", ":"))  # type: ignore[union-attr]

            quiet = conforms(await call(client, "execute", source="def main():\n    return 2\n"))
            assert quiet == {"result": 2, "calls": [], "prints": ""}

            flood = (
                "def main():\n    for i in range(1000):\n        print('line %d' % i)\n    return 'done'\n"
            )
            cut = conforms(await call(client, "execute", source=flood))
            assert cut["result"] == "done"
            assert cut["prints"] == "line 0\nline 1\nline 2\nline 3\nline 4\nline \n[prints truncated]"

            failing = "def main():\n    print('about to fail')\n    fail('boom')\n"
            failed = await call(client, "execute", source=failing)
            assert error_text(failed) == "invalid program: <codemode>:3:5: fail: boom"
            assert conforms(failed)["prints"] == "about to fail\n"
    finally:
        await server.aclose()


# ---------------------------------------------------------------------------------- in a container


@pytest.mark.docker
async def test_ledger_attempt_and_prints_inside_a_docker_worker(mode: str, docker_api: Any) -> None:
    # The same frames through the Docker attach stream and the confined worker of the image under
    # test (CODEMODE_TEST_WORKER_IMAGE, else the default tag): it must be built from this tree.
    from codemode.runtimes.docker import DockerRuntime

    server = build(
        authorizer=Recorder(deny={"records.delete"}),
        limits=codemode.Limits(max_print_bytes=64),
        runtime=DockerRuntime(),
    )
    src = (
        "def main():\n"
        "    r = records.create(title='in a container')\n"
        "    print('created', r['id'])\n"
        "    d = attempt(records.delete, id=r['id'])\n"
        "    bad = attempt(records.get, id='x')\n"
        "    print('delete:', d['ok'])\n"
        "    return records.get(id=99)\n"
    )
    result = await execute_once(server, mode, src)
    assert error_text(result) == "capability failed: record 99 not found"
    assert conforms(result)["prints"] == "created 1\ndelete: False\n"
    assert ledger(result) == [
        ("records.create", "ok"),
        ("records.delete", "denied"),
        ("records.get", "invalid arguments"),
        ("records.get", "failed"),
    ]
