"""OpenAPI calls stay on the routes the document declares, under base_url, and the configured
credential never comes back to the program.

Two real backends of the kinds that decode ``%2F`` before routing: a FastAPI app under uvicorn
(``openapi_app.outer``: the API mounted at ``/api`` next to routes the document does not declare)
and the standard library's ``http.server`` file server (``SimpleHTTPRequestHandler``, which
percent-decodes the path and normalises ``..`` before it opens a file).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import codemode
from codemode import authz
from codemode.common.errors import client_text
from codemode.packs.upstream import UpstreamBuildError
from codemode_capabilities.openapi import openapi_pack
from tests.support.servers import openapi_app
from tests.support.upstreams import uvicorn_in_thread

pytestmark = pytest.mark.slow

SUBJECT = authz.Subject(id="mallory")
KEY = "operator-secret-key-7f3a9c"
KEY_ENV = "ROUTES_TEST_KEY"

#: Values that name another route once a backend has decoded them (once or twice, the overlong
#: and %u forms of a dot, Unicode compatibility forms, Tomcat's ``..;``, Windows' trailing dots).
ESCAPES = [
    "1/admin",
    "1%2Fadmin",
    "1%252Fadmin",
    "..",
    ".",
    "",
    "...",
    ". .",
    "../../private/secret.json",
    "..%2F..%2Fprivate%2Fsecret.json",
    "%2e%2e",
    "%2E%2E%2Fprivate",
    "%252e%252e%252fprivate",
    "%c0%ae%c0%ae",
    "%e0%80%ae%e0%80%ae",
    "%u002e%u002e",
    "\uff0e\uff0e",  # fullwidth full stops: NFKC makes them ".."
    "1\uff0fadmin",  # fullwidth solidus
    "..;",
    "..;jsessionid=x",
    "..\\private",
    "1\\admin",
    "%5c",
    "1\x00",
    "1\nadmin",
]

SEGMENT = (
    "must be one URL path segment: no '/', '\\', '%XX' escapes or control characters, "
    "not empty and not only dots"
)
SEGMENTS = (
    "must be a relative path of URL path segments: no '\\', '%XX' escapes or control characters, "
    "no empty segment and no segment of only dots"
)


def run(source: str) -> str:
    return "def main():\n" + "".join(f"    {line}\n" for line in source.splitlines())


def call(fn: str, **kwargs: Any) -> str:
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in kwargs.items())
    return run(f"return {fn}({args})")


# ------------------------------------------------------------------------------ FastAPI / uvicorn


@pytest.fixture(scope="module")
def starlette() -> Iterator[str]:
    with uvicorn_in_thread(openapi_app.outer) as base:
        yield base


@contextlib.asynccontextmanager
async def serving(configs: list[dict[str, Any]], clear: Callable[[], None]) -> AsyncIterator[codemode.Server]:
    """A server over an OpenAPI pack; ``clear`` empties the backend's request log once it is built."""
    pack = openapi_pack(configs)
    server = codemode.Builder(authorizer=authz.allow_all()).register(*pack.capabilities()).build()
    clear()
    try:
        yield server
    finally:
        await pack.aclose()
        await server.aclose()


def prefixed_config(base: str, tmp: Path, **extra: Any) -> dict[str, Any]:
    doc = tmp / "prefixed.json"
    doc.write_text(json.dumps(openapi_app.prefixed.openapi()))
    return {
        "name": "users",
        "document": str(doc),
        "base_url": f"{base}/api",
        "auth_header": "X-API-Key",
        "auth_value_from_env": KEY_ENV,
        **extra,
    }


