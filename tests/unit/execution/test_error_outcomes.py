"""Each error that can end an execute carries its outcome word: the executor reads
``exc.outcome`` and maps nothing by the error's text or by a ladder of isinstance checks."""

from __future__ import annotations

import ast
import inspect
from typing import get_args

import pytest

import codemode.execution.executor as executor
from codemode import ExecuteOutcome
from codemode.common.errors import CodeModeError
from codemode.execution.suspension import Suspended

#: What docs/reference/python-api.md says each error is, as an ``ExecuteEvent.outcome``.
EXPECTED = {
    "CodeModeError": "internal",
    "InvalidRegistration": "internal",
    "Unauthenticated": "unauthenticated",
    "NotFound": "not_found",
    "InvalidProgram": "invalid_program",
    "InvalidArguments": "invalid_arguments",
    "PermissionDenied": "permission_denied",
    "PolicyFailure": "policy_failure",
    "ResourceLimit": "resource_limit",
    "ExecutionTimeout": "resource_limit",
    "CapabilityFailure": "capability_failed",
    "Internal": "internal",
    "CapacityExhausted": "resource_limit",  # codemode.runtimes.base: no room for another worker
    "RuntimeClosing": "internal",  # codemode.runtimes.base: shutdown
    "Suspended": "suspended",
}


def _subclasses(cls: type[CodeModeError]) -> list[type[CodeModeError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found += _subclasses(sub)
    return found


def _ending_classes() -> list[type]:
    """Every class an execute can end with: the client errors (whatever module defines them) and
    the suspension."""
    return [c for c in _subclasses(CodeModeError) if c.__module__.startswith("codemode.")] + [Suspended]


@pytest.mark.parametrize("cls", _ending_classes(), ids=lambda c: c.__name__)
def test_every_error_that_ends_an_execute_names_its_outcome(cls: type) -> None:
    outcome = getattr(cls, "outcome", None)
    assert outcome in get_args(ExecuteOutcome), f"{cls.__name__} carries no outcome word"
    assert outcome == EXPECTED[cls.__name__]


def test_every_client_error_is_listed() -> None:
    assert {c.__name__ for c in _ending_classes()} == set(EXPECTED)


def test_the_executor_maps_no_error_by_its_text() -> None:
    source = inspect.getsource(executor)
    tree = ast.parse(source)
    functions = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    assert "_outcome_name" not in functions
    texts = {c.text for c in _subclasses(CodeModeError)}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert strings & texts == set()
