"""docs/reference must not contradict the code: limits, error texts, tool schemas, search constants,
the protocol's kinds and the program surface are read from the code and looked up in the pages."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from codemode.catalog import search
from codemode.common import errors, outcomes
from codemode.execution import limits
from codemode.mcp import adapter as mcp
from codemode_worker import PROTOCOL_VERSION, protocol
from codemode_worker import interpreter as interpreter_messages

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"


def page(name: str) -> str:
    return (REFERENCE / name).read_text(encoding="utf-8")


def flat(name: str) -> str:
    """The page with every run of whitespace (line breaks included) turned into one space."""
    return " ".join(page(name).split())


def test_every_relative_link_resolves() -> None:
    for path in REFERENCE.glob("*.md"):
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"


def test_the_index_lists_every_page() -> None:
    index = page("README.md")
    for path in REFERENCE.glob("*.md"):
        if path.name != "README.md":
            assert f"]({path.name})" in index, f"README.md does not list {path.name}"


def test_limits_table_is_generated_from_the_limits() -> None:
    # Defaults, units and texts live on codemode.Limits' fields; the page carries the generated table.
    assert limits.limits_table() in page("limits.md")
    for field in dataclasses.fields(limits.Limits):
        row = next(
            line for line in limits.limits_table().splitlines() if line.startswith(f"| `{field.name}` |")
        )
        default = field.default
        cell = f"{default:,}" if isinstance(default, int) else str(default)
        assert f"| {cell} |" in row, f"{field.name} default is {default}"


def test_every_coarse_error_text_is_documented() -> None:
    text = page("errors.md")
    classes = [
        errors.Unauthenticated,
        errors.NotFound,
        errors.InvalidProgram,
        errors.InvalidArguments,
        errors.PermissionDenied,
        errors.PolicyFailure,
        errors.ResourceLimit,
        errors.CapabilityFailure,
        errors.Internal,
    ]
    for cls in classes:
        assert f"| `{cls.text}` |" in text, f"errors.md lacks {cls.text!r}"
    assert f"at most {errors.MAX_DISCLOSED_BYTES}" in text


@pytest.mark.parametrize("tool", mcp.TOOL_NAMES)
def test_tool_argument_error_text_and_schema_are_documented(tool: str) -> None:
    text = page("tools.md")
    definition = next(t for t in mcp.tool_definitions() if t.name == tool)
    (arg,) = definition.input_schema["properties"]
    assert f"| `{tool}` |" in text and f"`{arg}`" in text
    generic = 'invalid tool arguments: <tool> takes exactly one argument, "<arg>", a string'
    assert generic in text
    assert generic.replace("<tool>", tool).replace("<arg>", arg) == mcp._TOOLS[tool].schema_error
    assert definition.output_schema is not None
    for key in definition.output_schema["properties"]:
        assert f'"{key}"' in text, f"tools.md does not show {tool}'s output key {key}"


def test_search_constants_are_documented() -> None:
    text = flat("search.md")
    assert " ".join(sorted(search.CONNECTORS)) in text
    assert f"More than {search.MAX_QUERY_TOKENS} distinct" in text
    assert f"at least **{search.MIN_PREFIX_CHARS} characters**" in text
    name, terms, summary, description = (f"{w:g}" for w in search.FIELD_WEIGHTS)
    assert f"name {name}, search terms {terms}, summary {summary}, description {description}" in text
    assert f"(1 if exact else {search.PREFIX_FACTOR:g})" in text
    assert f"1 + {search.RARITY_SPAN:g} × ln(N / df(t))" in text
    assert search.tokenize("GitHub.Pulls.createReview") == ["github", "pulls", "create", "review"]
    assert "`GitHub.Pulls.createReview` → `github pulls create review`" in text


def test_protocol_kinds_and_codes_are_documented() -> None:
    text = page("protocol.md")
    assert f"Version: **{PROTOCOL_VERSION}**" in text
    for kind in protocol.ALL_KINDS:
        assert f"| `{kind}` |" in text, f"protocol.md lacks kind {kind}"
    for code in protocol.ERROR_CODES:
        assert f"`{code}`" in text
    for key in protocol.LIMIT_KEYS:
        assert f"`{key}`" in text
    assert f"{protocol.MAX_HOST_FRAME_BYTES // (1024 * 1024)} MiB" in text


def test_program_surface_is_documented() -> None:
    surface = " ".join(sorted(protocol.RESERVED_ROOTS, key=lambda n: (n[0].islower(), n)))
    assert surface in flat("program.md")
    assert surface in flat("capabilities.md")  # the reserved roots


def test_the_call_ledger_table_is_the_codes_mapping() -> None:
    text = page("tools.md")
    rows = re.findall(r"^\| `([a-z ]+)` \|[^\n]*\| `([a-z_]+)` \| `([a-z_]+)` \|$", text, re.M)
    assert {(decision, outcome): word for word, decision, outcome in rows} == outcomes.AUDIT_OUTCOMES
    assert list(dict.fromkeys(word for word, _, _ in rows)) == list(outcomes.LEDGER_OUTCOMES)
    schema = next(t for t in mcp.tool_definitions() if t.name == "execute").output_schema
    assert schema is not None
    outcome = schema["properties"]["calls"]["items"]["properties"]["outcome"]
    assert outcome["enum"] == list(outcomes.LEDGER_OUTCOMES)
    assert json.dumps(list(outcomes.LEDGER_OUTCOMES)) in flat("tools.md")  # the schema shown
    service = " ".join((REFERENCE.parent / "service.md").read_text(encoding="utf-8").split())
    for decision, outcome in outcomes.AUDIT_OUTCOMES:
        assert f"`{decision}`" in service and f"`{outcome}`" in service, (decision, outcome)


def test_the_execute_description_teaches_the_ledger_attempt_and_prints() -> None:
    description = mcp.EXECUTE_DESCRIPTION
    for word in outcomes.LEDGER_OUTCOMES:
        assert f'"{word}"' in description, word
    assert "attempt(records.get, id=7)" in description
    assert '{"ok": True, "value": <its result>} or {"ok": False, "error": "<error text>"}' in description
    assert '"prints"' in description


def test_recoverable_calls_and_prints_are_documented_exactly() -> None:
    program = flat("program.md")
    assert interpreter_messages.ATTEMPT_MESSAGE in program
    assert '`{"ok": True, "value": <the call\'s result>}`' in program
    assert '`{"ok": False, "error": <text>}`' in program
    marker = outcomes.PRINTS_CUT_MARKER.replace("\n", "\\n")
    assert f"`{marker}`" in program and f"`{marker}`" in flat("tools.md")
    protocol_page = flat("protocol.md")
    for key in protocol.OPTIONAL_LIMIT_KEYS:
        assert f"`{key}` (≥ 1)" in protocol_page
    assert f"at most {protocol.PRINT_CHUNK_CHARS:,} characters" in protocol_page
    formula = f"`max_native_calls + 1 + bit_length(max_steps // {protocol.STEPS_PER_CHECK} + 1)"
    assert formula + f" + max_print_bytes // {protocol.PRINT_CHUNK_CHARS}`" in protocol_page
    assert protocol.max_print_frames(100, 1_000_000, 8192) == 100 + 1 + (1001).bit_length() + 1
    assert "At most `max_value_bytes` (`build()` refuses more)" in flat("limits.md")


def test_asking_the_user_is_documented_exactly() -> None:
    """authorization.md#asking-the-user: the decision, the answers, the bounds of the question, the
    form, the retry state and the example message are the code's."""
    from typing import get_args

    from codemode.authz import rego
    from codemode.execution import approval, observe
    from codemode.mcp import approval as mcp_approval
    from codemode.mcp import retries

    text = flat("authorization.md")
    assert "## Asking the user" in page("authorization.md")
    assert f'the string `"{rego.ASK}"`' in text
    for answer in get_args(observe.ApprovalAnswer):
        if answer:
            assert f"`{answer}`" in text, answer
    assert f"A call whose argument lines fit in {approval.MAX_ARGUMENTS_TEXT:,} bytes is shown whole" in text
    assert f"The whole message is at most {approval.MAX_MESSAGE_BYTES:,} bytes" in text
    assert f"summary from the catalog (cut to {approval.MAX_SUMMARY_TEXT} bytes)" in text
    hidden = approval.ApprovalRequest("records.update", "s", "id: 1", 1234).message.split("\n")[0]
    assert f"`{hidden.replace('1,234', 'N')}`" in text
    assert "`… [N bytes not shown]`" in text and "`… [K more arguments, N bytes, not shown]`" in text
    (field,) = mcp_approval.APPROVAL_SCHEMA["required"]
    assert (
        f"one required boolean, `{field}`" in text
        and f"one input request, `{mcp_approval.INPUT_KEY}`" in text
    )
    assert f'`{{"{field}": true}}`' in text
    assert f'"{retries.UNKNOWN_STATE}"' in text
    # suspension and replay, exactly
    from codemode.common.outcomes import AUDIT_OUTCOMES

    assert f"`{AUDIT_OUTCOMES[('diverged', 'not_run')]}`" in text and "resumes the execute by replay" in text
    assert "`max_suspension_bytes`" in text and "`max_suspension_bytes`" in flat("limits.md")
    assert "`suspension bytes`" in flat("errors.md") and "`replay diverged`" in flat("tools.md")
    assert f"(default {limits.Limits().max_approval_wait:.0f} s)" in text
    example = approval.ApprovalRequest("records.delete", "Delete one of your records by its id.", "id: 1")
    assert "```\n" + example.message + "\n```" in page("authorization.md")
    for name in ("max_approval_time", "max_pending_approvals", "max_approval_wait"):
        assert f"`{name}`" in text and f"`{name}`" in flat("limits.md")
    assert "`declined`" in flat("errors.md") and "`declined`" in flat("program.md")
    for decision in ("approved", "declined", "ask"):
        assert f"`{decision}`" in flat("python-api.md")


