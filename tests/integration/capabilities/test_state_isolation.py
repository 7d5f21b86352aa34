"""Hostile review of the state pack: a tenant writing programs tries to reach, learn
about or starve another subject's keys, on each store (memory, SQLite, the real PostgreSQL of
tests/support/postgres.py). Each attack has a defined outcome; the strongest form is a probe program whose
whole output must be identical whether or not another subject holds keys (no signal depends on them).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.common.errors import client_text
from codemode.store.memory import MemoryStore
from codemode.store.postgres import PostgresStore
from codemode.store.sqlite import SqliteStore
from codemode_capabilities.state import capabilities
from tests.support import postgres
from tests.support.state import build, main

ALICE = authz.Subject("tenant")
# Subject ids that look like alice's namespace with a separator, a prefix or a case change.
LOOKALIKES = [authz.Subject(s) for s in ("tenant/", "tenan", "TENANT", "tenant:x", "tenant\u0301")]
MALLORY = LOOKALIKES[0]

ALICE_KEYS = ["secret", "a/b", "a:b", "%", "_", "\\", "caf\u00e9", "\U0001f600" * 64, "k" * 256]


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
    elif request.param == "sqlite":
        yield SqliteStore(tmp_path / "state.sqlite3")
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        postgres.reset(dsn)
        yield PostgresStore(dsn)


async def run(server: codemode.Server, body: str, subject: authz.Subject = ALICE) -> Any:
    return await server.execute(main(body), subject=subject)


async def outcome(server: codemode.Server, body: str, subject: authz.Subject = ALICE) -> Any:
    """The program's value, or the client's text of the error that ended it."""
    try:
        return await run(server, body, subject)
    except codemode.CodeModeError as exc:
        return "error: " + client_text(exc)


# Every read, write, delete and listing an attacker can aim at alice's names, as attempt records.
PROBE_KEYS = [*ALICE_KEYS, "tenant/secret", "../tenant/secret", "TENANT/secret", "cafe\u0301"]
PROBE = (
    f"keys = {PROBE_KEYS!r}\n"
    + """
out = []
for k in keys:
    out.append(attempt(state.get, key=k))
    out.append(attempt(state.delete, key=k, expect=1))
    out.append(attempt(state.delete, key=k, expect=0))
for p in ['', 's', 'a/', '%', '_', '\\\\', 'caf', 'k']:
    out.append(attempt(state.list, prefix=p))
    out.append(attempt(state.list, prefix=p, limit=1))
for a in ['\\x01', 'a', 'r', 'secret', '\\U0010ffff', 'z' * 256]:
    out.append(attempt(state.list, after=a))
