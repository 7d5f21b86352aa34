"""Fair worker slots over HTTP: greedy tenants saturating their quota never starve a newcomer."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from codemode.startup.config import ConfigError, load_settings
from tests.support.service import PACK_SPEC, execute, service, settings, write_token_file

GREEDY = "def main():\n    return svc.slow(seconds=4.0)['value']\n"
LIGHT = "def main():\n    return svc.slow(seconds=0.5)['value']\n"


async def test_two_greedy_tenants_at_their_quota_leave_a_slot_for_a_third(tmp_path: Path) -> None:
    # The defaults: 8 slots, per-subject quota 4. Before fair admission the two greedy tenants held
    # all 8 slots and the light tenant waited ~4 s for one, out of a 5 s deadline.
    tokens = write_token_file(tmp_path, ["greedy1", "greedy2", "light"])
    cfg = settings(token_file=tokens.path, packs=[PACK_SPEC])
    assert cfg.subject_quota == 4 and cfg.max_concurrent_executions == 8
    assert cfg.max_execution_time == 5.0
    async with service(cfg) as srv:
        url = srv.mcp_url
        greedy = [
            asyncio.ensure_future(execute(url, tokens[s], GREEDY))
            for s in ("greedy1", "greedy2")
            for _ in range(4)
        ]
        async with asyncio.timeout(20):
            while srv.service.inflight < 8:
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # every greedy execute that can take a slot has one
        t0 = time.monotonic()
        light = await execute(url, tokens["light"], LIGHT)
        elapsed = time.monotonic() - t0
        results = await asyncio.gather(*greedy)
    assert light == {"result": "slept"}, light
    assert elapsed < 3.0, elapsed  # it did not wait for a greedy program to finish
    # Six greedy executes ran at once (8 slots minus the 2 reserved); the other two waited their
    # turn (and may run out of their own deadline doing so): nothing else went wrong.
    assert all(r == {"result": "slept"} or (r[0] == "error" and r[1].startswith("resource")) for r in results)
    assert sum(r == {"result": "slept"} for r in results) >= 4, results


def test_quota_and_slots_are_configured_together() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(allow_all=True, subject_quota=8, max_concurrent_executions=8)
    text = str(info.value)
    assert "--subject-quota / CODEMODE_SUBJECT_QUOTA" in text
    assert "--max-concurrent-executions / CODEMODE_MAX_CONCURRENT_EXECUTIONS" in text
    assert "--reserved-slots / CODEMODE_RESERVED_SLOTS" in text
    with pytest.raises(ConfigError, match="--reserved-slots / CODEMODE_RESERVED_SLOTS"):
        load_settings(allow_all=True, reserved_slots=4, max_concurrent_executions=4)
    # Not configured: the quota follows the slots so that one subject can reach it.
    small = load_settings(allow_all=True, max_concurrent_executions=2)
    assert (small.subject_quota, small.effective_reserved_slots) == (1, 1)
    assert load_settings(allow_all=True, subject_quota=0).subject_quota == 0
