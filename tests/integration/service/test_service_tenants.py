"""Tenants over HTTP: each subject sees its own records only; the per-subject quota holds under load."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.service import (
    PACK_SPEC,
    RECORDS_SPEC,
    call,
    execute,
    mcp_client,
    service,
    settings,
    write_token_file,
)


async def test_two_subjects_see_their_own_records_only(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice", "bob"])
    cfg = settings(token_file=tokens.path, packs=[RECORDS_SPEC])
    async with service(cfg) as srv:
        create = "def main():\n    r = records.create(title=%r, tags=['private'])\n    return r['id']\n"
        async with mcp_client(srv.mcp_url, tokens["alice"]) as alice:
            assert (await call(alice, "execute", source=create % "alice diary"))["result"] == 1
            alice_id = (await call(alice, "execute", source=create % "alice secret"))["result"]
        async with mcp_client(srv.mcp_url, tokens["bob"]) as bob:
            bob_id = (await call(bob, "execute", source=create % "bob groceries"))["result"]
            # Ids are per subject: bob's first record is 1, alice's second is 2.
            assert (alice_id, bob_id) == (2, 1)
            listing = (
                "def main():\n    return [r['title'] for r in records.search(tag='private')['records']]\n"
            )
            assert await call(bob, "execute", source=listing) == {"result": ["bob groceries"]}
            steal = f"def main():\n    return records.get(id={alice_id})['title']\n"
            assert await call(bob, "execute", source=steal) == (
                "error",
                f"capability failed: record {alice_id} not found",
            )
            wipe = f"def main():\n    return records.delete(id={alice_id})\n"
            assert (await call(bob, "execute", source=wipe))[0] == "error"
            # The same id names bob's own record for bob, never alice's.
            own = "def main():\n    return records.get(id=1)['title']\n"
            assert await call(bob, "execute", source=own) == {"result": "bob groceries"}
        async with mcp_client(srv.mcp_url, tokens["alice"]) as alice:
            assert await call(alice, "execute", source=listing) == {"result": ["alice diary", "alice secret"]}
            mine = f"def main():\n    return records.get(id={alice_id})['title']\n"
            assert await call(alice, "execute", source=mine) == {"result": "alice secret"}
            theirs = "def main():\n    return records.get(id=1)['title']\n"
            assert await call(alice, "execute", source=theirs) == {"result": "alice diary"}


SLOW = "def main():\n    return svc.slow(seconds=1.5)['value']\n"


async def test_subject_quota_under_concurrent_load(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice", "bob"])
    cfg = settings(token_file=tokens.path, packs=[PACK_SPEC], subject_quota=1)
    async with service(cfg) as srv:
        url = srv.mcp_url
        results = await asyncio.gather(
            execute(url, tokens["alice"], SLOW),
            execute(url, tokens["alice"], SLOW),
            execute(url, tokens["bob"], SLOW),
        )
        alice = sorted(map(repr, results[:2]))
        assert alice == sorted([repr(("error", "resource limit exceeded: quota")), repr({"result": "slept"})])
        assert results[2] == {"result": "slept"}
        # the quota is released afterwards
        assert await execute(url, tokens["alice"], SLOW) == {"result": "slept"}


async def test_quota_holds_for_many_concurrent_requests(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice", "bob"])
    cfg = settings(token_file=tokens.path, packs=[PACK_SPEC], subject_quota=2, max_concurrent_executions=8)
    async with service(cfg) as srv:
        url = srv.mcp_url
        slower = SLOW.replace("1.5", "3")
        alice = [execute(url, tokens["alice"], slower) for _ in range(6)]
        bob = [execute(url, tokens["bob"], slower) for _ in range(2)]
        results = await asyncio.gather(*alice, *bob)
        ok = [r for r in results[:6] if r == {"result": "slept"}]
        limited = [r for r in results[:6] if r == ("error", "resource limit exceeded: quota")]
        assert len(ok) + len(limited) == 6
        assert 1 <= len(ok) <= 2
        assert results[6:] == [{"result": "slept"}] * 2
