"""describe_api of a near miss names the closest enabled capability (codemode.catalog.suggest),
never a disabled one, and costs no comparison for a text no name could be close to."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import codemode
from codemode import authz
from codemode.catalog.suggest import Suggester
from codemode.common.errors import client_text

NAMES = ["records.create", "records.get", "records.search", "records.delete", "weather.forecast"]


@pytest.mark.parametrize(
    ("miss", "expected"),
    [
        ("records.creat", "records.create"),
        ("Records.Create", "records.create"),
        ("records.createe", "records.create"),
        ("weather.forcast", "weather.forecast"),
        ("records.seach", "records.search"),
        ("records", None),
        ("records.list", None),
        ("x", None),
        ("", None),
        ("records.creat" * 10, None),  # longer than twice every name: never close
    ],
)
def test_the_closest_name_or_none(miss: str, expected: str | None) -> None:
    assert Suggester(NAMES).closest(miss) == expected


def test_ties_go_to_the_first_name_in_sorted_order() -> None:
    assert Suggester(["ns.b1", "ns.a1"]).closest("ns.c1") == "ns.a1"
    assert Suggester(["ns.a1", "ns.b1"]).closest("ns.c1") == "ns.a1"


def test_an_empty_catalog_suggests_nothing() -> None:
    assert Suggester([]).closest("records.get") is None


@dataclass
class Out:
    ok: bool


def _handler(ctx: codemode.CallContext, subject: authz.Subject) -> Out:
    return Out(True)


def test_describe_names_only_enabled_capabilities() -> None:
    caps = [
        codemode.Capability(name="records.create", summary="Create.", handler=_handler),
        codemode.Capability(name="records.creator_secret", summary="Hidden.", handler=_handler),
    ]
    server = (
        codemode.Builder(authorizer=authz.allow_all(), disabled=["records.creator_secret"])
        .register(*caps)
        .build()
    )
    with pytest.raises(codemode.NotFound) as info:
        server.describe("records.creat")
    assert client_text(info.value) == "capability not found: did you mean records.create?"
    assert str(info.value) == "capability not found"
    with pytest.raises(codemode.NotFound) as info:
        server.describe("records.creator_secre")  # closest to the disabled one: not named
    assert "secret" not in client_text(info.value)
    with pytest.raises(codemode.NotFound) as info:
        server.describe("billing.refund")
    assert client_text(info.value) == "capability not found"