out.append(attempt(state.list, after=''))
out.append(attempt(state.get, key='secret\\x00'))
out.append(attempt(state.get, key='k' * 257))
out.append(state.put(key='probe', value=1))
return out
"""
)


async def test_a_probe_sees_the_same_whether_or_not_another_subject_has_keys(store: Any) -> None:
    async with build(store) as server:
        before = {s.id: await outcome(server, PROBE, s) for s in LOOKALIKES}
        for key in ALICE_KEYS:
            await run(server, f"return state.put(key={key!r}, value={{'owner': 'tenant'}})")
        for _ in range(5):  # alice's activity moves her own version counter only
            await run(server, "return state.put(key='secret', value=1)")
        # Fresh subjects (a probe's own put changed the first run's subjects' state).
        fresh = [authz.Subject(s.id + "2") for s in LOOKALIKES]
        after = {s.id[:-1]: await outcome(server, PROBE, s) for s in fresh}
        assert after == before
        # What the probe saw: nothing of alice's, and a first version of 1 (not alice's count).
        seen = before[MALLORY.id]
        assert seen[-1] == {"version": 1}
        assert all(r == {"ok": True, "value": {"keys": []}} for r in seen if "keys" in str(r)), seen
        # The probes' deletes and puts left every one of alice's keys as it was.
        listed = await run(server, "return [e['key'] for e in state.list(limit=100)['keys']]")
        assert sorted(listed) == sorted(ALICE_KEYS)
        for key in ALICE_KEYS:
            got = await run(server, f"return state.get(key={key!r})")
            assert got["found"] is True and got["value"] in ({"owner": "tenant"}, 1), key


async def test_one_subject_at_its_quota_leaves_another_whole(store: Any) -> None:
    async with build(store, max_state_keys=3, max_state_bytes=300) as server:
        full = "for i in range(10):\n        state.put(key='m%d' % i, value='x' * 50)"
        assert await outcome(server, full, MALLORY) == "error: resource limit exceeded: state keys"
        big = "return state.put(key='m0', value='y' * 400)"
        assert await outcome(server, big, MALLORY) == "error: resource limit exceeded: state bytes"
        # alice has her whole quota: three keys, and bytes up to the bound.
        mine = "for i in range(3):\n        state.put(key='a%d' % i, value='z' * 80)\nreturn state.list()"
        listed = await run(server, mine)
        assert [e["key"] for e in listed["keys"]] == ["a0", "a1", "a2"]
        assert await outcome(server, "return state.put(key='a0', value='z' * 120)") == {"version": 4}


async def test_a_compare_and_set_raced_inside_parallel_has_one_winner(store: Any) -> None:
    async with build(store) as server:
        race = "return parallel([(state.put, {'key': 'lock', 'value': i, 'expect': 0}) for i in range(8)])"
        mallory = await run(server, race, MALLORY)  # same key, another namespace: no interference
        results = await run(server, race)
        for rs in (results, mallory):
            winners = [r for r in rs if r["ok"]]
            assert len(winners) == 1, rs
            assert all(r["error"] == "capability failed: version conflict" for r in rs if not r["ok"])
        got = await run(server, "return state.get(key='lock')")
        assert got["version"] == 1 and got["value"] == results.index({"ok": True, "value": {"version": 1}})
        # Eight parallel plain puts of one key: every one lands, versions distinct, the last kept.
        puts = await run(server, "return parallel([(state.put, {'key': 'n', 'value': i}) for i in range(8)])")
        versions = sorted(r["value"]["version"] for r in puts)
        assert len(set(versions)) == 8
        assert (await run(server, "return state.get(key='n')"))["version"] == versions[-1]


# Arguments at and past every bound; each must be refused as the caller's error (attempt catches it),
# never stored, and never an internal failure (a backend that chokes on an edge value).
REFUSED = [
    "key=''",
    "key='k' * 257",
    "key='\\U0001f600' * 65",
    "key='a\\x00b'",
    "key='k', ttl=0",
    "key='k', ttl=-1",
    "key='k', ttl=2592001",
    "key='k', ttl=1.5",
    "key='k', ttl=9223372036854775807",
    "key='k', expect=-1",
    "key='k', expect=9223372036854775808",
    "key='k', value=float('nan')",
    "key='k', value=float('inf')",
    "key='k', value=[float('-inf')]",
    "key='k', value=9223372036854775808",
    "key='k', value={1: 2}",
]


async def test_edge_arguments_are_refused_as_the_callers_error_on_every_store(store: Any) -> None:
    async with build(store) as server:
        for args in REFUSED:
            call = f"state.put, {args}" if "value=" in args else f"state.put, value=1, {args}"
            text = await outcome(server, f"return attempt({call})")
            assert isinstance(text, dict) and text["ok"] is False, (args, text)
            assert text["error"].startswith("invalid capability arguments"), (args, text)
        assert await run(server, "return state.list()") == {"keys": []}
        # Accepted edges keep their values exactly.
        edges = [
            "key='k' * 256, value=9223372036854775807",
            "key='\\U0001f600' * 64, value=-9223372036854775808",
            "key=' ', value=-0.0, ttl=2592000",
            "key='e', value=1e308, expect=0",
            "key='f', value=5e-324, ttl=1",
        ]
        for args in edges:
            assert "version" in await run(server, f"return state.put({args})"), args
        got = await run(
            server,
            "return [state.get(key=k)['value'] for k in ['k' * 256, '\\U0001f600' * 64, ' ', 'e', 'f']]",
        )
        assert got == [9223372036854775807, -9223372036854775808, -0.0, 1e308, 5e-324]


async def test_values_at_the_depth_and_byte_limits(store: Any) -> None:
    async with build(store, max_value_depth=8, max_value_bytes=2048) as server:
        deep = "v = 1\nfor _ in range(%d):\n    v = [v]\nreturn attempt(state.put, key='d', value=v)"
        ok = await outcome(server, deep % 6)
        assert ok["ok"] is True, ok
        too_deep = await outcome(server, deep % 40)
        assert isinstance(too_deep, str) and too_deep.startswith("error: resource limit exceeded"), too_deep
        too_big = await outcome(server, "return attempt(state.put, key='b', value='x' * 4096)")
        assert isinstance(too_big, str) and too_big.startswith("error: resource limit exceeded"), too_big
        listed = await run(server, "return [e['key'] for e in state.list()['keys']]")
        assert listed == ["d"]


async def test_a_store_error_reaches_the_client_as_internal_failure_only(tmp_path: Path) -> None:
    """A SQLite file that cannot be opened (its directory is a file): the client reads
    ``internal failure``, never the path or SQLite's message."""
    blocker = tmp_path / "private-dir-name"
    blocker.write_text("not a directory")
    async with build(SqliteStore(blocker / "state.sqlite3")) as server:
        for body in ("return attempt(state.get, key='k')", "return state.put(key='k', value=1)"):
            text = await outcome(server, body)
            assert text == "error: internal failure", text


