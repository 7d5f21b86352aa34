"""Bounded policies evaluated on the event loop's thread (codemode.authz.rego._bounded): which policies
qualify, that their decisions are the pool's, and that neither a slow policy nor a large tenant input
holds the loop (the deadline and cancellation outcomes stay as they are on the pool)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest

from codemode.authz import AskUser, AuthorizationInput, Denied, PolicyError, Subject
from codemode.authz.rego import INLINE_BUDGET, RegoAuthorizer
from codemode.authz.rego import _authorizer as rego_module
from codemode.authz.rego import _bounded as bounded
from tests.benchmarks import bench_authz
from tests.support.fakes import Ctx
from tests.support.loop import ticks_while

HEAD = "package app\nimport rego.v1\n\ndefault allow := false\n\n"

#: The benchmark's three-rule policy, and a rule that leaves deletes to the user.
REALISTIC = bench_authz.POLICY + '\nallow := "ask" if input.capability.name == "records.delete"\n'
DECISION = "data.codemode.authz.allow"

BOUNDED = {
    "realistic": REALISTIC,
    "one rule": HEAD + 'allow if input.subject.id == "alice"\n',
    "string builtins": HEAD
    + 'allow if {\n\tendswith(lower(input.arguments.key), ".txt")\n\tcontains(input.arguments.key, "/")\n}\n',
    "object.get": HEAD + 'allow if object.get(input.arguments, "mode", "ro") == "ro"\n',
    "partial set": HEAD
    + 'deny contains "secret" if startswith(input.arguments.key, "secret/")\nallow if count(deny) == 0\n',
    "else chain": "package app\nimport rego.v1\n\n"
    + 'allow := true if input.subject.id == "alice" else := "ask"\n',
    "literals": HEAD
    + 'm := {"a": [1, {"b": null}], "c": true}\nallow if input.arguments.n + 1 > count(m.a)\n',
    "static index": HEAD + 'allow if input["arguments"]["key"] == "k"\n',
    "future keywords": "package app\nimport future.keywords.if\nimport future.keywords.in\n\n"
    'default allow := false\n\nallow if input.subject.id in {"alice"}\n',
}

UNBOUNDED = {
    "some": ("allow if { some t in input.arguments.tags; t == 1 }", "keyword some"),
    "every": ("allow if { every t in input.arguments.tags { t == 1 } }", "keyword every"),
    "wildcard": ("allow if input.arguments.tags[_] == 1", "computed part"),
    "variable index": ("allow if { i := 0; input.arguments.tags[i] == 1 }", "computed part"),
    "number index": ("allow if input.arguments.tags[0] == 1", "computed part"),
    "index on a term": ('allow if {"a": 1}[input.arguments.key] == 1', "computed part"),
    "comprehension": ("allow if count({t | some t in input.arguments.tags}) > 0", "composite literal"),
    "set union": ("allow if count(input.arguments.a | input.arguments.b) > 0", "operator |"),
    "intersection": ("allow if count(input.arguments.a & input.arguments.b) > 0", "operator &"),
    "product": ("allow if input.arguments.n * input.arguments.n > 0", "operator *"),
    "with": ("r if input.arguments.n == 1\nallow if r with input.arguments.n as 1", "keyword with"),
    "range": ("allow if count(numbers.range(1, input.arguments.n)) > 0", "call to numbers.range"),
    "regex": ('allow if regex.match("a+", input.arguments.key)', "call to regex.match"),
    "indexof": ("allow if indexof(input.arguments.key, input.arguments.part) >= 0", "call to indexof"),
    "glob": ('allow if glob.match("*", [], input.arguments.key)', "call to glob.match"),
    "walk": ("allow if walk(input, [p, v])", "composite literal"),
    "user function": ("f(x) := x\nallow if f(input.arguments.n) == 1", "call to f"),
    "growing value": ("r0 := input.arguments\nr1 := [r0, r0]\nallow if count(r1) > 0", "composite literal"),
    "template": ('allow if $"{input.subject.id}" == "alice"', "template string"),
}


def inp(subject: str = "alice", name: str = "records.lookup", **arguments: Any) -> AuthorizationInput:
    return AuthorizationInput(Subject(subject), name.replace("records.", "records.entry."), name, arguments)


def rego_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("codemode-rego-")}


async def outcome(authorizer: RegoAuthorizer, item: AuthorizationInput) -> str:
    try:
        await authorizer.authorize(Ctx(time.monotonic() + 30), item)
    except Denied:
        return "denied"
    except AskUser:
        return "ask"
    except PolicyError as exc:
        return f"failure: {exc}"
    return "allowed"


# -- which policies are bounded -------------------------------------------------------------------


@pytest.mark.parametrize("source", BOUNDED.values(), ids=BOUNDED.keys())
def test_bounded_policies(source: str) -> None:
    assert bounded.unbounded_reason({"p.rego": source}) is None
    decision = DECISION if source is REALISTIC else "data.app.allow"
    RegoAuthorizer(decision, {"p.rego": source})  # and each is a valid policy


@pytest.mark.parametrize(("body", "reason"), UNBOUNDED.values(), ids=UNBOUNDED.keys())
def test_unbounded_forms_are_named(body: str, reason: str) -> None:
    found = bounded.unbounded_reason({"p.rego": HEAD + body + "\n"})
    assert found is not None and reason in found, found


def test_an_import_of_the_input_is_unbounded() -> None:
    source = "package app\nimport rego.v1\nimport input.arguments as args\n\nallow if args.n == 1\n"
    assert bounded.unbounded_reason({"p.rego": source}) == "p.rego: line 3: import input.arguments"


def test_one_unbounded_module_makes_the_policy_unbounded() -> None:
    lib = "package lib\nimport rego.v1\n\nn := count([1 | true])\n"
    modules = {"a.rego": BOUNDED["one rule"], "b.rego": lib}
    assert bounded.unbounded_reason(modules) is not None


def test_small_input_counts_values_and_characters() -> None:
    assert bounded.small_input({"a": list(range(bounded.MAX_INLINE_VALUES - 2))})
    assert not bounded.small_input({"a": list(range(bounded.MAX_INLINE_VALUES))})
    assert bounded.small_input({"k": "x" * (bounded.MAX_INLINE_CHARS - 1)})
    assert not bounded.small_input({"k": "x" * bounded.MAX_INLINE_CHARS})
    assert not bounded.small_input({"k" * (bounded.MAX_INLINE_CHARS + 1): 1})  # keys count too
    assert not bounded.small_input([[[[]]]] * bounded.MAX_INLINE_VALUES)


def test_the_authorizers_count_is_the_whole_documents() -> None:
    """authorize() walks only the arguments and adds the fixed part: the same answer as counting the
    whole document, at and around both caps."""
    for n in range(bounded.MAX_INLINE_VALUES - 12, bounded.MAX_INLINE_VALUES - 2):
        for width in (0, 60, 66, 70):
            for subject in ("a", "s" * 300):
                document = rego_module._document(inp(subject, tags=["t" * width] * n))
                assert rego_module._small(document) == bounded.small_input(document), (n, width)


# -- where the evaluation runs, and what it decides --------------------------------------------------


async def test_a_bounded_policy_decides_on_the_loop_thread_without_a_hand_off() -> None:
    before = rego_threads()
    a = RegoAuthorizer(DECISION, {"p.rego": REALISTIC})
    assert await outcome(a, inp("alice")) == "allowed"
    assert await outcome(a, inp("bob", key="secret/x", tags=[])) == "denied"
    assert await outcome(a, inp("bob", "records.delete")) == "ask"
    assert rego_threads() == before  # no evaluation thread was ever needed
    a.close()


async def test_decisions_are_the_pools_on_every_input() -> None:
    """The same outcome (allow, deny, ask, or the same failure) inline and on the pool, over random
    inputs, including inputs the evaluator refuses."""
    rng = random.Random(7)
    fast = RegoAuthorizer(DECISION, {"p.rego": REALISTIC})
    pooled = RegoAuthorizer(DECISION, {"p.rego": REALISTIC}, bounded_inline=False)
    names = ["records.lookup", "records.search", "records.update", "records.delete", "records.other"]
    for i in range(300):
        subject = rng.choice(["alice", "bob", "dave"])
        arguments: dict[str, Any] = {
            "key": rng.choice(["a/b", "secret/x", f"k{i}", "nul\x00", 7]),
            "tags": [f"t{j}" for j in range(rng.randrange(0, 10))],
            "owner": rng.choice([subject, "someone"]),
        }
        if rng.random() < 0.1:
            arguments["big"] = 2**70
        item = inp(subject, rng.choice(names), **arguments)
        assert await outcome(fast, item) == await outcome(pooled, item), item
    fast.close()
    pooled.close()


async def test_a_large_input_goes_to_the_pool() -> None:
    before = rego_threads()
    a = RegoAuthorizer(DECISION, {"p.rego": REALISTIC}, max_workers=1)
    big = inp("bob", key="a/b", tags=list(range(bounded.MAX_INLINE_VALUES)))
    assert await outcome(a, big) == "denied"
    assert len(rego_threads() - before) == 1
    a.close()


async def test_a_deadline_closer_than_the_budget_goes_to_the_pool() -> None:
    before = rego_threads()
    a = RegoAuthorizer(DECISION, {"p.rego": REALISTIC}, max_workers=1)
    try:
        await a.authorize(Ctx(time.monotonic() + INLINE_BUDGET / 2), inp("alice"))
    except PolicyError as exc:
        assert "deadline" in str(exc)
    assert len(rego_threads() - before) == 1
    a.close()


async def test_deadline_cancellation_and_close_on_the_bounded_path() -> None:
    a = RegoAuthorizer(DECISION, {"p.rego": REALISTIC})
    with pytest.raises(PolicyError, match="deadline"):
        await a.authorize(Ctx(time.monotonic() - 1), inp("alice"))
    ctx = Ctx(time.monotonic() + 30)
    ctx.cancelled.set()
    with pytest.raises(PolicyError, match="cancelled"):
        await a.authorize(ctx, inp("alice"))
    a.close()
    with pytest.raises(PolicyError, match="closed"):
        await a.authorize(None, inp("alice"))


async def test_an_evaluation_over_twice_the_budget_sends_later_ones_to_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The measured guard behind the lexical one and the calibration: one inline evaluation over
    twice the budget (here every one is: a machine, or a policy, slower than the budget) is enough."""
    before = rego_threads()
    a = RegoAuthorizer(DECISION, {"p.rego": REALISTIC}, max_workers=1)
    monkeypatch.setattr(rego_module, "INLINE_BUDGET", 1e-9)
    assert await outcome(a, inp("alice")) == "allowed"
    assert rego_threads() == before
    for _ in range(3):
        assert await outcome(a, inp("alice")) == "allowed"
    assert len(rego_threads() - before) == 1
    a.close()


