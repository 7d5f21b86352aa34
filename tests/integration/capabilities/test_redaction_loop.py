"""One tenant's large upstream answer may not stall every other tenant's requests (found by a
hostile review).

The credential redaction reads every character of an answer (escapes decoded: a 1 MiB text took
1.2–2.9 s in the review, escape-heavy ones about 2.4 times plain ones). It ran on the host's serving
event loop, so while it ran, nothing else did: not another tenant's execute, not a health check.
Here tenant A's program calls an OpenAPI operation of a real uvicorn backend that answers a large
escape-heavy text; from the moment the backend has sent it, a heartbeat on the same loop measures
the loop's longest stall (every other tenant's request waits that long). What must hold: it is a
small part of what redacting that answer takes, measured on its own in the same run (a ratio, not
a timed bound).

Measured before the fix (the redaction on the loop; a 3 MiB answer): the longest stall 1.8–3.0 s,
1.3–1.7 times redacting the answer alone (1.1–1.8 s). After (``codemode.packs.off_loop``): 0.3–0.4
s, 0.14–0.25 times; what is left is the redaction's single regular-expression passes over the
whole text, which hold the GIL (docs/packs.md, "Redaction").

Real parts: a FastAPI service under uvicorn behind the OpenAPI pack, programs through
``Server.execute`` (process runtime).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel

import codemode
from codemode import authz
from codemode.packs import Redactor
from codemode_capabilities.openapi import openapi_pack
from tests.support.upstreams import uvicorn_in_thread

pytestmark = pytest.mark.slow

KEY_ENV = "REDACTION_LOOP_CREDENTIAL"
CREDENTIAL = "Bearer Xy7kQ2mN9pL4vR8sWq"
#: Characters of the backend's answer: escape-heavy (percent, HTML and JSON escapes mixed).
BLOCK = "%41&#66;\\u0043+%2B&amp;x"
SIZE = 3 * 1024 * 1024
TENANT_A = authz.Subject(id="tenant-a")


def big_text() -> str:
    return (BLOCK * (SIZE // len(BLOCK) + 1))[:SIZE]


class Echo(BaseModel):
    echo: str


class Backend:
    """The uvicorn backend's ``/big`` answer, and the loop callback run once it has sent it."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.served = asyncio.Event()

    def app(self) -> Any:
        api = FastAPI(title="Big", version="1.0")
        body = json.dumps({"echo": big_text()}).encode()

        @api.get("/big", operation_id="big", response_model=Echo)
        def big() -> Response:
            if self.loop is not None:
                self.loop.call_soon_threadsafe(self.served.set)
            return Response(body, media_type="application/json")

        return api


@pytest.fixture(scope="module")
def backend() -> Iterator[tuple[str, Backend, dict[str, Any]]]:
    state = Backend()
    app = state.app()
    with uvicorn_in_thread(app) as base:
        yield base, state, app.openapi()


async def test_a_large_answer_of_one_tenant_does_not_stall_the_loop_for_another(
    backend: tuple[str, Backend, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, state, document = backend
    (tmp_path / "big.json").write_text(json.dumps(document))
    monkeypatch.setenv(KEY_ENV, CREDENTIAL)
    pack = openapi_pack(
        [
            {
                "name": "api",
                "document": str(tmp_path / "big.json"),
                "base_url": base,
                "auth_header": "Authorization",
                "auth_value_from_env": KEY_ENV,
                "max_response_bytes": 2 * SIZE,
                "timeout": 60.0,
            }
        ]
    )
    server = codemode.Builder(authorizer=authz.allow_all()).register(*pack.capabilities()).build()
    # Its value is past the execute's value bound (a resource limit): the redaction ran before.
    program_a = "def main():\n    return api.big()\n"
    try:
        assert await server.execute("def main():\n    return 1\n", subject=TENANT_A) == 1  # warm
        state.loop = asyncio.get_running_loop()
        state.served.clear()
        ended: list[str] = []
        stalls: list[float] = []

        async def tenant_a() -> None:
            with pytest.raises(codemode.ResourceLimit):
                await server.execute(program_a, subject=TENANT_A)
            ended.append("A")

        async def heartbeat() -> None:
            await state.served.wait()
            while "A" not in ended:
                start = time.perf_counter()
                await asyncio.sleep(0.002)
                stalls.append(time.perf_counter() - start)

        a = asyncio.create_task(tenant_a())
        beat = asyncio.create_task(heartbeat())
        await asyncio.gather(a, beat)
    finally:
        state.loop = None
        await pack.aclose()
        await server.aclose()
    # The floor of the same run: redacting that answer once, on its own.
    start = time.perf_counter()
    Redactor([CREDENTIAL]).value(json.loads(json.dumps({"echo": big_text()})))
    redaction = time.perf_counter() - start
    stall = max(stalls)
    print(
        f"REDACTION LOOP: longest stall {stall * 1e3:.0f} ms,"
        f" redacting A's answer alone {redaction * 1e3:.0f} ms"
    )
    assert stall < redaction / 2, (stall, redaction)
