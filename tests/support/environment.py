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


def docker_found() -> str:
    """One line: the Docker engine this run will use, or why there is none."""
    try:
        import docker

        where = docker.utils.kwargs_from_env()
        client = docker.APIClient(version="auto", timeout=5, **where)
        try:
            version = client.version().get("Version", "?")
            url = where.get("base_url", "unix:///var/run/docker.sock")
            return f"using the engine at {url} (Docker {version})"
        finally:
            client.close()
    except Exception as exc:
        return f"none reachable ({type(exc).__name__}): Docker tests {_missing_outcome()}"


def cluster_found() -> str:
    """One line: the project's cluster this run will use, or why there is none."""
    from tests.support.cluster import KUBECONFIG, cluster_problem

    problem = cluster_problem()
    if problem is None:
        return f"using the project's cluster ({KUBECONFIG})"
    return f"{problem}: Kubernetes tests {_missing_outcome()}"


def _missing_outcome() -> str:
    return "fail (CI=true)" if IN_CI else "are skipped with the reason"