async def _goes_to_the_pool(a: RegoAuthorizer) -> bool:
    before = rego_threads()
    assert await outcome(a, inp("alice")) == "allowed"
    return len(rego_threads() - before) == 1


@pytest.mark.parametrize("quick_between", [0, 50])
async def test_repeated_overruns_trip_the_guard_whatever_comes_between(quick_between: int) -> None:
    """_SLOW_LIMIT overruns (each under twice the budget) within _SLOW_WINDOW trip the guard; quick
    evaluations in between never take one back (R21-B2)."""
    a = RegoAuthorizer(DECISION, {"p.rego": REALISTIC}, max_workers=1)
    over = INLINE_BUDGET * 1.5
    for i in range(rego_module._SLOW_LIMIT - 1):
        a._timed(over, now=100.0 + i)
        for _ in range(quick_between):
            a._timed(INLINE_BUDGET / 10, now=100.0 + i)
    assert not await _goes_to_the_pool(a)
    a._timed(over, now=100.0 + rego_module._SLOW_LIMIT)
    assert await _goes_to_the_pool(a)
    a.close()


async def test_overruns_spread_over_more_than_the_window_do_not_trip_the_guard() -> None:
    a = RegoAuthorizer(DECISION, {"p.rego": REALISTIC}, max_workers=1)
    for i in range(3 * rego_module._SLOW_LIMIT):
        a._timed(INLINE_BUDGET * 1.5, now=i * rego_module._SLOW_WINDOW / (rego_module._SLOW_LIMIT - 1.5))
    assert not await _goes_to_the_pool(a)
    a.close()