def test_the_tracing_page_lists_every_span_and_attribute() -> None:
    from codemode.execution import tracing

    text = (REFERENCE.parent / "tracing.md").read_text(encoding="utf-8")
    for name in (*tracing.SPAN_NAMES, *tracing.ATTRIBUTES):
        assert f"`{name}`" in text, name


def test_the_pack_lifecycle_is_documented() -> None:
    """python-api.md names every export of codemode.packs, Builder.add_pack's parameters, the two
    lifecycle steps and the open failure's exact form (read off a real failure)."""
    import asyncio
    import inspect

    import codemode
    from codemode import packs
    from codemode.packs.lifecycle import LoadedPack

    text = flat("python-api.md")
    for name in packs.__all__:
        assert f"`{name}" in text, name
    parameters = list(inspect.signature(codemode.Builder.add_pack).parameters)[1:]
    assert parameters == ["pack", "settings", "name"]
    assert "`Builder.add_pack(pack, settings=None, *, name=None)`" in text
    assert {"open", "aclose"} <= set(dir(packs.Lifecycle))
    assert "`async open()` and `async aclose()`" in text

    class Failing:
        async def open(self) -> None:
            raise OSError("gone")

    with pytest.raises(packs.PackOpenError) as caught:
        asyncio.run(LoadedPack("pack 'db'", Failing(), []).open())
    assert str(caught.value) == "pack 'db': open failed: OSError: gone"
    assert "`pack '<name>': open failed: <type>: <text>`" in text
    assert "open failed: OperationalError" in " ".join(
        (REFERENCE.parent / "packs.md").read_text(encoding="utf-8").split()
    )