async def test_every_value_put_accepts_can_be_read_back(store: Any) -> None:
    """A value at the argument limits was stored, then every ``state.get`` of it ended the execute
    (its result wraps the value one level deeper and in more bytes): the key was stuck. ``put``
    refuses such a value the way a too-large argument is refused."""
    async with build(store, max_value_depth=8, max_value_bytes=2048) as server:
        nest = "v = 1\nfor _ in range(%d):\n    v = [v]\nreturn attempt(state.put, key='d%d', value=v)"
        sized = "return attempt(state.put, key='s%d', value='x' * %d)"
        programs = [nest % (n, n) for n in range(4, 10)] + [sized % (n, n) for n in range(1990, 2050, 3)]
        stored = 0
        for body in programs:
            put = await outcome(server, body)
            if put == "error: resource limit exceeded: value size":
                continue
            assert put["ok"] is True, (body, put)
            stored += 1
        listed = await run(server, "return [e['key'] for e in state.list(limit=100)['keys']]")
        assert len(listed) == stored >= 4
        for key in listed:
            got = await outcome(server, f"return state.get(key={key!r})['found']")
            assert got is True, (key, got)


WALKED = [
    "a%b",
    "axb",
    "a_c",
    "a\\%",
    "A%b",
    "Z",
    "a",
    "\u00e9",
    "\uffff",
    "\U00010000",
    "\U0010ffff",
    "a\U0001f600",
]


async def test_every_store_walks_pages_in_code_point_order_and_a_prefix_is_plain_text(store: Any) -> None:
    """One order on every store (PostgreSQL's "C" collation, SQLite's bytes, Python's code points),
    so a cursor neither skips nor repeats a key; ``%``, ``_`` and ``\\`` match only themselves."""
    async with build(store) as server:
        for key in WALKED:
            await run(server, f"return state.put(key={key!r}, value=1)")
        walk = """
seen = []
after = None
for _ in range(50):
    page = state.list(prefix=%r, after=after, limit=1) if after else state.list(prefix=%r, limit=1)
    seen.extend([e['key'] for e in page['keys']])
    after = page.get('next')
    if not after:
        break
return seen
"""
        for prefix in ["", "a", "a%", "a_", "a\\", "\U0001f600"]:
            got = await run(server, walk % (prefix, prefix))
            assert got == sorted(k for k in WALKED if k.startswith(prefix)), prefix