async def test_an_evaluation_past_its_deadline_trips_the_guard() -> None:
    a = RegoAuthorizer(DECISION, {"p.rego": REALISTIC}, max_workers=1)
    a._timed(0.0, late=True)
    assert await _goes_to_the_pool(a)
    a.close()


async def test_a_thread_without_its_interpreter_hands_off() -> None:
    """R21-B6 for a policy that passes calibration: built on another thread, the authorizer has no
    interpreter on the loop's thread, and builds none there (the decision goes to the pool)."""
    before = rego_threads()
    a = await asyncio.to_thread(RegoAuthorizer, DECISION, {"p.rego": REALISTIC}, max_workers=1)
    try:
        assert await outcome(a, inp("alice")) == "allowed"
        assert len(rego_threads() - before) == 1
        assert await asyncio.to_thread(a.decide, inp("alice")) is True  # and it is a bounded policy
    finally:
        a.close()


async def test_a_policy_that_fails_calibration_hands_off_with_a_quick_input() -> None:
    """R21-B1: calibration classifies by what the policy costs on its worst inputs, not on the one at
    hand: a slow deny list takes the hand-off even for a one-character argument."""
    rules = "".join(f'deny contains "p{i}" if contains(input.arguments.key, "x{i}")\n' for i in range(400))
    source = HEAD + rules + "allow if count(deny) == 0\n"
    assert bounded.unbounded_reason({"p.rego": source}) is None
    before = rego_threads()
    a = RegoAuthorizer("data.app.allow", {"p.rego": source}, max_workers=1)
    try:
        assert await outcome(a, inp("bob", key="k")) == "allowed"
        assert len(rego_threads() - before) == 1
    finally:
        a.close()


