"""A FastAPI application as it comes (generated operationIds, Python defaults), served by uvicorn and
read from its own /openapi.json: capabilities are named by the function
(``todo.get_todo``, not ``todo.get_todo_todos_todo_id_get``), the ids keep the operationId (policies
stay stable), declared defaults show in the signature and are sent when a call leaves them out, and
``rename`` names one operation as the operator wants."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from mcp import Client, StdioServerParameters
from pydantic import BaseModel

import codemode
from codemode import authz
from codemode.packs.upstream import UpstreamBuildError
from codemode_capabilities.openapi import OpenAPIPack, openapi_pack
from tests.support.mcp_client import call, child_env, cli_command, execute_value, success_value
from tests.support.upstreams import uvicorn_in_thread

pytestmark = pytest.mark.slow

SUBJECT = authz.Subject("alice")

app = FastAPI(title="Todo")


class TodoIn(BaseModel):
    title: str
    done: bool = False


class Todo(BaseModel):
    id: int
    title: str
    done: bool


TODOS: dict[int, Todo] = {}


@app.post("/todos")
def create_todo(todo: TodoIn) -> Todo:
    made = Todo(id=len(TODOS) + 1, title=todo.title, done=todo.done)
    TODOS[made.id] = made
    return made


@app.get("/todos/{todo_id}")
def get_todo(todo_id: int) -> Todo:
    return TODOS[todo_id]


@app.get("/todos")
def list_todos(done: bool = False, limit: int = 10) -> list[Todo]:
    return [t for t in TODOS.values() if t.done == done][:limit]


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with uvicorn_in_thread(app) as url:
        yield url


def _config(base: str, **extra: Any) -> dict[str, Any]:
    return {"name": "todo", "document": f"{base}/openapi.json", "base_url": base, **extra}


@pytest.fixture
async def served(base: str) -> AsyncIterator[codemode.Server]:
    TODOS.clear()
    pack: OpenAPIPack = openapi_pack([_config(base)])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*pack.capabilities()).build()
    try:
        yield server
    finally:
        await pack.aclose()
        await server.aclose()


def test_generated_operation_ids_name_capabilities_by_function(served: codemode.Server) -> None:
    ids = {c.name: c.id for c in served.capabilities}
    assert ids == {
        "todo.create_todo": "openapi:todo:create_todo_todos_post",
        "todo.get_todo": "openapi:todo:get_todo_todos__todo_id__get",
        "todo.list_todos": "openapi:todo:list_todos_todos_get",
    }


def test_declared_defaults_are_in_the_signature(served: codemode.Server) -> None:
    sig = {c.name: c.signature for c in served.capabilities}
    assert sig["todo.create_todo"] == "todo.create_todo(*, title: str, done: bool = False)"
    assert sig["todo.list_todos"] == "todo.list_todos(*, done: bool = False, limit: int = 10)"
    assert sig["todo.get_todo"] == "todo.get_todo(*, todo_id: int)"


async def test_calls_round_trip_with_the_defaults(served: codemode.Server) -> None:
    src = (
        "def main():\n"
        "    a = todo.create_todo(title='milk')\n"
        "    b = todo.create_todo(title='bread', done=True)\n"
        "    undone = [t['title'] for t in todo.list_todos()['result']]\n"
        "    done = [t['title'] for t in todo.list_todos(done=True)['result']]\n"
        "    return [a['done'], todo.get_todo(todo_id=b['id'])['title'], undone, done]\n"
    )
    assert await served.execute(src, subject=SUBJECT) == [False, "bread", ["milk"], ["bread"]]


async def test_rename_names_one_operation(base: str) -> None:
    pack = openapi_pack([_config(base, rename={"get_todo_todos__todo_id__get": "fetch"})])
    try:
        caps = {c.name: c.id for c in pack.capabilities()}
    finally:
        await pack.aclose()
    assert caps == {
        "todo.create_todo": "openapi:todo:create_todo_todos_post",
        "todo.fetch": "openapi:todo:get_todo_todos__todo_id__get",
        "todo.list_todos": "openapi:todo:list_todos_todos_get",
    }


async def test_short_names_can_be_turned_off_and_renames_are_checked(base: str) -> None:
    pack = openapi_pack(
        [_config(base, short_generated_names=False, rename={"get_todo_todos__todo_id__get": "fetch"})]
    )
    try:
        names = sorted(c.name for c in pack.capabilities())
    finally:
        await pack.aclose()
    assert names == ["todo.create_todo_todos_post", "todo.fetch", "todo.list_todos_todos_get"]
    bad = openapi_pack([_config(base, rename={"get_todo_todos_todo_id_get": "fetch"})])
    try:
        with pytest.raises(
            UpstreamBuildError,
            match=r"rename 'get_todo_todos_todo_id_get': no operation .*"
            r"did you mean 'get_todo_todos__todo_id__get'",
        ):
            bad.capabilities()
    finally:
        await bad.aclose()


def _packs_page_blocks() -> tuple[str, str]:
    page = (Path(__file__).resolve().parents[3] / "docs" / "packs.md").read_text(encoding="utf-8")
    (app_source,) = [b for b in re.findall(r"^```python\n(.*?)^```", page, re.M | re.S) if "todo_api.py" in b]
    (table,) = [b for b in re.findall(r"^```toml\n(.*?)^```", page, re.M | re.S) if "todo.toml" in b]
    return app_source, table


@pytest.mark.timeout(180)
async def test_the_packs_page_fastapi_example_runs_as_written(tmp_path: Path) -> None:
    """docs/packs.md's FastAPI case: the app under uvicorn (its own command line), the table, and
    ``codemode serve --stdio`` with the official client; the signatures the page states."""
    app_source, table = _packs_page_blocks()
    (tmp_path / "todo_api.py").write_text(app_source, encoding="utf-8")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    (tmp_path / "todo.toml").write_text(table.replace("8700", port), encoding="utf-8")
    command = app_source.splitlines()[0].split(": ", 1)[1].replace("8700", port).split()
    assert command[0] == "uvicorn"
    api = subprocess.Popen(
        [str(Path(sys.executable).with_name("uvicorn")), *command[1:]],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(300):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", int(port)), timeout=1):
                break
            assert api.poll() is None, "uvicorn exited"
            time.sleep(0.1)
        serve = table.splitlines()[0].split(": ", 1)[1].split()
        argv = cli_command(*serve[1:])
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=child_env(), cwd=str(tmp_path))
        async with Client(params) as client:
            made = success_value(await call(client, "describe_api", name="todo.create_todo"))
            fetch = success_value(await call(client, "describe_api", name="todo.fetch"))
            src = "def main():\n    return todo.fetch(todo_id=todo.create_todo(title='milk')['id'])\n"
            value = execute_value(await call(client, "execute", source=src))
    finally:
        api.terminate()
        api.wait(timeout=30)
    assert made["signature"] == "todo.create_todo(*, title: str, done: bool = False)"
    assert fetch["signature"] == "todo.fetch(*, todo_id: int)"
    assert value == {"done": False, "id": 1, "title": "milk"}
