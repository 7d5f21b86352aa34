"""The credential redaction may not answer questions about the credential.

Error texts from OpenAPI backends and upstream MCP servers had every run of 8 or more characters of
a configured credential replaced by ``[redacted]``. A backend that quotes a value it refused
(``{"detail": msg}``, server-memory's ``Entity with name X not found``) then answered, for any
8-character string a program chose, "is this part of the credential?". The attack here is the
issue's: a program sends ``!`` + the last characters it knows + one candidate, for every candidate
(eight to a call, separated by `` ; ``), and the one that comes back as exactly ``![redacted]`` is
the credential's next character. It starts from what everyone knows: ``Bearer ``, ``Basic `` (two
characters at a time while fewer than 8 are known) and a vendor prefix, ``sk_live_``.

Measured before the fix (a1e717b; each test prints ``RECOVERED``): the candidates as they are gave
every character of all three credentials on both paths (Bearer 16 of 16, Basic 36 of 36, sk_live_
16 of 16); percent-encoded ones did too through the MCP path (its normal form decodes them) and
for sk_live_ through OpenAPI (the same spelling); with swapped case, none (that rule was
case-sensitive). A backend echoing the credential lower- or upper-cased or base64-encoded (alone or
inside a longer base64 text) showed all of it, in error reasons, results and MCP error texts.
After: none recovered, in every spelling, and a backend echoing the real credential, in any of the
spellings of ``credential_echo.FORMS``, shows none of it.

The last gap (``ENCODED``): a hostile backend that echoed the credential with every character a
JSON ``\\u`` escape or an HTML character reference, with spaces as ``+`` among percent-escapes, as
JSON inside a JSON string, or several of these mixed, showed it (9 of 10; the OpenAPI reason its
first 120 characters); now none, on both paths.

Real parts: a FastAPI service under uvicorn behind the OpenAPI pack, a stdio MCP server of the
official SDK behind the upstream MCP pack, programs through ``Server.execute`` (process runtime).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import random
import string
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

import codemode
from codemode import authz
from codemode_capabilities.mcp.upstream import upstream_mcp_pack
from codemode_capabilities.openapi import openapi_pack
from tests.support.escapes import read_out
from tests.support.servers import credential_echo
from tests.support.upstreams import uvicorn_in_thread

pytestmark = pytest.mark.slow

SUBJECT = authz.Subject(id="mallory")
KEY_ENV = "ORACLE_TEST_CREDENTIAL"
ALPHABET = string.ascii_letters + string.digits + "-_+/="
_RNG = random.Random(31)


def _random(n: int, chars: str = string.ascii_letters + string.digits) -> str:
    return "".join(_RNG.choice(chars) for _ in range(n))


#: The operator's credentials, each with the prefix everyone knows.
CREDENTIALS = {
    "bearer": ("Bearer ", "Bearer " + _random(16, string.ascii_letters + string.digits + "-_")),
    "basic": ("Basic ", "Basic " + base64.b64encode(f"svc-reports:{_random(13)}".encode()).decode()),
    "vendor": ("sk_live_", "sk_live_" + _random(16)),
}
#: How the program spells each candidate.
SPELL: dict[str, Callable[[str], str]] = {
    "as-is": lambda s: s,
    "swapped-case": str.swapcase,
    "percent": lambda s: quote(s, safe=""),
}
BATCH = 8
SEPARATOR = " ; "
WINDOW = 9  # characters known before the candidate: past the 8 of the old rule


CALLS = 50  # capability calls per execute


def program(capability: str, keyword: str, messages: list[str]) -> str:
    return (
        "def main():\n"
        f"    out = []\n"
        f"    for m in {json.dumps(messages)}:\n"
        f"        r = attempt({capability}, {keyword}=m)\n"
        '        out.append("" if r["ok"] else r["error"])\n'
        "    return out\n"
    )


async def each_execute(
    server: codemode.Server, capability: str, keyword: str, messages: list[str]
) -> list[str]:
    """The error text of one call per message, ``CALLS`` calls to an execute."""
    out: list[str] = []
    for i in range(0, len(messages), CALLS):
        got = await server.execute(program(capability, keyword, messages[i : i + CALLS]), subject=SUBJECT)
        assert isinstance(got, list)
        out += [str(x) for x in got]
    return out


Ask = Callable[[list[str]], Awaitable[list[str]]]


async def _step(ask: Ask, known: str, suffixes: list[str], spell: Callable[[str], str]) -> str | None:
    """The suffix whose candidate came back as exactly ``![redacted]`` (None: none did)."""
    tail = known[-WINDOW:]
    batches = [suffixes[i : i + BATCH] for i in range(0, len(suffixes), BATCH)]
    replies = await ask([SEPARATOR.join("!" + spell(tail + s) for s in batch) for batch in batches])
    for batch, reply in zip(batches, replies, strict=True):
        items = reply[reply.find("!") :].split(SEPARATOR) if "!" in reply else []
        for suffix, item in zip(batch, items, strict=False):
            if item == "![redacted]":
                return suffix
    return None


async def oracle_attack(ask: Ask, prefix: str, spell: Callable[[str], str]) -> str:
    """What the issue's attack recovers after ``prefix``: one character a step (two while fewer
    than 8 are known and one gave nothing), until no candidate comes back redacted."""
    known = prefix
    singles = list(ALPHABET)
    pairs = [a + b for a in ALPHABET for b in ALPHABET]
    while len(known) < 200:
        found = await _step(ask, known, singles, spell)
        if found is None and len(known) < 8:
            found = await _step(ask, known, pairs, spell)
        if found is None:
            break
        known += found
    return known[len(prefix) :]


def recovered(value: str, prefix: str, got: str) -> int:
    """Characters of the credential after ``prefix`` that the attack got right, in order."""
    rest = value[len(prefix) :]
    n = 0
    while n < min(len(rest), len(got)) and rest[n] == got[n]:
        n += 1
    return n


def leaks(shown: str, echoed: str, *, size: int = 6) -> list[str]:
    """Every ``size``-character piece of ``echoed`` (the credential as the backend spelled it) that
    the client saw."""
    return sorted({echoed[i : i + size] for i in range(len(echoed) - size + 1)} & _pieces(shown, size))


def _pieces(text: str, size: int) -> set[str]:
    return {text[i : i + size] for i in range(len(text) - size + 1)}


# ---------------------------------------------------------- the two paths: OpenAPI, upstream MCP

Serve = Callable[[str], contextlib.AbstractAsyncContextManager[codemode.Server]]
#: The pack and its capabilities, made once the credential is in the environment.
MakePack = Callable[[], Awaitable[tuple[Any, list[Any]]]]


@pytest.fixture(scope="module")
def backend() -> Iterator[tuple[str, dict[str, Any]]]:
    app = credential_echo.serve_fastapi()
    with uvicorn_in_thread(app) as base:
        yield base, app.openapi()  # type: ignore[attr-defined]


def mcp_config(**extra: Any) -> dict[str, Any]:
    return {
        "name": "echo",
        "command": sys.executable,
        "args": [credential_echo.__file__],
        "env_from_host": {"API_KEY": KEY_ENV},
        "tenancy": "shared",
        "max_calls_per_minute": 0,
        "timeout": 10.0,
        **extra,
    }


@pytest.fixture
def servers(
    backend: tuple[str, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Serve]:
    """For each path, a server (allow-all) over that pack with the credential it is given: the
    OpenAPI pack of the echo backend (``Authorization`` header), and the upstream MCP pack of the
    echo server (``env_from_host``)."""
    base, document = backend
    (tmp_path / "echo.json").write_text(json.dumps(document))
    api = {
        "name": "api",
        "document": str(tmp_path / "echo.json"),
        "base_url": base,
        "auth_header": "Authorization",
        "auth_value_from_env": KEY_ENV,
    }

    async def openapi() -> tuple[Any, list[Any]]:
        pack = openapi_pack([api])
        return pack, pack.capabilities()

    async def mcp() -> tuple[Any, list[Any]]:
        pack = upstream_mcp_pack([mcp_config()])
        return pack, await pack.acapabilities()

    def serving(make: MakePack) -> Serve:
        @contextlib.asynccontextmanager
        async def serve(credential: str) -> AsyncIterator[codemode.Server]:
            monkeypatch.setenv(KEY_ENV, credential)
            pack, capabilities = await make()
            server = codemode.Builder(authorizer=authz.allow_all()).register(*capabilities).build()
            try:
                yield server
            finally:
                await pack.aclose()
                await server.aclose()

        return serve

    return {"openapi": serving(openapi), "mcp": serving(mcp)}


#: For each path, the call whose error quotes the program's value (capability, keyword), the name
#: the host's warnings give the pack, and the calls that echo the credential the pack was given:
#: (capability, other arguments, how what the client is shown starts).
QUOTING = {"openapi": ("api.error", "status=400, msg"), "mcp": ("echo.say_error", "text")}
PACK_NAME = {"openapi": "'api'", "mcp": "'echo'"}
ECHO_CALLS: dict[str, list[tuple[str, dict[str, Any], str]]] = {
    "openapi": [
        ("api.credential", {"status": 400}, "capability failed: HTTP 400: key "),
        ("api.credential", {"status": 200}, "key "),  # a result
    ],
    "mcp": [
        ("echo.credential_error", {}, "capability failed: echo: Error executing tool credential_error: key "),
        ("echo.credential", {}, "key "),  # a result, as text
        ("echo.credential_structured", {}, "key "),  # and as structured content
    ],
}


@pytest.mark.parametrize("spelling", sorted(SPELL))
@pytest.mark.parametrize("kind", sorted(CREDENTIALS))
@pytest.mark.parametrize("path", sorted(QUOTING))
async def test_the_oracle_attack_recovers_nothing(
    servers: dict[str, Serve], path: str, kind: str, spelling: str
) -> None:
    prefix, value = CREDENTIALS[kind]
    capability, keyword = QUOTING[path]
    async with servers[path](value) as server:

        async def ask(messages: list[str]) -> list[str]:
            return await each_execute(server, capability, keyword, messages)

        got = await oracle_attack(ask, prefix, SPELL[spelling])
    n = recovered(value, prefix, got)
    print(f"RECOVERED {path} {kind}/{spelling}: {n} of {len(value) - len(prefix)}")
    assert n == 0, f"{kind}/{spelling}: recovered {got!r} of {value!r}"


def every_form(capability: str, forms: list[str], **kwargs: Any) -> str:
    """A program calling ``capability(form=..., **kwargs)`` for every form: form -> its error text,
    or its result."""
    args = "".join(f", {k}={json.dumps(v)}" for k, v in kwargs.items())
    return (
        "def main():\n"
        "    out = {}\n"
        f"    for form in {json.dumps(forms)}:\n"
        f"        r = attempt({capability}, form=form{args})\n"
        '        out[form] = r["value"] if r["ok"] else r["error"]\n'
        "    return out\n"
    )


def shown_text(shown: Any) -> str:
    """An error text, or the text of a result (``{"echo": ...}``, an MCP text result's ``text``)."""
    return shown if isinstance(shown, str) else str(shown.get("text", shown.get("echo")))


async def check_echoes(
    serve: Serve, path: str, value: str, forms: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Every call of ``ECHO_CALLS[path]`` with each form: what the client is shown is the backend's
    text with ``[redacted]`` for the credential and none of it (:func:`shows_none_of`); one warning
    for each call, naming the pack and nothing of the credential."""
    caplog.clear()
    async with serve(value) as server:
        with caplog.at_level(logging.WARNING):
            shown = [
                await server.execute(every_form(capability, forms, **args), subject=SUBJECT)
                for capability, args, _ in ECHO_CALLS[path]
            ]
    for (capability, _, start), answers in zip(ECHO_CALLS[path], shown, strict=True):
        assert isinstance(answers, dict), answers
        for form in forms:
            text = shown_text(answers[form])
            assert text.startswith(start) and text.endswith(" refused"), (capability, form, text)
            assert "[redacted]" in text and shows_none_of(text, form, value), (capability, form, text)
    warned = [r.getMessage() for r in caplog.records if "credential" in r.getMessage()]
    assert len(warned) == len(ECHO_CALLS[path]) * len(forms), warned
    assert all(PACK_NAME[path] in w for w in warned), warned
    assert not any(leaks(w, credential_echo.spelled(form, value)) for w in warned for form in forms)


@pytest.mark.parametrize("kind", sorted(CREDENTIALS))
@pytest.mark.parametrize("path", sorted(ECHO_CALLS))
async def test_a_backend_echoing_the_credential_shows_none_of_it(
    servers: dict[str, Serve], path: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """In each spelling of ``FORMS``: an OpenAPI error reason (400) and result (200); an upstream
    MCP server's error text (its ``env_from_host`` credential) and successful answer, as text and
    as structured content. Before, MCP results passed as the tool returned
    them: every form showed the whole ``env_from_host`` key."""
    await check_echoes(servers[path], path, CREDENTIALS[kind][1], sorted(credential_echo.FORMS), caplog)


ECHO_BYTES = 256 * 1024
ECHOES = 6


def echo_program(block: str) -> str:
    """ECHOES calls of api.echo, each with ECHO_BYTES of copies of ``block``."""
    return (
        "def main():\n"
        f"    t = {json.dumps(block)} * {ECHO_BYTES // len(block)}\n"
        f"    for i in range({ECHOES}):\n"
        "        attempt(api.echo, text=t)\n"
        "    return 1\n"
    )


@pytest.mark.timeout(600)
async def test_how_long_an_echo_takes_does_not_depend_on_what_it_shares_with_the_credential(
    servers: dict[str, Serve],
) -> None:
    """A backend that returns what it stored hands the redaction a text the program chose. Texts
    made of a part of the credential (its last 4 characters, its last 8, the scheme and its first
    characters) must take as long as texts of the same shape that share nothing with it.

    Before (the matcher of 2b6a3b2/794e419): a 4-character block of the
    credential's last third was an anchor, and every copy of it in a text cost a lookup of the whole
    candidate. 8 echoes of 512 KiB of copies of the token's last 4 characters took 3.7 s (median of
    20) against 1.4 s for copies of 4 other characters: 20 of 20 pairs apart, so one execute told a
    program whether it had guessed 4 characters of the credential. Compared here: the fastest of
    several executes of each (the least disturbed by the machine's other work)."""
    prefix, value = CREDENTIALS["bearer"]
    token = value[len(prefix) :]
    parts = [token[-4:], token[-8:], prefix + token[:4]]
    async with servers["openapi"](value) as server:
        await server.execute(echo_program("warm"), subject=SUBJECT)
        best: dict[str, float] = {}
        for _ in range(4):
            for part in parts:
                for text in (part, swapped_shape(part)):
                    start = time.perf_counter()
                    await server.execute(echo_program(text), subject=SUBJECT)
                    took = time.perf_counter() - start
                    best[text] = min(best.get(text, took), took)
    for part in parts:
        ratio = best[part] / best[swapped_shape(part)]
        print(
            f"ECHO TIME {part!r}: {best[part] * 1e3:.0f} ms, other {best[swapped_shape(part)] * 1e3:.0f} ms"
        )
        assert ratio < 1.4, (part, best)


def swapped_shape(text: str) -> str:
    """``text`` with each letter and digit replaced by another of its kind, sharing no character
    with the credential's alphabet position (the same shape, nothing of the credential)."""
    out = []
    for ch in text:
        if ch.isdigit():
            out.append(str((int(ch) + 5) % 10))
        elif ch.isalpha():
            base = "a" if ch.islower() else "A"
            out.append(chr(ord(base) + (ord(ch.lower()) - ord("a") + 13) % 26))
        else:
            out.append(ch)
    return "".join(out)


# ------------------------------------- encodings that are no whole spelling (last gap)

#: A credential whose part after the scheme holds a space and characters every encoding escapes.
ENCODED_CREDENTIAL = "Token Kq7&zR/p+W x=" + _random(12)


def shows_none_of(shown: str, form: str, value: str) -> bool:
    """Neither the credential as the backend spelled it nor, decoded, its part after the scheme."""
    token = (value.partition(" ")[2] or value).replace("+", " ")
    wrapper = _pieces(credential_echo.spelled(form, ""), 6)  # json-double's own JSON around it
    return not set(leaks(shown, credential_echo.spelled(form, value))) - wrapper and not leaks(
        read_out(shown).replace("+", " "), token
    )


@pytest.mark.parametrize("form", sorted(credential_echo.ENCODED))
async def test_a_credential_echoed_in_an_encoding_that_is_no_whole_spelling_shows_none_of_it(
    servers: dict[str, Serve], form: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A hostile backend echoes the credential with every character a JSON ``\\u`` escape or an HTML
    character reference, spaces as ``+`` among percent escapes, as JSON inside a JSON string, or
    several of these mixed: in every echo of both paths (an OpenAPI error reason and result, an
    upstream MCP error text and answers) the client sees none of it, and the host logs one warning
    for each. Before (the credential oracle's last gap), 9 of these 10 came back as they were: the
    OpenAPI reason showed its first 120 characters, the credential's first characters escaped
    among them."""
    for path in sorted(ECHO_CALLS):
        await check_echoes(servers[path], path, ENCODED_CREDENTIAL, [form], caplog)