@pytest.fixture
async def users(
    starlette: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[codemode.Server]:
    monkeypatch.setenv(KEY_ENV, KEY)
    async with serving([prefixed_config(starlette, tmp_path)], openapi_app.SEEN.clear) as server:
        yield server


async def test_declared_routes_still_work(users: codemode.Server) -> None:
    got = await users.execute(call("users.get_user", user_id="alice smith?x=1#y"), subject=SUBJECT)
    assert got == {"id": "alice smith?x=1#y", "role": "user"}
    assert await users.execute(call("users.get_file", path="a.txt"), subject=SUBJECT) == {"name": "a.txt"}
    assert openapi_app.SEEN == [
        ("/api/users/alice smith?x=1#y", KEY),
        ("/api/files/a.txt", KEY),
    ]


@pytest.mark.parametrize("value", ESCAPES)
async def test_a_path_value_never_reaches_an_undeclared_route(users: codemode.Server, value: str) -> None:
    """Before the fix ``user_id='1/admin'`` reached the undeclared ``/api/users/{id}/admin`` with the
    operator's key; now the call is refused before any request is made."""
    with pytest.raises(codemode.InvalidArguments) as info:
        await users.execute(call("users.get_user", user_id=value), subject=SUBJECT)
    assert client_text(info.value) == f'invalid capability arguments: argument "user_id" {SEGMENT}'
    assert openapi_app.SEEN == []


async def test_multi_segment_is_refused_unless_configured(users: codemode.Server) -> None:
    with pytest.raises(codemode.InvalidArguments) as info:
        await users.execute(call("users.get_file", path="docs/a.md"), subject=SUBJECT)
    assert client_text(info.value) == f'invalid capability arguments: argument "path" {SEGMENT}'
    assert openapi_app.SEEN == []


@pytest.fixture
async def files(
    starlette: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[codemode.Server]:
    monkeypatch.setenv(KEY_ENV, KEY)
    config = prefixed_config(starlette, tmp_path, multi_segment_parameters={"getFile": ["path"]})
    async with serving([config], openapi_app.SEEN.clear) as server:
        yield server


async def test_a_configured_multi_segment_parameter(files: codemode.Server) -> None:
    got = await files.execute(call("users.get_file", path="docs/guide/a b.md"), subject=SUBJECT)
    assert got == {"name": "docs/guide/a b.md"}
    assert openapi_app.SEEN == [("/api/files/docs/guide/a b.md", KEY)]
    openapi_app.SEEN.clear()
    for bad in [
        "docs/../../private/secret.json",
        "docs/./a",
        "docs//a",
        "/etc/passwd",
        "docs/",
        "docs\\..\\a",
        "docs/%2e%2e/a",
        "docs/..;/a",
        "docs/\uff0e\uff0e/a",
        "",
    ]:
        with pytest.raises(codemode.InvalidArguments) as info:
            await files.execute(call("users.get_file", path=bad), subject=SUBJECT)
        assert client_text(info.value) == f'invalid capability arguments: argument "path" {SEGMENTS}', bad
    assert openapi_app.SEEN == []
    # other parameters stay single segments
    with pytest.raises(codemode.InvalidArguments):
        await files.execute(call("users.get_user", user_id="1/admin"), subject=SUBJECT)


def test_multi_segment_configuration_errors(starlette: str, tmp_path: Path) -> None:
    for wrong in ({"getFile": ["name"]}, {"noSuchOperation": ["path"]}, {"getFile": ["path"], "echo": ["x"]}):
        config = prefixed_config(starlette, tmp_path, multi_segment_parameters=wrong)
        config.pop("auth_header"), config.pop("auth_value_from_env")
        with pytest.raises(UpstreamBuildError, match="multi_segment_parameters"):
            openapi_pack([config]).capabilities()


@pytest.mark.parametrize("status", [400, 500, 302, 404, 422])
async def test_an_echoed_credential_is_redacted(users: codemode.Server, status: int) -> None:
    """Before the fix the 400/500/302 answers carried the key to the program verbatim."""
    with pytest.raises(codemode.CapabilityFailure) as info:
        await users.execute(call("users.echo", status=status), subject=SUBJECT)
    text = client_text(info.value)
    assert text.startswith(f"capability failed: HTTP {status}: key [redacted] is not allowed here"), text
    assert KEY not in text and KEY[:8] not in text
    assert [(f"/api/echo/{status}", KEY)] == openapi_app.SEEN


async def test_a_query_credential_is_no_argument_and_is_redacted(
    starlette: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``auth_query``: the key goes in the query string; the program neither sets nor sees it, and
    httpx's request lines in the host log show it redacted."""
    caplog.set_level(logging.INFO, logger="httpx")
    monkeypatch.setenv(KEY_ENV, KEY)
    config = prefixed_config(starlette, tmp_path)
    del config["auth_header"]
    async with serving([{**config, "auth_query": "api_key"}], openapi_app.SEEN.clear) as server:
        assert server.describe("users.whoami").signature == "users.whoami(*, status: int)"
        got = await server.execute(call("users.whoami", status=200), subject=SUBJECT)
        assert got == {"id": "[redacted]", "role": "caller with key [redacted]"}
        with pytest.raises(codemode.CapabilityFailure) as info:
            await server.execute(call("users.whoami", status=500), subject=SUBJECT)
        assert client_text(info.value) == "capability failed: HTTP 500: rejected ?api_key=[redacted]"
    assert "/api/whoami/200?api_key=[redacted]" in caplog.text
    assert KEY not in caplog.text


# ------------------------------------------------------------------------------------ http.server


class _Recording(http.server.SimpleHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("X-API-Key")))
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def file_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("www")
    (root / "api" / "files").mkdir(parents=True)
    (root / "api" / "files" / "public.json").write_text('{"name": "public"}')
    (root / "private").mkdir()
    (root / "private" / "secret.json").write_text('{"name": "SECRET outside base_url"}')
    doc = {
        "openapi": "3.0.3",
        "info": {"title": "files", "version": "1"},
        "paths": {
            "/files/{name}": {
                "get": {
                    "operationId": "getFile",
                    "parameters": [
                        {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                    "responses": {
                        "200": {
                            "description": "the file",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {"name": {"type": "string"}},
                                        "required": ["name"],
                                    }
                                }
                            },
                        }
                    },
                }
            }
        },
    }
    (root / "openapi.json").write_text(json.dumps(doc))

    def handler(*args: Any, **kwargs: Any) -> _Recording:
        return _Recording(*args, directory=str(root), **kwargs)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@pytest.fixture
async def stdlib_files(
    file_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[codemode.Server]:
    base, root = file_server
    monkeypatch.setenv(KEY_ENV, KEY)
    config = {
        "name": "files",
        "document": str(root / "openapi.json"),
        "base_url": f"{base}/api",
        "auth_header": "X-API-Key",
        "auth_value_from_env": KEY_ENV,
    }
    async with serving([config], _Recording.seen.clear) as server:
        yield server


async def test_http_server_declared_file(stdlib_files: codemode.Server) -> None:
    got = await stdlib_files.execute(call("files.get_file", name="public.json"), subject=SUBJECT)
    assert got == {"name": "public"}
    assert _Recording.seen == [("/api/files/public.json", KEY)]


@pytest.mark.parametrize("value", ESCAPES)
async def test_http_server_a_path_value_never_leaves_base_url(
    stdlib_files: codemode.Server, value: str
) -> None:
    """Before the fix ``name='../../private/secret.json'`` read /private/secret.json (outside
    base_url's /api) with the operator's key."""
    with pytest.raises(codemode.InvalidArguments) as info:
        await stdlib_files.execute(call("files.get_file", name=value), subject=SUBJECT)
    assert client_text(info.value) == f'invalid capability arguments: argument "name" {SEGMENT}'
    assert _Recording.seen == []
