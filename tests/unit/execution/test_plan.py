"""One plan from Builder to Server: ``Limits`` carries its real defaults (0 no longer
means "the default"), quota and reserve are one self-validating type checked in one wording by the
library and by the settings, and ``Builder.build()`` hands the server one frozen plan."""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.execution.admission import Admission
from codemode.execution.executor import Executor
from codemode.execution.limits import DEFAULTS, Limits
from codemode.execution.plan import Plan
from codemode.startup.config import ConfigError, load_settings, names

SLOT_FIELDS = ("subject_quota", "reserved_slots", "max_concurrent_executions")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("CODEMODE_"):
            monkeypatch.delenv(key)


def _library_problems(slots: int, quota: int, reserve: int | None) -> list[str]:
    builder = codemode.Builder(
        authorizer=authz.allow_all(),
        limits=Limits(max_concurrent_executions=slots),
        subject_quota=quota,
        reserved_slots=reserve,
    )
    with pytest.raises(codemode.InvalidRegistration) as info:
        builder.build()
    return info.value.problems


def _settings_problem(slots: int, quota: int, reserve: int | None) -> str:
    given: dict[str, Any] = {"reserved_slots": reserve} if reserve is not None else {}
    with pytest.raises(ConfigError) as info:
        load_settings(
            transport="http", allow_all=True, max_concurrent_executions=slots, subject_quota=quota, **given
        )
    text = str(info.value)
    for field in SLOT_FIELDS:
        text = text.replace(names(field), field)
    return text


@pytest.mark.parametrize(
    ("slots", "quota", "reserve"),
    [
        (4, 0, 4),  # the reserve takes every slot
        (8, 8, None),  # the derived reserve (2) leaves 6 for one subject: a quota of 8 is never reached
        (8, 7, 2),
        (2, 2, 1),
    ],
)
def test_quota_and_reserve_are_refused_in_one_wording_by_the_library_and_the_settings(
    slots: int, quota: int, reserve: int | None
) -> None:
    library = _library_problems(slots, quota, reserve)
    settings = _settings_problem(slots, quota, reserve)
    assert settings in library, (settings, library)
    assert Admission.problems_of(slots, quota, reserve) == [settings]


def test_the_admission_type_validates_itself() -> None:
    with pytest.raises(ValueError, match="reserved_slots: 4 reserved of 4 slots"):
        Admission(slots=4, subject_quota=0, reserved_slots=4)
    with pytest.raises(ValueError, match="subject_quota: must be a whole number"):
        Admission(slots=4, subject_quota=True, reserved_slots=0)
    with pytest.raises(ValueError, match="subject_quota: 4 is more than one subject can ever hold"):
        Admission(slots=4, subject_quota=4, reserved_slots=1)
    assert Admission.derive(8, subject_quota=4) == Admission(8, 4, 2)  # a reserve comes with a quota
    assert Admission.derive(8) == Admission(8, 0, 0)  # one static subject: every slot
    with pytest.raises(dataclasses.FrozenInstanceError):
        Admission(8, 4, 2).subject_quota = 0  # type: ignore[misc]


def test_settings_and_library_build_the_same_admission() -> None:
    http = load_settings(transport="http", allow_all=True)
    assert http.admission == Admission(8, 4, 2)
    assert load_settings(transport="stdio", allow_all=True).admission == Admission(8, 0, 0)
    lowered = load_settings(transport="http", allow_all=True, max_concurrent_executions=2)
    assert lowered.admission == Admission(2, 1, 1)  # the default quota, lowered so one subject reaches it


def test_limits_carry_their_real_defaults() -> None:
    limits = Limits()
    for field in dataclasses.fields(Limits):
        assert getattr(limits, field.name) == DEFAULTS[field.name] == field.default, field.name
    assert limits.max_execution_time == 5.0 and limits.max_native_calls == 100
    assert limits.max_print_bytes == 0  # prints off
    assert limits.problems() == []


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "max_native_calls",
            0,
            "limits: max_native_calls must be at least 1 (leave it out for the default, 100)",
        ),
        (
            "max_execution_time",
            0.0,
            "limits: max_execution_time must be more than 0 (leave it out for the default, 5.0)",
        ),
        (
            "max_value_depth",
            -1,
            "limits: max_value_depth must be at least 1 (leave it out for the default, 32)",
        ),
        (
            "max_search_response_bytes",
            31,
            "limits: max_search_response_bytes must be at least 32 (leave it out for the default, 65536)",
        ),
        (
            "max_describe_response_bytes",
            1023,
            "limits: max_describe_response_bytes must be at least 1024 (leave it out for the default, 65536)",
        ),
        (
            "max_print_bytes",
            -1,
            "limits: max_print_bytes must be at least 0 (leave it out for the default, 0)",
        ),
        ("max_native_calls", "5", "limits: max_native_calls must be a number"),
    ],
)
def test_a_limit_below_its_minimum_is_refused_naming_the_field(
    field: str, value: object, message: str
) -> None:
    problems = _build_problems(Limits(**{field: value}))  # type: ignore[arg-type]
    assert message in problems, problems


def test_zero_prints_is_the_one_limit_where_zero_is_a_value() -> None:
    server = _built(Limits(max_print_bytes=0, max_execution_time=2.0))
    assert server.limits.max_print_bytes == 0 and server.limits.max_execution_time == 2.0
    assert server.limits.max_native_calls == 100


def test_settings_refuse_a_limit_below_its_minimum_too() -> None:
    with pytest.raises(ConfigError, match="--max-search-response-bytes / CODEMODE_MAX_SEARCH_RESPONSE_BYTES"):
        load_settings(transport="stdio", allow_all=True, max_search_response_bytes=31)
    with pytest.raises(ConfigError, match="--max-native-calls / CODEMODE_MAX_NATIVE_CALLS"):
        load_settings(transport="stdio", allow_all=True, max_native_calls=0)
    assert load_settings(transport="stdio", allow_all=True, max_print_bytes=0).limits == Limits()


def test_build_hands_the_server_one_frozen_plan() -> None:
    runtime = codemode.ProcessRuntime()
    limits = Limits(max_execution_time=2.0)
    builder = codemode.Builder(authorizer=authz.allow_all(), limits=limits, runtime=runtime, subject_quota=2)
    server = builder.build()
    plan = server.plan
    assert isinstance(plan, Plan)
    assert plan.limits is limits and plan.runtime is runtime
    assert plan.admission == Admission(8, 2, 2)
    assert server.limits is plan.limits and server.runtime is plan.runtime
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.limits = Limits()  # type: ignore[misc]
    # One parameter crosses from Builder to Server to Executor: the plan.
    assert list(inspect.signature(codemode.Server).parameters) == ["plan"]
    assert list(inspect.signature(Executor).parameters) == ["plan"]


def _build_problems(limits: Limits) -> list[str]:
    with pytest.raises(codemode.InvalidRegistration) as info:
        codemode.Builder(authorizer=authz.allow_all(), limits=limits).build()
    return info.value.problems


def _built(limits: Limits) -> codemode.Server:
    return codemode.Builder(authorizer=authz.allow_all(), limits=limits).build()
