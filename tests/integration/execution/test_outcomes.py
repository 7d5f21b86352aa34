"""What an execute reports besides its value, on the process runtime: the call ledger (and its
agreement with the audit log), recoverable calls (``attempt``) and prints."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.common.errors import client_text
from codemode.common.outcomes import AUDIT_OUTCOMES, LedgerEntry
from codemode.service.audit import AuditLog
from tests.support.recorder import ALICE, Recorder, make_capabilities, make_server


class Lines(logging.Handler):
    """Collects the audit log's JSON lines."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


def audited_server(rec: Recorder, **limits: Any) -> tuple[codemode.Server, Lines]:
    logger = logging.getLogger(f"test.audit.{id(rec)}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    lines = Lines()
    logger.addHandler(lines)
    builder = codemode.Builder(
        authorizer=rec,
        limits=codemode.Limits(**limits),
        disabled=["util.hidden.v1"],
        observer=AuditLog(logger),
    )
    builder.register(*make_capabilities(rec))
    return builder.build(), lines


async def run_report(srv: codemode.Server, source: str) -> tuple[str, list[tuple[str, str]], str | None]:
    """(``value:...`` or the client text, the ledger as pairs, the prints)."""
    try:
        result = await srv.run(source, subject=ALICE)
    except codemode.CodeModeError as exc:
        return client_text(exc), pairs(exc.calls), exc.prints
    return f"value:{result.value!r}", pairs(result.calls), result.prints


def pairs(calls: tuple[LedgerEntry, ...]) -> list[tuple[str, str]]:
    return [(c.capability, c.outcome) for c in calls]


def audit_ledgers(lines: list[dict[str, Any]]) -> list[list[tuple[str, str]]]:
    """The native_call lines of each execute, mapped to ledger pairs (docs/reference/tools.md)."""
    out: list[list[tuple[str, str]]] = []
    current: list[tuple[str, str]] = []
    for line in lines:
        if line["event"] == "native_call":
            current.append((line["capability"], AUDIT_OUTCOMES[(line["decision"], line["outcome"])]))
        elif line["event"] == "execute":
            out.append(current)
            current = []
    return out


# ------------------------------------------------------------------------------------- the ledger


@dataclass(frozen=True)
class Step:
    """One statement of a generated program and what the ledger must say about it."""

    code: str
    entry: tuple[str, str] | None  # None: the statement makes no call the host sees
    ends: str | None  # the client text when the statement ends the program


def steps(rng: random.Random) -> Step:
    recoverable = [
        ("util.echo(value = 'x')", ("util.echo", "ok"), None),
        ("util.whoami()", ("util.whoami", "denied"), "permission denied"),
        ("util.boom(value = 'agent')", ("util.boom", "failed"),
         "capability failed: record 7 is locked  by another user"),
        ("util.boom(value = 'x')", ("util.boom", "failed"), "capability failed"),
        ("util.echo(value = 1)", ("util.echo", "invalid arguments"),
         'invalid capability arguments: argument "value" must be str, got int'),
        ("records.lookup('k')", ("records.lookup", "invalid arguments"),
         "invalid capability arguments: positional arguments are not accepted; "
         "call records.lookup(key=...) with keywords"),
    ]  # fmt: skip
    final = [
        ("util.blob(size = 5000)", ("util.blob", "limit exceeded"), "resource limit exceeded: value size"),
        ("util.badout()", ("util.badout", "failed"), "capability failed"),
        ("records.lookup(key = 'k')", ("records.lookup", "policy failure"), "authorization policy failure"),
        ("fail('stop')", None, "invalid program"),
    ]
    roll = rng.random()
    if roll < 0.15:
        code, entry, ends = rng.choice(final)
        return Step(f"    x = {code}\n", entry, ends)
    code, entry, message = rng.choice(recoverable)
    if rng.random() < 0.6:
        return Step(f"    x = attempt({code.replace('(', ', ', 1).replace(', )', ')')}\n", entry, None)
    return Step(f"    x = {code}\n", entry, message)


def generated(rng: random.Random, max_calls: int) -> tuple[str, list[tuple[str, str]], str]:
    """A random program, the ledger it must produce and the client text it must end with."""
    lines, ledger = ["def main():\n", "    out = []\n"], list[tuple[str, str]]()
    for _ in range(rng.randint(1, 8)):
        step = steps(rng)
        lines.append(step.code)
        lines.append("    out.append(x)\n")
        if step.entry is not None:
            if len(ledger) == max_calls:
                return "".join(lines) + "    return out\n", ledger, "resource limit exceeded: native calls"
            ledger.append(step.entry)
        if step.ends is not None:
            return "".join(lines) + "    return out\n", ledger, step.ends
    return "".join(lines) + "    return len(out)\n", ledger, f"value:{len(lines) // 2 - 1}"


async def test_the_ledger_and_the_audit_log_agree_for_random_failing_programs() -> None:
    rng = random.Random(20260122)
    rec = Recorder(deny={"util.whoami"}, fail_policy={"records.lookup"})
    srv, audit = audited_server(rec, max_value_bytes=1000, max_native_calls=5)
    expected_ledgers, reported = [], []
    try:
        for _ in range(40):
            source, ledger, ends = generated(rng, max_calls=5)
            text, calls, _ = await run_report(srv, source)
            if ends == "invalid program":
                assert text.startswith("invalid program: <codemode>:"), (source, text)
            else:
                assert text == ends, source
            assert calls == ledger, source
            expected_ledgers.append(ledger)
            reported.append(calls)
    finally:
        await srv.aclose()
    assert audit_ledgers(audit.lines) == reported == expected_ledgers
    assert any(len(ledger) > 2 for ledger in expected_ledgers)  # the generator made real programs


async def test_the_deadline_words_say_whether_a_handler_had_started() -> None:
    class SlowPolicy(Recorder):
        async def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:  # type: ignore[override]
            if input.capability_name == "util.whoami":
                await asyncio.sleep(30)

    srv, audit = audited_server(SlowPolicy(), max_execution_time=1.0)
    try:
        interrupted = "def main():\n    util.echo(value = 'a')\n    return util.sleepy()\n"
        assert await run_report(srv, interrupted) == (
            "resource limit exceeded: time",
            [("util.echo", "ok"), ("util.sleepy", "interrupted")],
            None,
        )
        undecided = "def main():\n    return util.whoami()\n"
        assert await run_report(srv, undecided) == (
            "resource limit exceeded: time",
            [("util.whoami", "not run")],
            None,
        )
    finally:
        await srv.aclose()
    calls = [
        (x["capability"], x["decision"], x["outcome"]) for x in audit.lines if x["event"] == "native_call"
    ]
    assert calls == [
        ("util.echo", "allow", "ok"),
        ("util.sleepy", "allow", "interrupted"),
        ("util.whoami", "undecided", "not_run"),
    ]
    assert audit_ledgers(audit.lines) == [
        [("util.echo", "ok"), ("util.sleepy", "interrupted")],
        [("util.whoami", "not run")],
    ]


async def test_calls_a_limit_stops_before_the_host_sees_them_have_no_entry() -> None:
    srv, _ = make_server(max_native_calls=2, max_value_bytes=100)
    try:
        loop = "def main():\n    for i in range(5):\n        util.echo(value = 'x')\n"
        assert await run_report(srv, loop) == (
            "resource limit exceeded: native calls",
            [("util.echo", "ok"), ("util.echo", "ok")],
            None,
        )
        big = "def main():\n    util.echo(value = 'a')\n    return util.echo(value = 'x' * 200)\n"
        assert await run_report(srv, big) == (
            "resource limit exceeded: value size",
            [("util.echo", "ok")],
            None,
        )
    finally:
        await srv.aclose()


async def test_each_execute_has_its_own_ledger_under_concurrency() -> None:
    srv, _ = make_server()
    bob = authz.Subject("bob")
    try:
        alice_src = "def main():\n" + "    util.echo(value = 'a')\n" * 5 + "    return 'a'\n"
        bob_src = "def main():\n" + "    util.whoami()\n" * 3 + "    return util.boom(value = 'x')\n"

        async def as_bob() -> list[tuple[str, str]]:
            with pytest.raises(codemode.CapabilityFailure) as info:
                await srv.execute(bob_src, subject=bob)
            return pairs(info.value.calls)

        results = await asyncio.gather(
            *[srv.run(alice_src, subject=ALICE) for _ in range(3)], *[as_bob() for _ in range(3)]
        )
    finally:
        await srv.aclose()
    for alice in results[:3]:
        assert isinstance(alice, codemode.ExecuteResult)
        assert pairs(alice.calls) == [("util.echo", "ok")] * 5
    for bobs in results[3:]:
        assert bobs == [("util.whoami", "ok")] * 3 + [("util.boom", "failed")]


async def test_execute_keeps_its_return_value_and_errors_carry_the_ledger() -> None:
    srv, _ = make_server(Recorder(deny={"util.whoami"}))
    try:
        assert await srv.execute("def main():\n    return util.echo(value = 'v')\n", subject=ALICE) == {
            "value": "v"
        }
        with pytest.raises(codemode.PermissionDenied) as info:
            await srv.execute(
                "def main():\n    util.echo(value = 'v')\n    return util.whoami()\n", subject=ALICE
            )
        assert pairs(info.value.calls) == [("util.echo", "ok"), ("util.whoami", "denied")]
        assert info.value.prints is None
        with pytest.raises(codemode.InvalidProgram) as bad:
            await srv.execute("def main(:\n", subject=ALICE)
        assert bad.value.calls == ()
    finally:
        await srv.aclose()


# ------------------------------------------------------------------------------ recoverable calls


async def test_attempt_lets_a_program_recover_and_the_ledger_shows_every_call() -> None:
    rec = Recorder(deny={"util.whoami"})
    srv, _ = make_server(rec)
    source = (
        "def main():\n"
        "    who = attempt(util.whoami)\n"
        "    if not who['ok']:\n"
        "        who = attempt(util.echo, value = 'fallback')\n"
        "    bad = attempt(util.echo, value = 3)\n"
        "    boom = attempt(util.boom, value = 'agent')\n"
        "    return [who, bad, boom]\n"
    )
    try:
        result = await srv.run(source, subject=ALICE)
    finally:
        await srv.aclose()
    assert result.value == [
        {"ok": True, "value": {"value": "fallback"}},
        {"ok": False, "error": 'invalid capability arguments: argument "value" must be str, got int'},
        {"ok": False, "error": "capability failed: record 7 is locked  by another user"},
    ]
    assert pairs(result.calls) == [
        ("util.whoami", "denied"),
        ("util.echo", "ok"),
        ("util.echo", "invalid arguments"),
        ("util.boom", "failed"),
    ]
    # Every call that reached the host passed the same stages: authorized once each, in order.
    assert [i.capability_name for i in rec.authz_inputs] == ["util.whoami", "util.echo", "util.boom"]
    assert "SECRET" not in json.dumps(result.value)


@pytest.mark.parametrize(
    ("call", "text", "entry"),
    [
        ("util.blob(size = 5000)", "resource limit exceeded: value size", ("util.blob", "limit exceeded")),
        ("records.lookup(key = 'k')", "authorization policy failure", ("records.lookup", "policy failure")),
        ("util.sleepy()", "resource limit exceeded: time", ("util.sleepy", "interrupted")),
    ],
)
async def test_attempt_never_recovers_from_limits_policy_failures_or_the_deadline(
    call: str, text: str, entry: tuple[str, str]
) -> None:
    srv, _ = make_server(
        Recorder(fail_policy={"records.lookup"}), max_value_bytes=1000, max_execution_time=1.0
    )
    name, rest = call.split("(", 1)
    source = f"def main():\n    r = attempt({name}, {rest}\n    return 'recovered'\n".replace(", )", ")")
    try:
        assert await run_report(srv, source) == (text, [entry], None)
    finally:
        await srv.aclose()


@dataclass
class QuotaIn:
    value: str


def quota(ctx: codemode.CallContext, subject: authz.Subject, args: QuotaIn) -> QuotaIn:
    raise codemode.ResourceLimit("quota")  # the handler's own budget (e.g. an upstream's)


async def test_a_handlers_own_limit_is_a_limit_in_the_ledger_and_never_recovered() -> None:
    builder = codemode.Builder(authorizer=authz.allow_all())
    builder.register(codemode.Capability(name="up.quota", summary="Always over its quota.", handler=quota))
    srv = builder.build()
    try:
        source = "def main():\n    r = attempt(up.quota, value = 'x')\n    return 'recovered'\n"
        assert await run_report(srv, source) == (
            "resource limit exceeded: quota",
            [("up.quota", "limit exceeded")],
            None,
        )
    finally:
        await srv.aclose()


async def test_attempt_of_something_else_is_an_invalid_program() -> None:
    srv, _ = make_server()
    try:
        text, calls, _ = await run_report(srv, "def main():\n    return attempt(len, [1])\n")
    finally:
        await srv.aclose()
    message = "attempt() takes a capability first, e.g. attempt(records.get, id=7)"
    assert text == "invalid program: <codemode>:2:12: " + message
    assert calls == []


# ------------------------------------------------------------------------------------------ prints


async def test_prints_are_off_by_default_and_never_in_the_result() -> None:
    source = "def main():\n    print('debug', 1)\n    return 'value'\n"
    srv, _ = make_server()
    try:
        assert await run_report(srv, source) == ("value:'value'", [], None)
    finally:
        await srv.aclose()
    srv, _ = make_server(max_print_bytes=64)
    try:
        assert await run_report(srv, source) == ("value:'value'", [], "debug 1\n")
        failing = "def main():\n    print('before the denial')\n    return util.whoami()\n"
        srv2, _ = make_server(Recorder(deny={"util.whoami"}), max_print_bytes=64)
        try:
            assert await run_report(srv2, failing) == (
                "permission denied",
                [("util.whoami", "denied")],
                "before the denial\n",
            )
        finally:
            await srv2.aclose()
    finally:
        await srv.aclose()


async def test_prints_are_bounded_and_cut_with_a_marker() -> None:
    srv, _ = make_server(max_print_bytes=20)
    try:
        source = "def main():\n    for i in range(100):\n        print('line', i)\n    return 1\n"
        assert await run_report(srv, source) == (
            "value:1",
            [],
            "line 0\nline 1\nline 2\n[prints truncated]",
        )
    finally:
        await srv.aclose()


async def test_an_honest_worker_that_prints_all_the_time_stays_within_the_frame_bound() -> None:
    # The host refuses more print frames than protocol.max_print_frames: a program printing at
    # every step and before every call must still pass.
    srv, _ = make_server(max_print_bytes=1 << 20, max_native_calls=50, max_execution_steps=3_000_000)
    source = (
        "def main():\n"
        "    for i in range(50):\n"
        "        print('call', i)\n"
        "        util.echo(value = 'x')\n"
        "    for i in range(50000):\n"
        "        print('x', end = '')\n"
        "    return 'done'\n"
    )
    try:
        text, calls, prints = await run_report(srv, source)
    finally:
        await srv.aclose()
    assert (text, len(calls)) == ("value:'done'", 50)
    assert prints is not None and prints.endswith("call 49\n" + "x" * 50000)


def test_prints_may_not_exceed_a_value() -> None:
    with pytest.raises(codemode.InvalidRegistration) as info:
        make_server(max_print_bytes=2000, max_value_bytes=1000)
    assert "limits: max_print_bytes must not exceed max_value_bytes" in info.value.problems


def test_the_python_api_example_runs() -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "reference" / "python-api.md").read_text(
        encoding="utf-8"
    )
    section = page.split("## What an execute reports", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet is not None
    exec(compile(snippet[1], "python-api.md", "exec"), {"__name__": "python_api_example"})
