"""The decorator form, the pack object, ``async with server`` and the public names of ``codemode``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest

import codemode
from codemode import CallContext, CapabilityPack, Subject, allow_all, capability, capability_of
from codemode.packs import PackError, load_pack

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "notes_pack.py"


@dataclass
class In:
    n: int


@dataclass
class Out:
    doubled: int


def test_public_names_are_pinned() -> None:
    assert sorted(codemode.__all__) == sorted(
        [
            "AgentError", "ApprovalAnswer", "ApprovalRequest", "Approver", "Builder", "CallContext",
            "CallDecision", "CallEvent", "CallOutcome", "Capability",
            "CapabilityFailure", "CapabilityPack", "CodeModeError", "Description", "DockerRuntime",
            "ExecuteEvent", "ExecuteOutcome", "ExecuteResult", "ExitInfo", "Internal",
            "InvalidArguments", "InvalidProgram", "InvalidRegistration", "KubernetesQuota",
            "KubernetesRuntime", "LedgerEntry", "Limits", "LocalQuota", "NotFound", "NullObserver",
            "Observer", "PackOpenError", "PermissionDenied", "PolicyFailure", "ProcessRuntime",
            "QuotaStore", "ResourceLimit", "Runtime", "Sandbox",
            "SearchResponse", "Server", "Subject", "Tracing", "Unauthenticated", "WarmPool", "allow_all",
            "authz", "capability", "capability_of",
        ]
    )  # fmt: skip
    for name in codemode.__all__:
        assert getattr(codemode, name) is not None
    assert codemode.Subject is codemode.authz.Subject
    assert codemode.allow_all is codemode.authz.allow_all


def test_decorator_defaults_from_the_docstring() -> None:
    @capability("calc.double", search_terms=["times two"])
    def double(ctx: CallContext, subject: Subject, args: In) -> Out:
        """Double a number,
        exactly.

        Works for any int64 whose double fits."""
        return Out(args.n * 2)

    cap = capability_of(double)
    assert (cap.name, cap.id, cap.summary) == ("calc.double", None, "Double a number, exactly.")
    assert cap.description == "Double a number,\nexactly.\n\nWorks for any int64 whose double fits."
    assert list(cap.search_terms) == ["times two"]
    assert double(None, None, In(2)) == Out(4)  # type: ignore[arg-type]  # still a plain function


def test_undocumented_handler_is_a_named_registration_problem() -> None:
    pack = CapabilityPack()

    @pack.capability("calc.nodoc", id="calc.v1.nodoc")
    def nodoc(ctx: CallContext, subject: Subject, args: In) -> Out:
        return Out(0)

    with pytest.raises(codemode.InvalidRegistration) as info:
        codemode.Builder(authorizer=allow_all()).register(*pack.capabilities()).build()
    assert info.value.problems == ["capability 'calc.nodoc': summary must not be blank"]
    with pytest.raises(TypeError, match="not marked"):
        CapabilityPack(lambda: None)


def test_pack_file_served_with_async_with() -> None:
    caps = load_pack(f"{EXAMPLE}:pack")
    assert [c.name for c in caps] == ["notes.add"]
    assert caps[0].summary == "Add a note to your list and return the whole list."

    async def main() -> object:
        async with codemode.Builder(authorizer=allow_all()).register(*caps).build() as server:
            await server.execute('def main():\n    return notes.add(text="a")\n', subject=Subject(id="u"))
            return await server.execute(
                'def main():\n    return notes.add(text="b")\n', subject=Subject(id="u")
            )

    assert asyncio.run(main()) == {"notes": ["a", "b"]}


def test_pack_file_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="does not exist"):
        load_pack(f"{tmp_path}/missing.py:pack")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(PackError, match=r"importing .* failed: RuntimeError: boom"):
        load_pack(f"{broken}:pack")
