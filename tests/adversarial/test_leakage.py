"""Nothing secret crosses the MCP boundary: handler exceptions, authorizer and policy text, resolver
errors, runtime errors, panics, and oversized or control-character ``AgentError`` messages.

Each response is serialized in full (every field, by alias, with ``_meta`` and nulls) and searched for
the secret markers; the error text must also be one of the approved texts (docs/reference/errors.md).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mcp import Client

import codemode
from codemode import authz
from codemode.mcp import create_server
from tests.support.mcp_client import (
    CLIENT_MODES,
    CountingResolver,
    EchoIn,
    EchoOut,
    assert_coarse,
    build,
    call,
    dump,
    echo_capability,
    error_text,
    mcp_for,
)

SECRET = "SECRET-7f3a9c"
POLICY = 'package codemode.internal\nallow if input.subject.id == "root"  # POLICY-TEXT-b81d'
SECRETS = (SECRET, "POLICY-TEXT-b81d", "hunter2", "Traceback", "sk_live_", "/etc/shadow")

pytestmark = pytest.mark.parametrize("mode", CLIENT_MODES)


def assert_clean(result: Any) -> str:
    text = error_text(result)
    assert_coarse(text)
    serialized = dump(result)
    for secret in SECRETS:
        assert secret not in serialized, (secret, serialized)
    return text


def _raise_secret(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
    raise RuntimeError(f"connect failed: password=hunter2 token={SECRET} at /etc/shadow")


async def _raise_secret_async(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
    await asyncio.sleep(0)
    raise ValueError(f"sk_live_{SECRET}")


def _raise_panic(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
    raise SystemError(f"internal consistency panic {SECRET}")


def _recursion(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
    def f(n: int) -> int:
        return f(n + 1) + 1

    f(0)
    raise AssertionError(SECRET)


def _wrong_output(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
    return {"text": SECRET}  # type: ignore[return-value]


def _agent_error_long(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
    raise codemode.AgentError("bad\x00input\x1b[31m\n\tline\u2028" + "é" * 500)


def _agent_error_chained(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
    try:
        raise KeyError(SECRET)
    except KeyError as exc:
        raise codemode.AgentError("item missing") from exc


HANDLERS = {
    "leak.sync": _raise_secret,
    "leak.asynchronous": _raise_secret_async,
    "leak.panic": _raise_panic,
    "leak.recursion": _recursion,
    "leak.output": _wrong_output,
    "leak.agentlong": _agent_error_long,
    "leak.chained": _agent_error_chained,
}


def leaky_server(**kw: Any) -> codemode.Server:
    return build([echo_capability(name, h) for name, h in HANDLERS.items()], records=False, **kw)


async def test_handler_exceptions_do_not_leak(mode: str) -> None:
    server = leaky_server()
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            for name in ("leak.sync", "leak.asynchronous", "leak.panic", "leak.recursion", "leak.output"):
                result = await call(client, "execute", source=f'def main():\n    return {name}(text="x")\n')
                assert assert_clean(result) == "capability failed", name
            result = await call(client, "execute", source='def main():\n    return leak.chained(text="x")\n')
            assert assert_clean(result) == "capability failed: item missing"
    finally:
        await server.aclose()


async def test_agent_error_is_sanitized_and_cut(mode: str) -> None:
    server = leaky_server()
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            result = await call(
                client, "execute", source='def main():\n    return leak.agentlong(text="x")\n'
            )
        text = assert_clean(result)
        assert text.startswith("capability failed: bad input ")
        suffix = text.removeprefix("capability failed: ")
        assert len(suffix.encode("utf-8")) <= 256
        assert suffix.endswith("...")
        assert all(ch.isprintable() for ch in suffix)
        assert "\x1b" not in dump(result) and "\\u001b" not in dump(result)
    finally:
        await server.aclose()


class SecretDenied(authz.Denied):
    pass


class LeakyDenier:
    def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
        raise SecretDenied(f"denied by rule: {POLICY}")


class LeakyPolicy:
    async def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
        raise RuntimeError(f"rego eval error in {POLICY} with input {input!r}")


class ReturnsFalse:
    def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> Any:
        return f"no: {POLICY}"


@pytest.mark.parametrize(
    ("authorizer", "expected"),
    [
        (LeakyDenier(), "permission denied"),
        (LeakyPolicy(), "authorization policy failure"),
        (ReturnsFalse(), "authorization policy failure"),
    ],
)
async def test_authorizer_text_does_not_leak(mode: str, authorizer: Any, expected: str) -> None:
    server = build([echo_capability("demo.echo")], records=False, authorizer=authorizer)
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            result = await call(
                client, "execute", source=f'def main():\n    return demo.echo(text="{SECRET}")\n'
            )
        assert assert_clean(result) == expected
    finally:
        await server.aclose()


async def test_rego_policy_text_does_not_leak(mode: str) -> None:
    from codemode.authz.rego import RegoAuthorizer

    source = (
        "package codemode\n\n"
        "# POLICY-TEXT-b81d: admins only\n"
        'allow if input.arguments.text == "POLICY-TEXT-b81d"\n'
        "allow if to_number(input.arguments.text) > 1\n"
    )
    server = build(
        [echo_capability("demo.echo")],
        records=False,
        authorizer=RegoAuthorizer("data.codemode.allow", {"secret-policy.rego": source}),
    )
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            # to_number("abc") is a strict builtin error: a policy failure whose detail stays host-side
            result = await call(client, "execute", source='def main():\n    return demo.echo(text="abc")\n')
        assert assert_clean(result) == "authorization policy failure"
        assert "secret-policy.rego" not in dump(result)
    finally:
        await server.aclose()


async def test_resolver_errors_do_not_leak(mode: str) -> None:
    server = build(records=False)
    resolver = CountingResolver(fail=PermissionError(f"bearer {SECRET} expired"))
    async with Client(create_server(server, resolver), mode=mode) as client:
        for tool, arg in (("search_api", "query"), ("describe_api", "name"), ("execute", "source")):
            result = await call(client, tool, **{arg: "x"})
            assert assert_clean(result) == "unauthenticated"


class PanickingRuntime:
    name = "panicking"

    async def start(self) -> None:
        return None

    async def spawn(self) -> Any:
        raise OSError(f"mount /etc/shadow failed: {SECRET}")

    async def check(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


async def test_host_failures_do_not_leak(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    server = build(records=False, runtime=PanickingRuntime())
    async with Client(mcp_for(server), mode=mode) as client:
        result = await call(client, "execute", source="def main():\n    return 1\n")
        assert assert_clean(result) == "internal failure"

        def panic(*args: Any, **kwargs: Any) -> Any:
            raise RecursionError(f"Traceback (most recent call last): {SECRET}")

        monkeypatch.setattr(server, "describe", panic)
        result = await call(client, "describe_api", name="demo.echo")
        assert assert_clean(result) == "internal failure"

        async def execute_panic(*args: Any, **kwargs: Any) -> Any:
            raise MemoryError(SECRET)

        monkeypatch.setattr(server, "execute", execute_panic)
        result = await call(client, "execute", source="def main():\n    return 1\n")
        assert assert_clean(result) == "internal failure"


async def test_internal_detail_is_logged_host_side(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    server = build(records=False, runtime=PanickingRuntime())
    async with Client(mcp_for(server), mode=mode) as client:
        result = await call(client, "execute", source="def main():\n    return 1\n")
    assert assert_clean(result) == "internal failure"
    assert any(r.levelname in ("ERROR", "WARNING") for r in caplog.records)


async def test_program_values_in_errors_do_not_leak(mode: str) -> None:
    server = build()
    try:
        async with Client(mcp_for(server), mode=mode) as client:
            # A value that is too large for the final result must not be echoed back.
            src = f'def main():\n    return ["{SECRET}" * 1000 for i in range(100)]\n'
            limited = build(limits=codemode.Limits(max_value_bytes=1024))
            try:
                async with Client(mcp_for(limited), mode=mode) as small:
                    result = await call(small, "execute", source=src)
                    assert assert_clean(result) == "resource limit exceeded: value size"
            finally:
                await limited.aclose()
            # fail() with a secret message is the program's own text: it may come back (it is the
            # model's own data), but never any host detail; the text stays one of the approved forms.
            result = await call(client, "execute", source='def main():\n    fail("model text")\n')
            assert_coarse(error_text(result))
    finally:
        await server.aclose()
