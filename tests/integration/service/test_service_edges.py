"""Auth and observability edges: a deleted token file fails closed, JWT subjects are checked like
token-file subjects, /metrics is off the main port and never labelled by subject id."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

from codemode.startup.config import load_settings
from tests.support.service import (
    AUDIENCE,
    ISSUER,
    PACK_SPEC,
    RECORDS_SPEC,
    execute,
    http_get,
    make_jwt_issuer,
    scrape,
    service,
    settings,
    write_token_file,
)

ECHO = "def main():\n    return svc.echo(value='x')['value']\n"
SLOW = "def main():\n    return svc.slow(seconds=1.5)['value']\n"


async def _status(url: str, token: str) -> int:
    async with httpx.AsyncClient(timeout=15) as http:
        resp = await http.post(
            url,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2025-06-18",
            },
        )
        return resp.status_code


async def test_deleting_the_token_file_fails_closed_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    saved = tokens.path.read_bytes()
    async with service(settings(token_file=tokens.path, packs=[PACK_SPEC])) as srv:
        assert await execute(srv.mcp_url, tokens["alice"], ECHO) == {"result": "x"}
        tokens.path.unlink()
        await asyncio.sleep(1.2)  # past the reload interval
        with caplog.at_level(logging.ERROR, logger="codemode.service.auth"):
            for _ in range(3):
                assert await _status(srv.mcp_url, tokens["alice"]) == 401
                await asyncio.sleep(1.1)
        gone = [r for r in caplog.records if "token file" in r.getMessage()]
        assert len(gone) == 1, [r.getMessage() for r in gone]
        # Restored: accepted again.
        tokens.path.write_bytes(saved)
        await asyncio.sleep(1.2)
        assert await execute(srv.mcp_url, tokens["alice"], ECHO) == {"result": "x"}


async def test_a_broken_reload_keeps_only_tokens_still_listed(tmp_path: Path) -> None:
    """Found by review: removing bob's line while mistyping another kept bob's token valid (the whole
    previous set was kept after a failed reload)."""
    import hashlib

    from codemode.service.auth import TokenFileAuthenticator

    def digest(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    path = tmp_path / "tokens.txt"
    path.write_text(f"{digest('alice-token')} alice\n{digest('bob-token')} bob\n")
    auth = TokenFileAuthenticator(path, reload_interval=0)
    assert (await auth.authenticate("bob-token")).id == "bob"
    await asyncio.sleep(0.02)
    path.write_text(f"{digest('alice-token')} alice\n{digest('carol-token')[:-1]} carol\n")  # typo
    assert (await auth.authenticate("alice-token")).id == "alice"
    with pytest.raises(Exception, match="unknown_token"):
        await auth.authenticate("bob-token")


@pytest.mark.parametrize("sub", [" alice", "alice ", "al\x00ice", "alice\n", "\u202ealice", "a\tb"])
async def test_jwt_subjects_with_spaces_or_control_characters_are_refused(tmp_path: Path, sub: str) -> None:
    issuer = make_jwt_issuer(tmp_path)
    cfg = settings(auth_mode="jwt", jwks_file=issuer.jwks_path, jwt_issuer=ISSUER, jwt_audience=AUDIENCE)
    async with service(cfg) as srv:
        assert await _status(srv.mcp_url, issuer.token("alice")) == 200
        assert await _status(srv.mcp_url, issuer.token(sub)) == 401


def test_metrics_default_to_a_separate_loopback_port() -> None:
    cfg = load_settings(allow_all=True, host="0.0.0.0")
    assert cfg.metrics_port is not None and cfg.metrics_port != cfg.port
    assert cfg.metrics_host_address == "127.0.0.1"


async def test_metrics_are_not_on_the_main_port_and_carry_no_subject_id(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice-secret-tenant"])
    async with service(settings(token_file=tokens.path)) as srv:
        assert (await http_get(srv.url + "/metrics")).status_code == 404
        host, port = srv.service.metrics_address
        murl = f"http://{host}:{port}/metrics"
        task = asyncio.create_task(execute(srv.mcp_url, tokens["alice-secret-tenant"], SLOW))
        async with asyncio.timeout(10):
            while srv.service.inflight < 1:
                await asyncio.sleep(0.02)
        text = (await http_get(murl)).text
        samples = await scrape(murl)
        assert await task == {"result": "slept"}
    assert "alice-secret-tenant" not in text
    # Only the per-subject top-N is labelled by subject, and by its pseudonym (the codemode.subject
    # of its traces), never its id (as the dashboard shows it).
    labelled = {name: dict(labels)["subject"] for name, labels in samples if "subject" in dict(labels)}
    assert set(labelled) <= {"codemode_subject_top_active_executes"}, labelled
    assert all("alice" not in value for value in labelled.values()), labelled
    assert samples[("codemode_active_subjects", ())] == 1
    assert samples[("codemode_busiest_subject_executes", ())] == 1


# --------------------------------------------------------------------------------------------------
# records pack over HTTP: quotas, bounded inputs, per-subject ids, on-disk default store
# --------------------------------------------------------------------------------------------------

CREATE = "def main():\n    return records.create(title='n', body=%r)['id']\n"


async def test_records_quota_bounds_and_ids_over_http(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice", "bob"])
    options = ["CODEMODE_RECORDS_DB=:memory:", "CODEMODE_RECORDS_MAX_RECORDS=2"]
    async with service(settings(token_file=tokens.path, packs=[RECORDS_SPEC], pack_options=options)) as srv:
        assert await execute(srv.mcp_url, tokens["alice"], CREATE % "a") == {"result": 1}
        assert await execute(srv.mcp_url, tokens["alice"], CREATE % "b") == {"result": 2}
        assert await execute(srv.mcp_url, tokens["alice"], CREATE % "c") == (
            "error",
            "capability failed: storage quota exceeded",
        )
        # bob's ids start at 1: they do not reveal alice's activity
        assert await execute(srv.mcp_url, tokens["bob"], CREATE % "x") == {"result": 1}
        search = "def main():\n    return records.search(text='x' * 50001)\n"
        assert await execute(srv.mcp_url, tokens["bob"], search) == (
            "error",
            "capability failed: search text must be at most 200 characters",
        )


async def test_the_service_keeps_records_on_disk_by_default(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    cfg = settings(token_file=tokens.path, packs=[RECORDS_SPEC], pack_options=[], data_dir=tmp_path / "state")
    async with service(cfg) as srv:
        assert await execute(srv.mcp_url, tokens["alice"], CREATE % "kept") == {"result": 1}
    assert (tmp_path / "state" / "records.sqlite3").is_file()
    async with service(cfg) as srv:  # a restart keeps the records
        get = "def main():\n    return records.get(id=1)['body']\n"
        assert await execute(srv.mcp_url, tokens["alice"], get) == {"result": "kept"}


def test_http_settings_default_to_a_data_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert load_settings(allow_all=True, transport="http").pack_data_dir == tmp_path / "codemode"
    assert load_settings(allow_all=True, transport="stdio").pack_data_dir is None