def test_bounded_inline_must_be_a_bool() -> None:
    with pytest.raises(rego_module.InvalidPolicy, match="bounded_inline"):
        RegoAuthorizer(DECISION, {"p.rego": REALISTIC}, bounded_inline=1)  # type: ignore[arg-type]


# -- the event loop keeps running ----------------------------------------------------------------------


async def test_a_tenant_cannot_hold_the_loop_with_a_large_input() -> None:
    """Attack: a tenant sends arguments large enough that evaluating a bounded policy on them takes
    a long time. They go to an evaluation thread, and the loop keeps serving other tasks (without
    the input cap this evaluation runs on the loop's thread and nothing else runs meanwhile)."""
    a = RegoAuthorizer("data.app.allow", {"p.rego": HEAD + "allow if 1 in input.arguments.tags\n"})
    tags = list(range(2, 400_000))  # hundreds of milliseconds to evaluate
    ticks, result = await ticks_while(a.authorize(Ctx(time.monotonic() + 60), inp("bob", tags=tags)))
    assert isinstance(result, Denied)
    assert ticks > 10
    a.close()


async def test_a_slow_policy_keeps_its_deadline_and_leaves_the_loop_free() -> None:
    """A policy that may iterate without bound (a tenant picks n) stays on the pool: the call fails at
    its deadline and other tasks run while it evaluates."""
    a = RegoAuthorizer(
        "data.app.allow",
        {"p.rego": HEAD + "allow if count([x | some x in numbers.range(1, input.arguments.n)]) > 0\n"},
        max_workers=1,
    )
    started = time.monotonic()
    # n = 2,000,000 takes ~3.5 s and ~1.6 GB here; far larger n keeps evaluating (and allocating) on
    # the pool thread long after the test: 50,000,000 grew the suite's memory past 15 GB.
    ticks, result = await ticks_while(a.authorize(Ctx(time.monotonic() + 0.3), inp("bob", n=2_000_000)))
    assert isinstance(result, PolicyError) and "deadline" in str(result)
    assert time.monotonic() - started < 2.5  # the evaluation itself takes longer
    assert ticks > 10
    threads = rego_threads()
    a.close()
    for thread in threads:  # let the abandoned evaluation end here, not during later tests
        await asyncio.to_thread(thread.join, 60)


async def test_task_cancellation_on_the_pool_still_propagates() -> None:
    a = RegoAuthorizer(
        "data.app.allow",
        {"p.rego": HEAD + "allow if count([x | some x in numbers.range(1, input.arguments.n)]) > 0\n"},
        max_workers=1,
    )
    task = asyncio.create_task(a.authorize(None, inp("bob", n=3_000_000)))
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    threads = rego_threads()
    a.close()
    for thread in threads:  # the abandoned evaluation ends here, not during later tests
        await asyncio.to_thread(thread.join, 60)
