"""Suspended executes across a real server process's death: on the 2026-07-28
protocol the question is a record in the SQLite store of the data dir, so the retry resumes it
after the process was killed (SIGKILL) and started again, through the official MCP client over
stdio. On the handshake protocol the question dies with the process: the record expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import Client, StdioServerParameters

from tests.integration.mcp.test_approval_served import child_env, stdio_argv
from tests.support.approval import ACCEPT, User, create_then_delete
from tests.support.mcp_client import execute_value, ledger

ACCEPTED: dict[str, Any] = {"approve": ACCEPT}


def killable(tmp_path: Path, data: Path, pidfile: Path, *flags: str) -> StdioServerParameters:
    """``serve --stdio`` with its data dir (SQLite store and records), writing its pid first."""
    argv = stdio_argv(tmp_path, "--data-dir", str(data), "--store", "sqlite", *flags)
    return StdioServerParameters(
        command="sh", args=["-c", f'echo $$ > "{pidfile}"; exec "$@"', "sh", *argv], env=child_env()
    )


def pending(data: Path) -> int:
    """Suspension records in the data dir's store file (read with sqlite3, as an operator would)."""
    path = data / "codemode-store.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as db:
        tables = [r[0] for r in db.execute("select name from sqlite_master where type='table'")]
        table = next(t for t in tables if "suspen" in t)
        return int(db.execute(f"select count(*) from {table}").fetchone()[0])


async def kill(pidfile: Path) -> None:
    pid = int(pidfile.read_text().strip())
    os.kill(pid, signal.SIGKILL)
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        await asyncio.sleep(0.05)


async def test_a_retry_resumes_after_the_server_process_was_killed_and_started_again(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    pidfile = tmp_path / "pid"
    src = create_then_delete()
    first: Any = None
    counted = -1
    with contextlib.suppress(Exception):  # the client's end of a killed server
        async with Client(killable(tmp_path, data, pidfile), mode="auto", elicitation_callback=User()) as one:
            first = await one.session.call_tool("execute", {"source": src}, allow_input_required=True)
            counted = pending(data)
            await kill(pidfile)
    assert counted == 1
    assert isinstance(first, types.InputRequiredResult) and first.request_state
    async with Client(killable(tmp_path, data, pidfile), mode="auto", elicitation_callback=User()) as two:
        done = await two.session.call_tool(
            "execute",
            {"source": src},
            input_responses=ACCEPTED,
            request_state=first.request_state,
            allow_input_required=True,
        )
        assert isinstance(done, types.CallToolResult)
        assert execute_value(done) == {"id": 1, "deleted": True}, "the create was replayed, not run again"
        assert ledger(done) == [("records.create", "ok"), ("records.delete", "ok")]
        assert pending(data) == 0
        again = await two.call_tool(
            "execute", {"source": 'def main():\n    return records.create(title="x")\n'}
        )
        assert execute_value(again)["id"] == 2, "one record was ever created before"


async def test_on_the_handshake_protocol_a_restart_loses_the_question(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    pidfile = tmp_path / "pid"
    hold = asyncio.Event()
    user = User(hold=hold)
    counted = -1
    with contextlib.suppress(Exception):
        async with Client(
            killable(tmp_path, data, pidfile, "--max-approval-time", "1"),
            mode="legacy",
            elicitation_callback=user,
        ) as one:
            running = asyncio.ensure_future(one.call_tool("execute", {"source": create_then_delete()}))
            await asyncio.wait_for(user.waiting.wait(), 60)
            counted = pending(data)
            await kill(pidfile)
            with contextlib.suppress(BaseException):
                await running
    hold.set()
    assert counted == 1
    assert pending(data) == 1  # what the dead process left; it expires, declined
    await asyncio.sleep(1.0)
    async with Client(
        killable(tmp_path, data, pidfile, "--max-approval-time", "1"),
        mode="auto",
        elicitation_callback=User(),
    ) as two:
        # the next suspension sweeps expired records (the first one's claim grace is 30 s past its
        # question's end: check the record's expiry rather than wait for it)
        path = data / "codemode-store.sqlite3"
        with contextlib.closing(sqlite3.connect(path)) as db:
            tables = [r[0] for r in db.execute("select name from sqlite_master where type='table'")]
            table = next(t for t in tables if "suspen" in t)
            (expires,) = db.execute(f"select expires from {table}").fetchone()
        assert expires < time.time() + 35
        result = await two.call_tool("execute", {"source": "def main():\n    return records.get(id=1)\n"})
        assert execute_value(result)["id"] == 1, "the delete never ran"