async def test_parallel_puts_cannot_overshoot_a_quota(store: Any) -> None:
    async with build(store, max_state_keys=3, max_state_bytes=1000, max_parallel_calls=10) as server:
        burst = "return parallel([(state.put, {'key': 'k%d' % i, 'value': 'v' * 100}) for i in range(10)])"
        assert await outcome(server, burst) == "error: resource limit exceeded: state keys"
        assert len((await run(server, "return state.list()"))["keys"]) == 3
        burst = "return parallel([(state.put, {'key': 'b%d' % i, 'value': 'v' * 400}) for i in range(10)])"
        assert await outcome(server, burst, MALLORY) == "error: resource limit exceeded: state bytes"
        assert len((await run(server, "return state.list()", MALLORY))["keys"]) == 2


async def test_no_argument_names_a_namespace(store: Any) -> None:
    async with build(store) as server:
        await run(server, "return state.put(key='secret', value=1)")
        for call in [
            "state.get, key='secret', subject='tenant'",
            "state.get, key='secret', subject_id='tenant'",
            "state.list, namespace='tenant'",
            "state.put, key='secret', value=2, owner='tenant'",
            "state.delete, key='secret', subject='tenant'",
        ]:
            got = await outcome(server, f"return attempt({call})", MALLORY)
            assert got["ok"] is False and got["error"].startswith("invalid capability arguments"), (call, got)
        assert await run(server, "return state.get(key='secret')") == {
            "found": True,
            "value": 1,
            "version": 1,
        }


async def test_a_prefix_policy_holds_against_path_like_keys() -> None:
    """Keys are literal text: ``public/../private/a`` passes a ``public/`` policy and is its own key,
    never ``private/a``; a listing under ``public/`` with a cursor past it shows nothing else."""
    rego = pytest.importorskip("codemode.authz.rego")
    root = Path(__file__).resolve().parents[3]
    text = (root / "docs" / "packs.md").read_text()
    (policy,) = [b for b in re.findall(r"^```rego\n(.*?)^```", text, re.M | re.S) if "public/" in b]
    store = MemoryStore()
    async with build(store) as open_server:
        await run(open_server, "return state.put(key='private/a', value='hidden')")
    authorizer = rego.RegoAuthorizer("data.codemode.authz.allow", {"authz.rego": policy})
    builder = codemode.Builder(authorizer=authorizer, store=store)
    async with builder.register(*capabilities()).build() as server:
        got = await run(server, "return state.get(key='public/../private/a')")
        assert got == {"found": False, "value": None, "version": 0}
        await run(server, "return state.put(key='public/../private/a', value='mine')")
        listed = await run(server, "return state.list(prefix='public/', after='public/')")
        assert [e["key"] for e in listed["keys"]] == ["public/../private/a"]
        assert (
            await outcome(server, "return state.list(prefix='', after='public/')")
            == "error: permission denied"
        )
    async with build(store) as open_server:
        assert (await run(open_server, "return state.get(key='private/a')"))["value"] == "hidden"


@pytest.mark.timeout(180)
async def test_a_burst_of_large_parallel_puts_does_not_fail_another_subjects_calls(store: Any) -> None:
    """The store is shared (SQLite's one thread, PostgreSQL's pool of 8 connections and its 2 s
    answer bound): one subject's executes, each a parallel(...) of ten 90 KB puts, run beside
    another subject's gets, which all answer."""
    async with build(store) as server:
        await run(server, "return state.put(key='mine', value='alice')")
        burst = (
            "for r in range(3):\n"
            "    rs = parallel([(state.put, {'key': 'k%d' % i, 'value': 'x' * 90000}) for i in range(10)])\n"
            "    if not all([x['ok'] for x in rs]):\n"
            "        fail(rs)\n"
            "return len(rs)"
        )

        async def alice() -> list[Any]:
            return [await outcome(server, "return state.get(key='mine')['value']") for _ in range(6)]

        results = await asyncio.gather(*(outcome(server, burst, MALLORY) for _ in range(4)), alice())
        assert results[-1] == ["alice"] * 6, results[-1]
        assert results[:-1] == [10] * 4, results[:-1]
