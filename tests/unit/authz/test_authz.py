"""codemode.authz: Subject, AuthorizationInput, Authorizer, Denied, allow_all, run_authorizer and the
contextvars-based subject (docs/reference/authorization.md)."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import threading
from collections.abc import Awaitable
from typing import Any

import pytest

from codemode import authz
from codemode.authz import (
    AuthorizationInput,
    Authorizer,
    Denied,
    PolicyError,
    Subject,
    allow_all,
    current_subject,
    run_authorizer,
    with_subject,
)

INPUT = AuthorizationInput(Subject("alice"), "records.entry.lookup", "records.lookup", {"key": "k"})


def test_public_names() -> None:
    assert set(authz.__all__) >= {
        "Subject",
        "AuthorizationInput",
        "Authorizer",
        "Denied",
        "PolicyError",
        "allow_all",
        "with_subject",
        "current_subject",
        "run_authorizer",
    }


def test_subject_is_frozen_with_one_field() -> None:
    s = Subject("alice")
    assert s.id == "alice"
    assert [f.name for f in dataclasses.fields(Subject)] == ["id"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.id = "mallory"  # type: ignore[misc]
    assert Subject("alice") == s and hash(Subject("alice")) == hash(s)


def test_subject_id_must_be_str() -> None:
    with pytest.raises(TypeError):
        Subject(42)  # type: ignore[arg-type]


def test_authorization_input_fields() -> None:
    assert [f.name for f in dataclasses.fields(AuthorizationInput)] == [
        "subject",
        "capability_id",
        "capability_name",
        "arguments",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        INPUT.capability_id = "x"  # type: ignore[misc]


def test_denied_and_policy_error_are_distinct() -> None:
    class Custom(Denied):
        pass

    assert issubclass(Custom, Denied)
    assert not issubclass(PolicyError, Denied)
    assert not issubclass(Denied, PolicyError)


async def test_allow_all_allows_everything() -> None:
    a = allow_all()
    assert isinstance(a, Authorizer)
    assert a.authorize(None, INPUT) is None
    other = AuthorizationInput(Subject(""), "x", "y.z", {})
    await run_authorizer(a, None, other)
    assert repr(a) == "allow_all()"


class SyncAuth:
    def __init__(self, deny: bool = False) -> None:
        self.deny = deny
        self.calls: list[tuple[Any, AuthorizationInput]] = []
        self.thread: threading.Thread | None = None

    def authorize(self, ctx: Any, input: AuthorizationInput) -> None:
        self.calls.append((ctx, input))
        self.thread = threading.current_thread()
        if self.deny:
            raise Denied("no")


class AsyncAuth:
    def __init__(self, deny: bool = False) -> None:
        self.deny = deny
        self.calls = 0

    async def authorize(self, ctx: Any, input: AuthorizationInput) -> None:
        await asyncio.sleep(0)
        self.calls += 1
        if self.deny:
            raise Denied("no")


async def test_run_authorizer_sync_allow_runs_on_calling_thread() -> None:
    a = SyncAuth()
    ctx = object()
    await run_authorizer(a, ctx, INPUT)
    assert a.calls == [(ctx, INPUT)]
    assert a.thread is threading.current_thread()


async def test_run_authorizer_sync_deny_propagates() -> None:
    with pytest.raises(Denied):
        await run_authorizer(SyncAuth(deny=True), None, INPUT)


async def test_run_authorizer_async_allow_and_deny() -> None:
    a = AsyncAuth()
    await run_authorizer(a, None, INPUT)
    assert a.calls == 1
    with pytest.raises(Denied):
        await run_authorizer(AsyncAuth(deny=True), None, INPUT)


async def test_run_authorizer_other_exception_propagates_unchanged() -> None:
    class Boom:
        def authorize(self, ctx: Any, input: AuthorizationInput) -> None:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await run_authorizer(Boom(), None, INPUT)


async def test_run_authorizer_sync_returning_awaitable_is_awaited() -> None:
    seen: list[str] = []

    class ReturnsAwaitable:
        def authorize(self, ctx: Any, input: AuthorizationInput) -> Awaitable[None]:
            async def later() -> None:
                seen.append("ran")
                raise Denied("later")

            return later()

    with pytest.raises(Denied):
        await run_authorizer(ReturnsAwaitable(), None, INPUT)
    assert seen == ["ran"]


@pytest.mark.parametrize("value", [False, True, "deny", 0])
async def test_run_authorizer_fails_closed_on_returned_value(value: object) -> None:
    class ReturnsValue:
        def authorize(self, ctx: Any, input: AuthorizationInput) -> Any:
            return value

    class AsyncReturnsValue:
        async def authorize(self, ctx: Any, input: AuthorizationInput) -> Any:
            return value

    with pytest.raises(PolicyError):
        await run_authorizer(ReturnsValue(), None, INPUT)
    with pytest.raises(PolicyError):
        await run_authorizer(AsyncReturnsValue(), None, INPUT)


# -- subject context -------------------------------------------------------------------------------------


def test_current_subject_default_none() -> None:
    assert current_subject() is None


def test_with_subject_nesting_restores() -> None:
    alice, bob = Subject("alice"), Subject("bob")
    with with_subject(alice) as s:
        assert s is alice
        assert current_subject() is alice
        with with_subject(bob):
            assert current_subject() is bob
        assert current_subject() is alice
    assert current_subject() is None


def test_with_subject_restores_after_exception() -> None:
    with pytest.raises(RuntimeError), with_subject(Subject("alice")):
        raise RuntimeError("x")
    assert current_subject() is None


def test_with_subject_requires_subject() -> None:
    with pytest.raises(TypeError), with_subject("alice"):  # type: ignore[arg-type]
        pass
    assert current_subject() is None


async def test_subject_isolated_across_tasks() -> None:
    started = asyncio.Event()
    results: dict[str, Subject | None] = {}

    async def request(name: str) -> None:
        with with_subject(Subject(name)):
            if name == "b":
                started.set()
            await asyncio.sleep(0.01)
            await started.wait()
            await asyncio.sleep(0)
            results[name] = current_subject()
        results[name + "-after"] = current_subject()

    await asyncio.gather(request("a"), request("b"), request("c"))
    assert results["a"] == Subject("a")
    assert results["b"] == Subject("b")
    assert results["c"] == Subject("c")
    assert results["a-after"] is None and results["b-after"] is None
    assert current_subject() is None


async def test_task_inherits_subject_but_cannot_change_parent() -> None:
    with with_subject(Subject("parent")):

        async def child() -> Subject | None:
            inherited = current_subject()
            with with_subject(Subject("child")):
                await asyncio.sleep(0)
            return inherited

        assert await asyncio.create_task(child()) == Subject("parent")
        assert current_subject() == Subject("parent")


def test_subject_isolated_across_threads() -> None:
    seen: dict[str, Subject | None] = {}

    def worker() -> None:
        seen["plain-thread"] = current_subject()

    def copied() -> None:
        seen["copied-context"] = current_subject()

    with with_subject(Subject("alice")):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        ctx = contextvars.copy_context()
    t2 = threading.Thread(target=ctx.run, args=(copied,))
    t2.start()
    t2.join()
    assert seen == {"plain-thread": None, "copied-context": Subject("alice")}
