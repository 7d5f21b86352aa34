"""The state pack through real executes: keys across executes, one subject's namespace
(hostile keys, prefixes, cursors, Unicode look-alikes), compare-and-set, TTL and bounds, quotas as
named limits, a Rego policy scoping keys, the store failing as ``internal failure``, and the same
through the official MCP client."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import codemode
from codemode import authz
from codemode.common.errors import client_text
from codemode.mcp import StaticSubject, create_server
from codemode.store import StoreUnavailable
from codemode.store.memory import MemoryStore
from codemode_capabilities.state import StatePack
from tests.support.mcp_client import call, error_text, execute_value, success_value
from tests.support.state import build, main

ROOT = Path(__file__).resolve().parents[3]
ALICE = authz.Subject("alice")
MALLORY = authz.Subject("mallory")


async def run(server: codemode.Server, body: str, subject: authz.Subject = ALICE) -> Any:
    return await server.execute(main(body), subject=subject)


async def fails(server: codemode.Server, body: str, subject: authz.Subject = ALICE) -> str:
    with pytest.raises(codemode.CodeModeError) as info:
        await run(server, body, subject)
    return client_text(info.value)


async def test_put_in_one_execute_get_in_the_next() -> None:
    async with build() as server:
        value = {"n": 1, "tags": ["a", None, True], "x": 1.5, "deep": {"k": [{"z": "ü"}]}}
        assert await run(server, f"return state.put(key='cfg', value={value!r})") == {"version": 1}
        got = await run(server, "return state.get(key='cfg')")
        assert got == {"found": True, "value": value, "version": 1}
        assert await run(server, "return state.get(key='nope')") == {
            "found": False,
            "value": None,
            "version": 0,
        }
        assert (await run(server, "return state.put(key='s', value=None)"))["version"] == 2
        assert await run(server, "return state.get(key='s')") == {"found": True, "value": None, "version": 2}


async def test_another_subject_sees_nothing_whatever_the_key() -> None:
    async with build() as server:
        secrets = ["secret", "alice/secret", "alice:secret", "mallory/x", "caf\u00e9", "cafe\u0301", "\u212a"]
        for key in secrets:
            await run(server, f"return state.put(key={key!r}, value='alice-only')")
        # Keys crafted to look like another namespace, a normalised twin, a prefix listing, a cursor.
        for key in [*secrets, "../alice/secret", "alice\x00secret", "ALICE/secret", "K", "café"]:
            if "\x00" in key:
                continue
            got = await run(server, f"return state.get(key={key!r})", MALLORY)
            assert got == {"found": False, "value": None, "version": 0}, key
        assert await run(server, "return state.list()", MALLORY) == {"keys": []}
        assert await run(server, "return state.list(prefix='alice')", MALLORY) == {"keys": []}
        assert await run(server, "return state.list(after='a')", MALLORY) == {"keys": []}
        assert await run(server, "return state.delete(key='secret')", MALLORY) == {"deleted": False}
        # Mallory's own key of the same name is his; alice's is untouched.
        await run(server, "return state.put(key='secret', value='mallory')", MALLORY)
        assert (await run(server, "return state.get(key='secret')"))["value"] == "alice-only"
        # Unicode look-alikes are different keys, never folded together.
        assert (await run(server, "return state.get(key='cafe\u0301')"))["found"] is True
        assert (await run(server, "return state.get(key='K')"))["found"] is False


async def test_compare_and_set_and_a_conflict_attempt_can_catch() -> None:
    async with build() as server:
        assert await run(server, "return state.put(key='c', value=1, expect=0)") == {"version": 1}
        body = """
r = attempt(state.put, key='c', value=2, expect=0)
s = attempt(state.put, key='c', value=3, expect=1)
t = attempt(state.delete, key='c', expect=1)
return [r, s, t, state.get(key='c')]
"""
        r, s, t, g = await run(server, body)
        assert r == {"ok": False, "error": "capability failed: version conflict"}
        assert s["ok"] is True and s["value"]["version"] > 1
        assert t == {"ok": False, "error": "capability failed: version conflict"}
        assert g == {"found": True, "value": 3, "version": s["value"]["version"]}
        text = await fails(server, "return state.put(key='c', value=4, expect=1)")
        assert text == "capability failed: version conflict"


async def test_a_race_between_two_executes_of_one_subject_has_one_winner() -> None:
    async with build() as server:
        await run(server, "return state.put(key='counter', value=0)")
        body = """
