"""Bearer authentication in front of /mcp, against a real uvicorn server and the official MCP client."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jwt
import pytest
from mcp.shared.exceptions import MCPError

from codemode.service.auth import TokenFileAuthenticator, hash_token, load_token_file
from codemode.startup.config import ConfigError
from tests.support.service import (
    AUDIENCE,
    CALLS,
    INITIALIZE,
    CountingAuthorizer,
    call,
    make_jwt_issuer,
    mcp_client,
    metric,
    scrape,
    service,
    settings,
    write_token_file,
)

PROGRAM = "def main():\n    return svc.echo(value='x')['value']\n"

TOOLS_CALL = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "execute", "arguments": {"source": PROGRAM}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def raw_post(url: str, body: dict[str, Any], authorization: str | None) -> httpx.Response:
    headers = dict(MCP_HEADERS)
    if authorization is not None:
        headers["Authorization"] = authorization
    async with httpx.AsyncClient(timeout=15) as client:
        return await client.post(url, json=body, headers=headers)


def assert_401(resp: httpx.Response, *, invalid: bool) -> None:
    assert resp.status_code == 401
    challenge = resp.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert ('error="invalid_token"' in challenge) is invalid
    assert resp.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32001, "message": "unauthenticated"},
    }


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


async def assert_client_refused(url: str, token: str | None) -> None:
    """The official client cannot even open a session (the SDK reports the HTTP 401 as an error)."""
    with pytest.raises(BaseException) as info:
        async with mcp_client(url, token) as client:
            await call(client, "execute", source=PROGRAM)
    leaves = _leaves(info.value)
    assert any(isinstance(e, MCPError | httpx2.HTTPStatusError) for e in leaves), leaves


# --------------------------------------------------------------------------------------------------
# token file mode
# --------------------------------------------------------------------------------------------------


async def test_token_file_refuses_missing_and_bad_tokens(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    authorizer = CountingAuthorizer()
    async with service(settings(token_file=tokens.path), authorizer=authorizer) as srv:
        url = srv.mcp_url
        for body in (INITIALIZE, TOOLS_CALL):
            assert_401(await raw_post(url, body, None), invalid=False)
            assert_401(await raw_post(url, body, "Bearer not-a-real-token"), invalid=True)
            assert_401(await raw_post(url, body, f"Basic {tokens['alice']}"), invalid=True)
            assert_401(await raw_post(url, body, "Bearer"), invalid=True)
            assert_401(await raw_post(url, body, "Bearer a b"), invalid=True)
            # the hash itself is not a token
            assert_401(await raw_post(url, body, f"Bearer {hash_token(tokens['alice'])}"), invalid=True)
            assert_401(await raw_post(url, body, f"Bearer {tokens['alice']}x"), invalid=True)
        await assert_client_refused(url, None)
        await assert_client_refused(url, "wrong")
        # GET (SSE stream) and DELETE are refused too
        async with httpx.AsyncClient(timeout=15) as client:
            assert (await client.get(url, headers={"Accept": "text/event-stream"})).status_code == 401
            assert (await client.delete(url)).status_code == 401
        assert CALLS.handler == []
        assert authorizer.calls == []
        assert srv.service.inflight == 0


async def test_token_file_good_token_works_and_subject_is_the_files(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice", "bob"], lines=True)
    authorizer = CountingAuthorizer()
    async with service(settings(token_file=tokens.path), authorizer=authorizer) as srv:
        async with mcp_client(srv.mcp_url, tokens["alice"]) as client:
            tools = await client.list_tools()
            assert sorted(t.name for t in tools.tools) == ["describe_api", "execute", "search_api"]
            assert await call(client, "execute", source=PROGRAM) == {"result": "x"}
            who = "def main():\n    return svc.whoami()['value']\n"
            assert await call(client, "execute", source=who) == {"result": "alice"}
            found = await call(client, "search_api", query="echo")
            assert [r["name"] for r in found["results"]] == ["svc.echo"]
        async with mcp_client(srv.mcp_url, tokens["bob"]) as client:
            who = "def main():\n    return svc.whoami()['value']\n"
            assert await call(client, "execute", source=who) == {"result": "bob"}
        assert [a.subject.id for a in authorizer.calls] == ["alice", "alice", "bob"]


async def test_client_metadata_cannot_choose_the_subject(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path)) as srv:
        who = "def main():\n    return svc.whoami()['value']\n"
        body = {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "execute", "arguments": {"source": who}, "_meta": {"subject": "bob"}},
        }
        headers = {**MCP_HEADERS, "Authorization": f"Bearer {tokens['alice']}", "X-Subject": "bob"}
        async with httpx.AsyncClient(timeout=15) as client:
            resp = await client.post(srv.mcp_url, json=body, headers=headers)
        assert resp.status_code == 200
        assert '\\"result\\":\\"alice\\"' in resp.text or '"result":"alice"' in resp.text
        assert "bob" not in resp.text


async def test_token_file_rotation_is_picked_up(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path)) as srv:
        auth = srv.service.authenticator
        assert isinstance(auth, TokenFileAuthenticator)
        auth.reload_interval = 0.0
        new = "rotated-token-for-carol-0123456789"
        tokens.path.write_text(json.dumps({hash_token(new): "carol"}))
        async with mcp_client(srv.mcp_url, new) as client:
            who = "def main():\n    return svc.whoami()['value']\n"
            assert await call(client, "execute", source=who) == {"result": "carol"}
        assert_401(await raw_post(srv.mcp_url, INITIALIZE, f"Bearer {tokens['alice']}"), invalid=True)
        # a broken (half-written) rewrite keeps the previous tokens it still lists ...
        tokens.path.write_text('{"' + hash_token(new) + '": "carol", "ab')
        async with mcp_client(srv.mcp_url, new) as client:
            assert await call(client, "execute", source=PROGRAM) == {"result": "x"}
        # ... and no others: a token that is not in the file any more is revoked
        tokens.path.write_text("{not json")
        await asyncio.sleep(0.01)
        assert_401(await raw_post(srv.mcp_url, INITIALIZE, f"Bearer {new}"), invalid=True)


def test_token_file_formats_and_rejections(tmp_path: Path) -> None:
    good = tmp_path / "t.txt"
    digest = hash_token("abc")
    good.write_text(f"# comment\n\n{digest.upper()}  alice smith\n")
    assert load_token_file(good) == {digest: "alice smith"}
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"my-plaintext-token": "alice"}))
    with pytest.raises(ConfigError) as info:
        load_token_file(plain)
    assert "my-plaintext-token" not in str(info.value)
    dup = tmp_path / "dup.txt"
    dup.write_text(f"{digest} a\n{digest} b\n")
    with pytest.raises(ConfigError, match="duplicate"):
        load_token_file(dup)


# --------------------------------------------------------------------------------------------------
# JWT mode
# --------------------------------------------------------------------------------------------------


def jwt_settings(issuer_path: Path, **extra: Any) -> Any:
    return settings(
        auth_mode="jwt",
        jwks_file=issuer_path,
        jwt_issuer="https://issuer.test",
        jwt_audience=AUDIENCE,
        **extra,
    )


async def test_jwt_good_token_works(tmp_path: Path) -> None:
    issuer = make_jwt_issuer(tmp_path)
    authorizer = CountingAuthorizer()
    async with service(jwt_settings(issuer.jwks_path), authorizer=authorizer) as srv:
        async with mcp_client(srv.mcp_url, issuer.token("dave")) as client:
            who = "def main():\n    return svc.whoami()['value']\n"
            assert await call(client, "execute", source=who) == {"result": "dave"}
        assert [a.subject.id for a in authorizer.calls] == ["dave"]


async def test_jwt_refusals(tmp_path: Path) -> None:
    issuer = make_jwt_issuer(tmp_path)
    (tmp_path / "other").mkdir()
    other = make_jwt_issuer(tmp_path / "other", kid="k1")  # same kid, different key
    authorizer = CountingAuthorizer()
    async with service(jwt_settings(issuer.jwks_path), authorizer=authorizer) as srv:
        url = srv.mcp_url
        bad = {
            "expired": issuer.token("eve", exp_in=-3600),
            "wrong audience": issuer.token("eve", aud="someone-else"),
            "wrong issuer": issuer.token("eve", iss="https://evil.test"),
            "wrong key": other.token("eve"),
            "garbage": "a.b.c",
            "hs256": jwt.encode(
                {"sub": "eve", "iss": "https://issuer.test", "aud": AUDIENCE, "exp": 2**31},
                "secret-key-of-32-bytes-or-more-xxxxxx",
                algorithm="HS256",
                headers={"kid": "k1"},
            ),
            "no sub": issuer.token("", exp_in=300),
        }
        for label, token in bad.items():
            for body in (INITIALIZE, TOOLS_CALL):
                resp = await raw_post(url, body, f"Bearer {token}")
                assert resp.status_code == 401, label
                assert_401(resp, invalid=True)
            await assert_client_refused(url, token)
        assert CALLS.handler == []
        assert authorizer.calls == []


async def test_jwt_lifetime_is_bounded(tmp_path: Path) -> None:
    """Found by review: a JWT of any lifetime was accepted (``exp`` = 10^20 passed, no ``iat``
    needed). ``iat`` and ``exp`` are required and ``exp - iat`` may not exceed
    ``jwt_max_lifetime_seconds`` (24 h by default)."""
    issuer = make_jwt_issuer(tmp_path)
    now = int(time.time())
    without_iat = jwt.encode(
        {"sub": "eve", "iss": "https://issuer.test", "aud": AUDIENCE, "exp": now + 300},
        issuer.key,
        algorithm="RS256",
        headers={"kid": issuer.kid},
    )
    refused = {
        "exp 10^20": issuer.token("eve", exp=10**20),
        "no iat": without_iat,
        "25 h": issuer.token("eve", exp_in=25 * 3600),
        "iat long ago": issuer.token("eve", iat=now - 30 * 86400, exp_in=300),
    }
    async with service(jwt_settings(issuer.jwks_path)) as srv:
        seen = {
            label: (await raw_post(srv.mcp_url, INITIALIZE, f"Bearer {t}")).status_code
            for label, t in refused.items()
        }
        assert seen == dict.fromkeys(refused, 401)
        ok = await raw_post(srv.mcp_url, INITIALIZE, f"Bearer {issuer.token('dave', exp_in=23 * 3600)}")
        assert ok.status_code == 200
        samples = await scrape(srv.metrics_url)
        assert metric(samples, "codemode_auth_failures_total", reason="lifetime_too_long") == 3
        assert metric(samples, "codemode_auth_failures_total", reason="missing_claim") == 1
    # A shorter bound, set by the operator.
    async with service(jwt_settings(issuer.jwks_path, jwt_max_lifetime_seconds=600)) as srv:
        long = await raw_post(srv.mcp_url, INITIALIZE, f"Bearer {issuer.token('dave', exp_in=900)}")
        short = await raw_post(srv.mcp_url, INITIALIZE, f"Bearer {issuer.token('dave', exp_in=300)}")
        assert (long.status_code, short.status_code) == (401, 200)


# --------------------------------------------------------------------------------------------------
# stateful MCP sessions
# --------------------------------------------------------------------------------------------------


async def test_stateful_sessions_are_bound_to_their_subject(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice", "bob"])
    async with service(settings(token_file=tokens.path, mcp_stateless=False)) as srv:
        who = "def main():\n    return svc.whoami()['value']\n"
        async with mcp_client(srv.mcp_url, tokens["alice"], mode="legacy") as client:
            assert await call(client, "execute", source=who) == {"result": "alice"}
        async with mcp_client(srv.mcp_url, tokens["bob"], mode="legacy") as client:
            assert await call(client, "execute", source=who) == {"result": "bob"}
        # alice opens a session by hand; bob presenting its id is treated as an unknown session
        opened = await raw_post(srv.mcp_url, INITIALIZE, f"Bearer {tokens['alice']}")
        assert opened.status_code == 200
        session_id = opened.headers["mcp-session-id"]
        call_body = {**TOOLS_CALL, "params": {"name": "execute", "arguments": {"source": who}}}
        headers = {
            **MCP_HEADERS,
            "mcp-session-id": session_id,
            "mcp-protocol-version": "2025-06-18",
        }
        async with httpx.AsyncClient(timeout=15) as http:
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            ack = await http.post(
                srv.mcp_url, json=note, headers={**headers, "Authorization": f"Bearer {tokens['alice']}"}
            )
            assert ack.status_code == 202
            stolen = await http.post(
                srv.mcp_url, json=call_body, headers={**headers, "Authorization": f"Bearer {tokens['bob']}"}
            )
            assert stolen.status_code == 404
            own = await http.post(
                srv.mcp_url, json=call_body, headers={**headers, "Authorization": f"Bearer {tokens['alice']}"}
            )
            assert own.status_code == 200 and "alice" in own.text and "bob" not in own.text
        assert CALLS.handler.count("svc.whoami") == 3


async def test_tokens_command_stores_only_the_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from codemode.cli import main

    for name in ("tokens.txt", "tokens.json"):
        path = tmp_path / name
        assert main(["token", "new", "alice", "--token-file", str(path)]) == 0
        assert main(["token", "new", "bob", "--token-file", str(path)]) == 0
        out = capsys.readouterr().out.split()
        alice_token, bob_token = out
        text = path.read_text()
        assert alice_token not in text and bob_token not in text
        auth = TokenFileAuthenticator(path)
        assert (await auth.authenticate(alice_token)).id == "alice"
        assert (await auth.authenticate(bob_token)).id == "bob"
        assert oct(path.stat().st_mode & 0o777) == "0o600"


async def test_jwt_from_a_jwks_url_with_es256_and_key_rotation(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from codemode.service.auth import JWTAuthenticator
    from tests.support.service import running

    def es_key(kid: str) -> tuple[Any, dict[str, Any]]:
        key = ec.generate_private_key(ec.SECP256R1())
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
        jwk.update({"kid": kid, "use": "sig", "alg": "ES256"})
        return key, jwk

    first, first_jwk = es_key("2024")
    second, second_jwk = es_key("2025")
    published = {"keys": [first_jwk]}
    fetches: list[int] = []

    async def jwks(request: Any) -> JSONResponse:
        fetches.append(1)
        return JSONResponse(published)

    def token(key: Any, kid: str, sub: str) -> str:
        now = int(time.time())
        claims = {"sub": sub, "iss": "https://issuer.test", "aud": AUDIENCE, "iat": now, "exp": now + 60}
        return jwt.encode(claims, key, algorithm="ES256", headers={"kid": kid})

    async with running(Starlette(routes=[Route("/jwks.json", jwks)])) as idp:
        cfg = settings(
            auth_mode="jwt",
            jwks_url=idp.url + "/jwks.json",
            jwt_issuer="https://issuer.test",
            jwt_audience=AUDIENCE,
        )
        async with service(cfg) as srv:
            auth = srv.service.authenticator
            assert isinstance(auth, JWTAuthenticator)
            assert fetches == [1]  # fetched at start-up
            who = "def main():\n    return svc.whoami()['value']\n"
            async with mcp_client(srv.mcp_url, token(first, "2024", "frank")) as client:
                assert await call(client, "execute", source=who) == {"result": "frank"}
            # the issuer rotates: a token with an unknown kid makes the service re-fetch (rate-limited)
            published["keys"] = [first_jwk, second_jwk]
            auth.min_refresh_interval = 0.0
            async with mcp_client(srv.mcp_url, token(second, "2025", "grace")) as client:
                assert await call(client, "execute", source=who) == {"result": "grace"}
            assert len(fetches) == 2
            # a kid the issuer does not publish stays refused
            resp = await raw_post(srv.mcp_url, INITIALIZE, f"Bearer {token(second, 'nope', 'mallory')}")
            assert resp.status_code == 401


async def test_the_official_client_names_the_reason_of_a_401(tmp_path: Path) -> None:
    """A wrong token reaches a Python client as ``MCPError: unauthenticated`` (before: the SDK's
    'Server returned an error response', which says nothing)."""
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path)) as srv:
        with pytest.raises(BaseException) as info:
            async with mcp_client(srv.mcp_url, "not-the-token") as client:
                await client.call_tool("search_api", {"query": "x"})
    errors = [e for e in _leaves(info.value) if isinstance(e, MCPError)]
    assert errors and str(errors[0]) == "unauthenticated", _leaves(info.value)
