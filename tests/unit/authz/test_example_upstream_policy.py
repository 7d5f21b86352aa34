"""examples/upstream_tenant_dirs.rego: each subject confined to its own directory of a shared
filesystem server, whatever spelling of a path it tries.

Loaded as the CLI loads a policy (``from_files``) and asked for real decisions. End to end with the
real server (where the naive policy's ``..`` trap is shown too): tests/integration/
test_upstream_tenancy.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from codemode.authz import AuthorizationInput, PolicyError, Subject
from codemode.authz.rego import RegoAuthorizer, from_files
from codemode_capabilities.mcp.tenancy import subject_key

POLICY = Path(__file__).resolve().parents[3] / "examples" / "upstream_tenant_dirs.rego"
DECISION = "data.codemode.tenant_dirs.allow"
ROOT = "/srv/tenants"
BOB = f"{ROOT}/{subject_key('bob')}"
ALICE = f"{ROOT}/{subject_key('alice')}"


@pytest.fixture(scope="module")
def authorizer() -> Iterator[RegoAuthorizer]:
    loaded = from_files(DECISION, [POLICY])
    yield loaded
    loaded.close()


def allowed(authorizer: RegoAuthorizer, tool: str, arguments: dict[str, Any], subject: str = "bob") -> bool:
    return authorizer.decide(  # type: ignore[return-value]  # the example policy never asks
        AuthorizationInput(Subject(subject), f"mcp:files:{tool}", f"files.{tool}", arguments)
    )


ALLOWED = [
    ("read_text_file", {"path": f"{BOB}/diary.txt"}),
    ("write_file", {"path": f"{BOB}/notes/2026 plan.md", "content": "x"}),
    ("list_directory", {"path": BOB}),
    ("move_file", {"source": f"{BOB}/a.txt", "destination": f"{BOB}/b/a.txt"}),
    ("read_multiple_files", {"paths": [f"{BOB}/a", f"{BOB}/b..c", f"{BOB}/...x"]}),
    ("list_allowed_directories", {}),
]

DENIED = [
    ("read_text_file", {"path": f"{BOB}/../{subject_key('alice')}/diary.txt"}),  # the trap
    ("read_text_file", {"path": f"{BOB}/x/../../{subject_key('alice')}/diary.txt"}),
    ("read_text_file", {"path": f"{BOB}/.."}),
    ("read_text_file", {"path": f"{BOB}//diary.txt"}),
    ("read_text_file", {"path": f"{BOB}/./diary.txt"}),
    ("read_text_file", {"path": f"{BOB}/"}),
    ("read_text_file", {"path": f"{ALICE}/diary.txt"}),
    ("read_text_file", {"path": f"{ROOT}/{subject_key('bob').upper()}/diary.txt"}),  # case
    ("read_text_file", {"path": f"{ROOT.upper()}/{subject_key('bob')}/diary.txt"}),
    ("read_text_file", {"path": f"{BOB}\\..\\{subject_key('alice')}\\diary.txt"}),
    ("read_text_file", {"path": f"{BOB}/..\\{subject_key('alice')}"}),
    ("read_text_file", {"path": "~/diary.txt"}),
    ("read_text_file", {"path": "diary.txt"}),  # relative: the server picks the directory
    ("read_text_file", {"path": f"{BOB}/%2e%2e/x"}),
    ("read_text_file", {"path": f"{BOB}/caf\u00e9.txt"}),  # non-ASCII: Unicode-equivalent spellings
    ("read_text_file", {"path": f"{BOB}/\u2024\u2024/x"}),  # one-dot leaders that look like ".."
    ("read_text_file", {"path": f"{BOB}/x\n/../y"}),
    ("read_text_file", {"path": f"{BOB}extra/diary.txt"}),  # a sibling sharing the prefix
    ("read_text_file", {"path": ROOT}),
    ("read_text_file", {"path": [f"{BOB}/a"]}),
    ("read_text_file", {}),
    ("move_file", {"source": f"{ALICE}/diary.txt", "destination": f"{BOB}/stolen.txt"}),
    ("move_file", {"source": f"{BOB}/a", "destination": f"{ALICE}/planted.txt"}),
    ("read_multiple_files", {"paths": [f"{BOB}/a", f"{ALICE}/diary.txt"]}),
    ("read_text_file", {"path": f"{BOB}/a", "paths": [f"{ALICE}/diary.txt"]}),
    ("some_new_tool", {"path": f"{BOB}/a"}),  # a tool the policy does not know
]


@pytest.mark.parametrize(("tool", "arguments"), ALLOWED)
def test_a_subject_may_use_its_own_directory(
    authorizer: RegoAuthorizer, tool: str, arguments: dict[str, Any]
) -> None:
    assert allowed(authorizer, tool, arguments)


@pytest.mark.parametrize(("tool", "arguments"), DENIED)
def test_no_spelling_reaches_outside_it(
    authorizer: RegoAuthorizer, tool: str, arguments: dict[str, Any]
) -> None:
    assert not allowed(authorizer, tool, arguments)


def test_a_nul_in_a_path_is_a_policy_failure_never_an_allow(authorizer: RegoAuthorizer) -> None:
    with pytest.raises(PolicyError):
        allowed(authorizer, "read_text_file", {"path": f"{BOB}/x\x00"})


def test_the_same_paths_are_alices_own_and_other_packs_are_not_its_business(
    authorizer: RegoAuthorizer,
) -> None:
    assert allowed(authorizer, "read_text_file", {"path": f"{ALICE}/diary.txt"}, subject="alice")
    assert not allowed(authorizer, "read_text_file", {"path": f"{BOB}/diary.txt"}, subject="alice")
    other = AuthorizationInput(Subject("bob"), "mcp:memory:read_graph", "memory.read_graph", {})
    assert authorizer.decide(other)


@pytest.mark.parametrize("subject", ["\ud800", "\udc00", "a\x00b"])
def test_ids_rego_cannot_represent_are_a_policy_failure_never_another_tenants_key(subject: str) -> None:
    """A lone surrogate could have been hashed as U+FFFD by the policy, colliding with the subject
    '\\ufffd' (and every other lone surrogate): regopy refuses such input instead."""
    loaded = from_files(DECISION, [POLICY])
    try:
        for key in (subject_key("\ufffd"), subject_key(subject)):
            with pytest.raises(PolicyError):
                loaded.decide(
                    AuthorizationInput(
                        Subject(subject),
                        "mcp:files:read_text_file",
                        "files.read_text_file",
                        {"path": f"{ROOT}/{key}/x"},
                    )
                )
    finally:
        loaded.close()
