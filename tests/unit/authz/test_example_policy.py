"""examples/policy.rego: the shipped example policy loads and decides as its comments say.

The policy is loaded exactly as the CLI and the service load one (``codemode.authz.rego.from_files``)
and asked for real decisions over the records pack's capability ids. One test also runs it inside a
built server with the records pack, so a denial is seen end to end as ``permission denied``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.authz import AuthorizationInput, Denied, Subject
from codemode.authz.rego import RegoAuthorizer, from_files
from codemode_capabilities import records
from tests.support.fakes import Ctx

POLICY = Path(__file__).resolve().parents[3] / "examples" / "policy.rego"
DECISION = "data.codemode.records.allow"

CREATE = "records.entry.create"
GET = "records.entry.get"
SEARCH = "records.entry.search"
UPDATE = "records.entry.update"
DELETE = "records.entry.delete"


@pytest.fixture(scope="module")
def authorizer() -> Iterator[RegoAuthorizer]:
    loaded = from_files(DECISION, [POLICY])
    yield loaded
    loaded.close()


def names() -> dict[str, str]:
    """Capability id -> model-facing name, from the records pack itself."""
    return {str(c.id): c.name for c in records.capabilities(records.RecordStore())}


def call(subject: str, capability_id: str, arguments: dict[str, Any] | None = None) -> AuthorizationInput:
    return AuthorizationInput(Subject(subject), capability_id, names()[capability_id], arguments or {})


def test_policy_names_only_real_records_capabilities() -> None:
    text = POLICY.read_text(encoding="utf-8")
    mentioned = set(re.findall(r'"(records\.entry\.[a-z_]+)"', text))
    assert mentioned, "the policy should name records capability ids"
    assert mentioned <= set(names()), f"unknown ids in the policy: {sorted(mentioned - set(names()))}"


@pytest.mark.parametrize(
    ("subject", "capability_id", "arguments", "allowed"),
    [
        # alice is an admin: everything, delete included
        ("alice", DELETE, {"id": 1}, True),
        ("alice", CREATE, {"title": "t"}, True),
        ("alice", SEARCH, {"limit": 100}, True),
        # carol is an editor: read, create, update; never delete
        ("carol", CREATE, {"title": "t", "tags": ["a"]}, True),
        ("carol", UPDATE, {"id": 3, "title": "u"}, True),
        ("carol", GET, {"id": 3}, True),
        ("carol", DELETE, {"id": 3}, False),
        # bob is a reader: get and search (at most 20 results), nothing else
        ("bob", GET, {"id": 1}, True),
        ("bob", SEARCH, {}, True),
        ("bob", SEARCH, {"text": "milk", "limit": 20}, True),
        ("bob", SEARCH, {"limit": 21}, False),
        ("bob", CREATE, {"title": "t"}, False),
        ("bob", UPDATE, {"id": 1, "title": "t"}, False),
        ("bob", DELETE, {"id": 1}, False),
        # anyone else: nothing
        ("mallory", GET, {"id": 1}, False),
        ("mallory", SEARCH, {}, False),
        ("", GET, {"id": 1}, False),
    ],
)
def test_decisions(
    authorizer: RegoAuthorizer, subject: str, capability_id: str, arguments: dict[str, Any], allowed: bool
) -> None:
    assert authorizer.decide(call(subject, capability_id, arguments)) is allowed


def test_a_capability_outside_the_records_pack_is_denied_even_for_admins(authorizer: RegoAuthorizer) -> None:
    outside = AuthorizationInput(Subject("alice"), "weather.forecast.get", "weather.get", {})
    assert authorizer.decide(outside) is False


async def test_authorize_allows_by_returning_and_denies_by_raising(authorizer: RegoAuthorizer) -> None:
    ctx = Ctx(deadline=time.monotonic() + 5)
    await authorizer.authorize(ctx, call("bob", GET, {"id": 1}))  # allowed: no Denied
    with pytest.raises(Denied):
        await authorizer.authorize(ctx, call("bob", DELETE, {"id": 1}))


async def test_in_a_server_a_denied_call_is_permission_denied() -> None:
    builder = codemode.Builder(authorizer=from_files(DECISION, [POLICY]), runtime=codemode.ProcessRuntime())
    for capability in records.capabilities(records.RecordStore()):
        builder.register(capability)
    server = builder.build()
    try:
        created = await server.execute(
            'def main():\n    return records.create(title="note")["id"]\n', subject=authz.Subject("carol")
        )
        assert isinstance(created, int)
        source = f"def main():\n    return records.delete(id={created})\n"
        with pytest.raises(codemode.PermissionDenied) as denied:
            await server.execute(source, subject=authz.Subject("carol"))
        assert str(denied.value) == "permission denied"
        # carol may not delete, but the record is still hers to read
        got = await server.execute(
            f"def main():\n    return records.get(id={created})['title']\n", subject=authz.Subject("carol")
        )
        assert got == "note"
    finally:
        await server.aclose()
