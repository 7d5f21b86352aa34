"""Review R21 (hostile): attacks on the bounded Rego path (a policy of the bounded forms evaluated on
the event loop's thread). The findings R21-B1..B6 were strict xfail tests on the code as first merged;
each asserts the outcome the design promises (the loop is held at most about INLINE_BUDGET per
decision and per loop turn, the guard stops inline evaluation that overruns, an inline decision keeps
the deadline) and passes since the calibration, the depth cap, the new guard and the per-turn budget
(docs/authz.md). The tests after them pin attacks that held."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from codemode.authz import AuthorizationInput, PolicyError, Subject
from codemode.authz.rego import InvalidPolicy, RegoAuthorizer
from codemode.authz.rego import _authorizer as rego_module
from codemode.authz.rego import _bounded as bounded
from tests.support.fakes import Ctx
from tests.support.loop import ticks_while
from tests.unit.authz.test_rego_bounded import outcome, rego_threads

HEAD = "package app\nimport rego.v1\n\ndefault allow := false\n\n"
DECISION = "data.app.allow"
#: A four-byte character: MAX_INLINE_CHARS counts code points, the evaluator works on UTF-8 bytes.
WIDE = "\U0001f600"
#: The largest `sql` argument the caps still let through inline (the rest of the input document and
#: the key leave a little under 4,096 characters).
CAPPED_SQL = WIDE * 4000


def deny_list(patterns: int) -> str:
    """An honest deny-list policy: one partial-set rule per forbidden pattern. Every form in it is
    on the allow-list (no iteration, linear builtins only), so the policy is *bounded*; its
    evaluation time is the number of rules times the argument's length."""
    rules = "".join(
        f'deny contains "p{i}" if contains(lower(input.arguments.sql), "pattern-{i}")\n'
        for i in range(patterns)
    )
    return HEAD + rules + "allow if count(deny) == 0\n"


def gated_checks(patterns: int) -> str:
    """A policy that checks a query argument only for the query capability: quick (its body stops at
    the first line) for every other capability, slow for a long query. Bounded by the allow-list."""
    checks = "".join(f'\tnot contains(lower(input.arguments.sql), "pattern-{i}")\n' for i in range(patterns))
    return (
        HEAD
        + 'allow if input.capability.name == "records.lookup"\n'
        + 'allow if {\n\tinput.capability.name == "db.query"\n'
        + checks
        + "}\n"
    )


def inp(name: str = "db.query", subject: str = "bob", **arguments: Any) -> AuthorizationInput:
    return AuthorizationInput(Subject(subject), name + ".v1", name, arguments)


# -- findings ---------------------------------------------------------------------------------------


async def test_a_large_bounded_form_policy_is_not_evaluated_on_the_loop() -> None:
    """R21-B1. Attack (a policy author's honest mistake, a tenant's capped input): a generated deny list of
    400 one-line rules, every form on the allow-list. Each rule body runs once, but the work is the
    number of rules times the argument's length, and nothing bounds the number of rules. The
    promise is that an inline evaluation takes well under INLINE_BUDGET; this one takes about 30
    times that, so it must not be evaluated on the loop's thread (it must take the hand-off)."""
    source = deny_list(400)
    assert bounded.unbounded_reason({"p.rego": source}) is None  # the forms are all allowed
    before = rego_threads()
    a = RegoAuthorizer(DECISION, {"p.rego": source}, max_workers=1)
    try:
        assert await outcome(a, inp(sql=CAPPED_SQL)) == "allowed"
        assert len(rego_threads() - before) == 1, "the decision ran on the event loop's thread"
    finally:
        a.close()


