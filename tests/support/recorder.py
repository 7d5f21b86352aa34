"""Shared test capabilities and server factories for execute tests."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import codemode
from codemode import authz


class Events:
    """An observer that keeps the call and execute events, in the order they were recorded."""

    def __init__(self) -> None:
        self.calls: list[codemode.CallEvent] = []
        self.executes: list[codemode.ExecuteEvent] = []

    def native_call(self, event: codemode.CallEvent) -> None:
        self.calls.append(event)

    def execute_outcome(self, event: codemode.ExecuteEvent) -> None:
        self.executes.append(event)

    def execute_started(self, subject_id: str) -> None:
        return None

    def execute_finished(self, subject_id: str) -> None:
        return None


@dataclass
class LookupIn:
    key: str
    limit: int | None = None
    ratio: float | None = None
    tags: list[str] | None = None
    labels: dict[str, str] | None = None


@dataclass
class LookupOut:
    key: str
    count: int


@dataclass
class EchoIn:
    value: str


@dataclass
class EchoOut:
    value: str


@dataclass
class BlobIn:
    size: int


@dataclass
class BlobOut:
    data: str


@dataclass
class Recorder:
    """Remembers every authorization input and handler call."""

    authz_inputs: list[authz.AuthorizationInput] = field(default_factory=list)
    handler_calls: list[tuple[str, Any]] = field(default_factory=list)
    deny: set[str] = field(default_factory=set)
    fail_policy: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
        with self.lock:
            self.authz_inputs.append(input)
        if input.capability_name in self.deny:
            raise authz.Denied("policy rule deny_all matched SECRET-POLICY")
        if input.capability_name in self.fail_policy:
            raise RuntimeError("policy engine exploded SECRET-POLICY")


def make_capabilities(rec: Recorder) -> list[codemode.Capability]:
    async def lookup(ctx: codemode.CallContext, subject: authz.Subject, args: LookupIn) -> LookupOut:
        rec.handler_calls.append(("records.lookup", args))
        return LookupOut(key=args.key, count=len(args.key) + (args.limit or 0))

    def echo(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
        rec.handler_calls.append(("util.echo", args))
        return EchoOut(value=args.value)

    def whoami(ctx: codemode.CallContext, subject: authz.Subject) -> EchoOut:
        return EchoOut(value=subject.id)

    def blob(ctx: codemode.CallContext, subject: authz.Subject, args: BlobIn) -> BlobOut:
        return BlobOut(data="x" * args.size)

    def boom(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
        if args.value == "agent":
            raise codemode.AgentError("record 7 is locked\x00 by\nanother user")
        raise RuntimeError("db password=SECRET-HANDLER")

    def badout(ctx: codemode.CallContext, subject: authz.Subject) -> LookupOut:
        return LookupOut(key="k", count=2**70)

    async def sleepy(ctx: codemode.CallContext, subject: authz.Subject) -> EchoOut:
        await asyncio.sleep(30)
        return EchoOut(value="late")

    async def stubborn(ctx: codemode.CallContext, subject: authz.Subject) -> EchoOut:
        end = time.monotonic() + 3
        while time.monotonic() < end:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue  # ignores cancellation on purpose
        return EchoOut(value="late")

    def blocking(ctx: codemode.CallContext, subject: authz.Subject) -> EchoOut:
        time.sleep(3)
        return EchoOut(value="late")

    return [
        codemode.Capability(
            id="records.entry.lookup",
            name="records.lookup",
            summary="Look up one record by key.",
            handler=lookup,
        ),
        codemode.Capability(name="util.echo", summary="Echo a string.", handler=echo),
        codemode.Capability(name="util.whoami", summary="The caller.", handler=whoami),
        codemode.Capability(name="util.blob", summary="A string of n bytes.", handler=blob),
        codemode.Capability(name="util.boom", summary="Always fails.", handler=boom),
        codemode.Capability(name="util.badout", summary="Returns an int64 overflow.", handler=badout),
        codemode.Capability(name="util.sleepy", summary="Sleeps.", handler=sleepy),
        codemode.Capability(name="util.stubborn", summary="Ignores cancellation.", handler=stubborn),
        codemode.Capability(name="util.blocking", summary="Blocks a thread.", handler=blocking),
        codemode.Capability(
            id="util.hidden.v1",
            name="util.hidden",
            summary="Disabled.",
            handler=echo,
        ),
    ]


def make_server(
    rec: Recorder | None = None,
    *,
    runtime: codemode.Runtime | None = None,
    **limits: Any,
) -> tuple[codemode.Server, Recorder]:
    rec = rec or Recorder()
    builder = codemode.Builder(
        authorizer=rec,
        limits=codemode.Limits(**limits),
        disabled=["util.hidden.v1"],
        runtime=runtime or codemode.ProcessRuntime(),
    )
    builder.register(*make_capabilities(rec))
    return builder.build(), rec


ALICE = authz.Subject("alice")


def value_at_the_limit(max_value_bytes: int) -> tuple[str, str, str]:
    """(a program whose final value is exactly ``max_value_bytes``, the same one byte over, the value
    the first returns). A string's size is its JSON text: two quotes more than its length."""
    digits = "0123456789"
    tens, tail = divmod(max_value_bytes - 2, 10)
    program = "def main():\n    return ('0123456789' * {tens}) + '{tail}'\n"
    return (
        program.format(tens=tens, tail=digits[:tail]),
        program.format(tens=tens, tail=digits[: tail + 1]),
        digits * tens + digits[:tail],
    )