g = state.get(key='counter')
r = attempt(state.put, key='counter', value=g['value'] + 1, expect=g['version'])
return r['ok']
"""
        results = await asyncio.gather(*(run(server, body) for _ in range(6)))
        final = await run(server, "return state.get(key='counter')")
        # Every winner's put counted: no lost update, whatever the interleaving.
        assert final["value"] == sum(1 for ok in results if ok) >= 1


async def test_list_pages_are_bounded_and_the_cursor_walks_them() -> None:
    async with build() as server:
        await run(
            server,
            "for i in range(7):\n        state.put(key='job/%d' % i, value=i)\nstate.put(key='x', value=0)",
        )
        first = await run(server, "return state.list(prefix='job/', limit=3)")
        assert [e["key"] for e in first["keys"]] == ["job/0", "job/1", "job/2"] and first["next"] == "job/2"
        body = """
keys, after = [], None
for _ in range(10):
    page = state.list(prefix='job/', after=after, limit=3)
    keys.extend([e['key'] for e in page['keys']])
    after = page.get('next')
    if after == None:
        break
return keys
"""
        assert await run(server, body) == [f"job/{i}" for i in range(7)]
        assert (await fails(server, "return state.list(limit=101)")).startswith(
            "invalid capability arguments"
        )
        assert (await fails(server, "return state.list(limit=0)")).startswith("invalid capability arguments")


async def test_key_ttl_and_value_bounds() -> None:
    async with build() as server:
        assert (await fails(server, "return state.get(key='')")).startswith("invalid capability arguments")
        too_long = await fails(server, "return state.get(key='x' * 257)")
        assert too_long == 'invalid capability arguments: argument "key" must be 1 to 256 UTF-8 bytes'
        assert (await fails(server, "return state.put(key='k', value=1, ttl=0)")).startswith(
            "invalid capability"
        )
        assert (await fails(server, "return state.put(key='k', value=1, ttl=2592001)")).startswith("invalid")
        assert (await fails(server, "return state.put(key='k', value=1, expect=-1)")).startswith("invalid")
        # A value that is not JSON-shaped does not bind.
        text = await fails(server, "return state.put(key='k', value=lambda: 1)")
        assert text.startswith("invalid capability arguments")
        await run(server, "return state.put(key='t', value='soon', ttl=60)")
        assert (await run(server, "return state.get(key='t')"))["found"] is True


async def test_quotas_are_named_limits_and_lose_nothing() -> None:
    async with build(max_state_keys=2, max_state_bytes=200) as server:
        await run(server, "state.put(key='a', value=1)\nstate.put(key='b', value=2)")
        assert (
            await fails(server, "return state.put(key='c', value=3)") == "resource limit exceeded: state keys"
        )
        assert await fails(server, "return state.put(key='a', value='x' * 300)") == (
            "resource limit exceeded: state bytes"
        )
        assert (await run(server, "return state.get(key='a')"))["value"] == 1  # nothing lost
        # Another subject's quota is its own.
        await run(server, "state.put(key='a', value=1)\nstate.put(key='b', value=2)", MALLORY)


class _Down(MemoryStore):
    async def state_get(self, subject_id: str, key: str, now: float) -> Any:
        raise StoreUnavailable("connection refused by db.internal:5432")


async def test_a_store_that_cannot_answer_is_an_internal_failure(caplog: pytest.LogCaptureFixture) -> None:
    async with build(_Down()) as server:
        text = await fails(server, "return attempt(state.get, key='k')")
        assert text == "internal failure"
        assert "db.internal" in caplog.text  # the host log says why; the client does not


async def test_a_rego_policy_scopes_keys_to_a_prefix() -> None:
    """The policy docs/packs.md shows, as written."""
    rego = pytest.importorskip("codemode.authz.rego")
    blocks = re.findall(r"^```rego\n(.*?)^```", (ROOT / "docs" / "packs.md").read_text(), re.M | re.S)
    (policy,) = [b for b in blocks if "public/" in b]
    authorizer = rego.RegoAuthorizer("data.codemode.authz.allow", {"authz.rego": policy})
    async with build(authorizer=authorizer) as server:
        await run(server, "return state.put(key='public/a', value=1)")
        assert await fails(server, "return state.put(key='private/a', value=1)") == "permission denied"
        assert await fails(server, "return state.list()") == "permission denied"
        assert await fails(server, "return state.get(key='publicx')") == "permission denied"
        assert await fails(server, "return state.delete(key='private/a')") == "permission denied"
        assert (await run(server, "return state.list(prefix='public/')"))["keys"][0]["key"] == "public/a"


def test_library_use_without_a_data_dir_keeps_state_in_memory() -> None:
    from codemode.packs import PackSettings

    caps = StatePack().capabilities(PackSettings(environ={}))
    assert [c.name for c in caps] == ["state.get", "state.put", "state.delete", "state.list"]
    server = codemode.Builder(authorizer=authz.allow_all()).register(*caps).build()
    assert server.plan.store is not None and server.plan.store.name == "memory"


async def test_through_the_official_mcp_client() -> None:
    server = build()
    try:
        async with Client(create_server(server, StaticSubject("alice"))) as alice:
            put = "def main():\n    return state.put(key='n', value={'a': [1, 2]})\n"
            assert execute_value(await call(alice, "execute", source=put)) == {"version": 1}
            get = "def main():\n    return state.get(key='n')\n"
            got = execute_value(await call(alice, "execute", source=get))
            assert got == {"found": True, "value": {"a": [1, 2]}, "version": 1}
            described = success_value(await call(alice, "describe_api", name="state.put"))
            assert described["signature"].startswith("state.put(*, key: str, value: json")
            assert {"name": "value", "type": "json", "required": True} in described["input"]
            got_desc = success_value(await call(alice, "describe_api", name="state.get"))
            assert {"name": "value", "type": "json", "required": True} in got_desc["output"]
        async with Client(create_server(server, StaticSubject("bob"))) as bob:
            got = execute_value(await call(bob, "execute", source=get))
            assert got == {"found": False, "value": None, "version": 0}
            text = error_text(
                await call(bob, "execute", source="def main():\n    return state.put(key='', value=1)\n")
            )
            assert text.startswith("invalid capability arguments")
    finally:
        await server.aclose()


@pytest.mark.timeout(120)
def test_the_packs_page_example_runs_as_written(tmp_path: Path) -> None:
    from tests.integration.test_doc_snippets import block_with
    from tests.integration.test_readme_snippet import run_script

    source = block_with("docs/packs.md", "from codemode_capabilities.state import pack")
    assert run_script(source, tmp_path, "state_demo.py") == ["1", "2", "1"]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_prefix_is_plain_text_not_a_pattern(kind: str, tmp_path: Path) -> None:
    from codemode.store.sqlite import SqliteStore

    store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "store.sqlite3")
    async with build(store) as server:
        for key in ["a%b", "axb", "a_c", "abc", "A%b", "a\\%"]:
            await run(server, f"return state.put(key={key!r}, value=1)")
        listed = await run(server, "return [e['key'] for e in state.list(prefix='a%')['keys']]")
        assert listed == ["a%b"]
        listed = await run(server, "return [e['key'] for e in state.list(prefix='a_')['keys']]")
        assert listed == ["a_c"]
        listed = await run(server, "return [e['key'] for e in state.list(prefix='a\\\\')['keys']]")
        assert listed == ["a\\%"]


@pytest.mark.timeout(120)
async def test_serve_stdio_keeps_keys_between_executes_of_one_session(tmp_path: Path) -> None:
    """``codemode serve --stdio --pack codemode_capabilities.state:pack`` (no data dir: memory), the
    official client over stdio: put in one execute, get in the next."""
    from mcp import StdioServerParameters

    from tests.support.mcp_client import child_env, cli_command

    argv = cli_command("serve", "--stdio", "--allow-all", "--pack", "codemode_capabilities.state:pack")
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=child_env(), cwd=str(tmp_path))
    async with Client(params, mode="legacy") as client:
        put = "def main():\n    return state.put(key='todo', value=['milk'], ttl=600)\n"
        assert execute_value(await call(client, "execute", source=put)) == {"version": 1}
        get = "def main():\n    return state.get(key='todo')\n"
        assert execute_value(await call(client, "execute", source=get)) == {
            "found": True,
            "value": ["milk"],
            "version": 1,
        }