async def test_quick_decisions_do_not_hide_repeated_overruns_from_the_guard() -> None:
    """R21-B2. Attack (a tenant, 1 slow call then 3 quick ones, repeated): the policy checks a query
    argument only for the query capability. A long query makes one decision take about 5 ms on the
    loop's thread (five times INLINE_BUDGET); a lookup takes about 40 us. The guard adds one per
    overrun and takes one off per quick decision, so with quick decisions in between it stays below
    its limit for ever, and every long query stalls the loop again. After 30 overruns the slow
    decisions must have left the loop."""
    source = gated_checks(100)
    assert bounded.unbounded_reason({"p.rego": source}) is None
    before = rego_threads()
    a = RegoAuthorizer(DECISION, {"p.rego": source}, max_workers=1)
    try:
        for _ in range(30):
            assert await outcome(a, inp(sql=CAPPED_SQL)) == "allowed"
            for _ in range(3):
                assert await outcome(a, inp("records.lookup", key="k")) == "allowed"
        assert await outcome(a, inp(sql=CAPPED_SQL)) == "allowed"
        assert len(rego_threads() - before) == 1, "30 overruns later, decisions still run on the loop"
    finally:
        a.close()


async def test_an_inline_decision_keeps_its_deadline_and_the_loop() -> None:
    """R21-B3. Attack: the bounded path starts inline whenever more than INLINE_BUDGET (1 ms) is left, and
    an evaluation cannot be stopped, so the deadline is kept only if the evaluation is bounded by
    the budget. On the hand-off the caller gets the deadline failure at the deadline while other
    tasks run; inline, nothing else runs until the evaluation ends."""
    a = RegoAuthorizer(DECISION, {"p.rego": deny_list(1000)}, max_workers=1)
    try:
        ticks, result = await ticks_while(a.authorize(Ctx(time.monotonic() + 0.005), inp(sql=CAPPED_SQL)))
        assert isinstance(result, PolicyError) and "deadline" in str(result), result
        assert ticks > 0, "the event loop ran nothing else until the evaluation ended, past the deadline"
    finally:
        a.close()


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"k": value}
    return value


