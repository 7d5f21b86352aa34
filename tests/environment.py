"""What the test environment provides, and how a missing piece is reported (no tests here).

A test that needs something outside Python (a Docker engine, ``npx``, ...) calls :func:`unavailable`
when it is missing: locally the test is skipped with the reason, so the skip is visible in the
summary; with ``CI=true`` the test fails instead, so CI can never pass by skipping.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def unavailable(what: str, reason: str) -> NoReturn:
    """Skip (locally) or fail (``CI=true``): ``what`` is the requirement, ``reason`` why it is missing."""
    if IN_CI:
        pytest.fail(f"{what} is required in CI: {reason}", pytrace=False)
    pytest.skip(f"{what}: {reason}")