def test_authorization_md_states_the_bounded_paths_limits() -> None:
    """authorization.md: the inline caps, the calibration limit, the per-turn budget and the guard's
    trip points are the code's (codemode.authz.rego, codemode.authz.rego._bounded)."""
    from codemode.authz.rego import _authorizer as rego
    from codemode.authz.rego import _bounded as bounded

    text = flat("authorization.md")
    budget_ms = rego.INLINE_BUDGET * 1e3
    assert (
        f"at most {bounded.MAX_INLINE_VALUES} values, {bounded.MAX_INLINE_CHARS:,} characters and "
        f"{bounded.MAX_INLINE_DEPTH} levels of nesting" in text
    )
    assert f"stays within {rego.INLINE_BUDGET / 4 * 1e3:g} ms over a one-rule policy's" in text
    assert f"more than {budget_ms:g} ms left before the deadline" in text
    assert f"One loop turn spends at most {budget_ms:g} ms on such evaluations" in text
    assert (
        f"one inline evaluation over {2 * budget_ms:g} ms of CPU time or past its deadline, or "
        f"{rego._SLOW_LIMIT} over {budget_ms:g} ms within {rego._SLOW_WINDOW:g} s" in text
    )


def test_the_state_pack_page_shows_each_call_and_bound_as_the_code_has_them() -> None:
    """state.md's signatures are describe_api's, its bounds the pack's constants, its errors the
    pack's and the limit kinds'."""
    import codemode
    from codemode_capabilities import state

    server = codemode.Builder(authorizer=codemode.allow_all()).register(*state.capabilities()).build()
    text = flat("state.md")
    for cap in server.plan.capabilities:
        shown = server.describe(cap.name).to_dict()["signature"].replace("|", "\\|")
        assert f"`{shown}`" in text, f"state.md lacks {shown}"
        assert f"`{cap.id}`" in text
    assert f"1 to {state.MAX_KEY_BYTES} UTF-8 bytes" in text
    assert f"1 to {state.MAX_TTL:,} seconds" in text
    assert f"1 to {state.MAX_LIST_LIMIT}, default {state.DEFAULT_LIST_LIMIT}" in text
    assert f"`capability failed: {state.VERSION_CONFLICT}`" in text
    for kind in ("state keys", "state bytes"):
        assert kind in errors.LIMIT_KINDS and f"`resource limit exceeded: {kind}`" in text
    assert "`max_state_keys`" in text and "`max_state_bytes`" in text