def median_decide(a: RegoAuthorizer, item: AuthorizationInput, rounds: int = 41) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        a.decide(item)
        times.append(time.perf_counter() - started)
    return sorted(times)[rounds // 2]


def test_an_input_within_the_caps_costs_about_what_a_flat_one_does() -> None:
    """R21-B4. Attack (a tenant, any capability with a free-form object argument): the inline caps count
    values and characters, and the documented inline bound is measured on flat inputs. Building a
    nested object on rego-cpp's input stack costs more per level the deeper it is, so a chain of
    objects within the value cap (56 deep) cost 9-17 times a flat input at both caps, for a one-rule
    policy that never reads it. The depth cap (MAX_INLINE_DEPTH) sends such a chain to the hand-off;
    the costliest nesting still evaluated inline (chains at the depth cap filling the value cap)
    must cost about what a flat input does (ratio in one run, so the machine's speed cancels out)."""
    a = RegoAuthorizer(DECISION, {"p.rego": HEAD + 'allow if input.subject.id == "alice"\n'})
    try:
        assert not rego_module._small(rego_module._document(inp(l=nested(bounded.MAX_INLINE_VALUES - 8))))
        chain = bounded.MAX_INLINE_DEPTH - 2  # the document and `arguments` are the first two levels
        deep = inp(**{f"c{i}": nested(chain) for i in range((bounded.MAX_INLINE_VALUES - 6) // (chain + 1))})
        flat = inp(l=["x" * 70] * (bounded.MAX_INLINE_VALUES - 9))
        assert rego_module._small(rego_module._document(deep))
        assert not rego_module._small(rego_module._document(inp(c=nested(chain + 1))))
        assert rego_module._small(rego_module._document(flat))
        median_decide(a, deep, 5)  # warm up
        ratio = median_decide(a, deep) / median_decide(a, flat)
        assert ratio < 3, f"a nested input within the caps costs {ratio:.1f}x a flat one at the caps"
    finally:
        a.close()


async def test_concurrent_quick_decisions_do_not_hold_the_loop_turn_after_turn() -> None:
    """R21-B5. Attack (20 concurrent executes, one tenant or many): every decision is under INLINE_BUDGET,
    so none counts against the guard, but an inline decision never yields, so one loop turn runs
    all 20 back to back and every other task (the /healthz handler, other tenants' I/O) waits for
    them, turn after turn. The loop must get a turn at least every ~2 ms of inline evaluation (the
    hand-off's own wait budget) on average; decision times are measured in the same run."""
    a = RegoAuthorizer(DECISION, {"p.rego": gated_checks(16)})
    item = inp(sql=CAPPED_SQL)
    try:
        median_decide(a, item, 5)
        each = median_decide(a, item)
        tasks, rounds = 20, 20

        async def tenant() -> None:
            for _ in range(rounds):
                assert await outcome(a, item) == "allowed"
                await asyncio.sleep(0)  # the worker's next native call

        # A machine busy with other work can starve one run of its turns; the attack is the loop
        # held turn after turn, which holds in every run: two runs, and one must give the turns.
        seen = []
        for _ in range(2):
            ticks, result = await ticks_while(asyncio.gather(*(tenant() for _ in range(tasks))))
            assert not isinstance(result, Exception), result
            held = tasks * rounds * each
            seen.append(f"{ticks} loop turns for {held * 1e3:.0f} ms of inline evaluation")
            if ticks >= held / 0.002:
                break
            each = median_decide(a, item)  # measured again, beside the run that fell short
        else:
            raise AssertionError("; ".join(seen))
    finally:
        a.close()


async def test_an_authorizer_built_off_the_loop_does_not_build_on_it() -> None:
    """R21-B6. Attack (an operator's careful choice): building a large policy's authorizer in a thread so
    the loop is not held. The loop's thread then has no interpreter, and the first bounded decision
    builds one there, outside the timed evaluation, so neither the budget nor the guard sees it.
    The loop must keep running while an interpreter is built (the decision takes the hand-off)."""
    a = await asyncio.to_thread(RegoAuthorizer, DECISION, {"p.rego": deny_list(400)}, max_workers=1)
    try:
        ticks, result = await ticks_while(a.authorize(Ctx(time.monotonic() + 30), inp(sql="x")))
        assert result is None, result
        assert ticks > 0, "the loop ran nothing else while its interpreter was built"
    finally:
        a.close()


# -- attacks that held ------------------------------------------------------------------------------


def test_rule_references_are_evaluated_once() -> None:
    """Attack: a chain of rules each referring to the one before twice (2**30 evaluations if rule
    values were not kept). rego-cpp keeps a rule's value within a query, so the chain is linear; a
    decision takes well under a second (without the memo it would take hours)."""
    rules = "".join(f"r{i} if {{\n\tr{i - 1}\n\tr{i - 1}\n}}\n" for i in range(1, 31))
    source = HEAD + "r0 if input.arguments.x == 1\n" + rules + "allow if r30\n"
    assert bounded.unbounded_reason({"p.rego": source}) is None
    a = RegoAuthorizer(DECISION, {"p.rego": source})
    started = time.monotonic()
    assert a.decide(inp(x=1)) is True
    assert a.decide(inp(x=2)) is False
    assert time.monotonic() - started < 10
    a.close()


#: A rule that iterates, put where a line-based reading might not see it.
ITERATES = "allow if { some t in input.arguments.tags; t == 1 }\n"
HIDDEN = {
    "lone CR after an import": "package app\nimport rego.v1\r" + ITERATES + "default allow := false\n",
    "rule after an import on one line": "package app\nimport rego.v1; "
    + ITERATES
    + "default allow := false\n",
    "import continued on the next line": "package app\nimport rego.v1\n  "
    + ITERATES
    + "default allow := false\n",
    "keyword as a key": HEAD + "allow if input.arguments.some == 1\n",
    "computed part behind a variable": HEAD + "allow if {\n\txs := input.arguments.tags\n\txs[_] == 1\n}\n",
    "computed part behind parentheses": HEAD + "allow if (input.arguments.tags)[_] == 1\n",
    "computed rule key": HEAD + "r[input.arguments.k] := 1\nallow if r.a == 1\n",
    "unification with a pattern": HEAD + 'allow if {\n\t{"a": x} = input.arguments.o\n\tx == 1\n}\n',
    "indexof in a raw string context": HEAD + "allow if indexof(input.arguments.key, `a`) >= 0\n",
    "comment hiding nothing": HEAD
    + "# some every with [x | x]\nallow if count([1 | input.arguments.x]) > 0\n",
}


@pytest.mark.parametrize("source", HIDDEN.values(), ids=HIDDEN.keys())
def test_hidden_unbounded_forms_are_refused_or_unbounded(source: str) -> None:
    try:
        a = RegoAuthorizer(DECISION, {"p.rego": source})
    except InvalidPolicy:
        return
    reason = bounded.unbounded_reason({"p.rego": source})
    a.close()
    assert reason is not None, source


#: Bounded policies over edge values: the same outcome inline and on the pool.
EDGE_POLICIES = {
    "sum": HEAD + "allow if sum(input.arguments.l) > 0\n",
    "max": HEAD + "allow if max(input.arguments.l) > 0\n",
    "arith": HEAD + "allow if input.arguments.a + input.arguments.b - 1 > input.arguments.a\n",
    "deep eq": HEAD + "allow if input.arguments.l == input.arguments.m\n",
    "in": HEAD + "allow if input.arguments.a in input.arguments.l\n",
    "strings": HEAD + "allow if upper(trim_space(input.arguments.s)) == lower(input.arguments.s)\n",
    "else": 'package app\nimport rego.v1\n\nallow := true if input.arguments.a == 1 else := "ask" if '
    "input.arguments.a == 2 else := false\n",
    "conflict": HEAD
    + "v := 1 if input.arguments.a == 1\nv := 2 if input.arguments.b == 1\nallow if v == 1\n",
    "object.get": HEAD + 'allow if object.get(input.arguments, ["m", "k"], 0) == 1\n',
}
EDGE_INPUTS: list[dict[str, Any]] = [
    {"l": [1.7976931348623157e308] * 50},
    {"l": [2**63 - 1] * 50, "a": 2**63 - 1, "b": 2**63 - 1},
    {"l": [-(2**63)], "a": -(2**63), "b": -1},
    {"a": 5e-324, "b": 1e308},
    {"l": [[[[[[1]]]]]], "m": [[[[[[1]]]]]], "a": [[[1]]]},
    {"s": "\u3000" + WIDE * 1000 + "\u00df\u0130", "a": 1, "b": 1},
    {"s": "\u0130" * 2000, "a": 2},
    {"m": {"k": 1}, "a": 3},
    {"l": ["x" * 60] * 50, "a": "x" * 60},
    {"l": [1, "a", None, True, {"k": [1]}], "a": None},
]


async def test_edge_values_decide_the_same_inline_and_on_the_pool() -> None:
    """Attack: make the inline path answer differently from the hand-off (allow where it denies or
    fails): number overflow, int64 edges, denormals, deep equality, Unicode case mapping, conflicts,
    else chains. Both paths run the same evaluator code on the same input checks."""
    for name, source in EDGE_POLICIES.items():
        fast = RegoAuthorizer(DECISION, {"p.rego": source})
        pooled = RegoAuthorizer(DECISION, {"p.rego": source}, bounded_inline=False)
        try:
            for arguments in EDGE_INPUTS:
                item = inp(**arguments)
                assert await outcome(fast, item) == await outcome(pooled, item), (name, arguments)
        finally:
            fast.close()
            pooled.close()


async def test_values_outside_the_arguments_are_counted() -> None:
    """Attack: a long subject id or capability name (outside the arguments the authorizer walks)
    pushes the document over the character cap; it goes to the pool."""
    before = rego_threads()
    a = RegoAuthorizer(DECISION, {"p.rego": HEAD + "allow if count(input.subject.id) > 0\n"}, max_workers=1)
    try:
        assert await outcome(a, inp(subject="s" * bounded.MAX_INLINE_CHARS)) == "allowed"
        assert len(rego_threads() - before) == 1
    finally:
        a.close()


async def test_close_and_cancel_before_an_inline_decision() -> None:
    """An inline decision has no await: a cancellation set before it is refused at once, and a
    closed authorizer refuses rather than evaluating on the loop's thread."""
    a = RegoAuthorizer(DECISION, {"p.rego": deny_list(3)})
    ctx = Ctx(time.monotonic() + 30)
    ctx.cancelled.set()
    with pytest.raises(PolicyError, match="cancelled"):
        await a.authorize(ctx, inp(sql="x"))
    a.close()
    with pytest.raises(PolicyError, match="closed"):
        await a.authorize(Ctx(time.monotonic() + 30), inp(sql="x"))
