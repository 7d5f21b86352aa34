"""Fixtures shared by the whole suite.

Worker images: ``CODEMODE_TEST_WORKER_IMAGE`` (a freshly built production tag) becomes the default
image of every ``DockerOptions`` and ``KubernetesOptions`` (so of every runtime) the integration,
adversarial and e2e tests make, so the suite can run against an image under test without touching
the shared tag (tests that name an image keep it; unit tests keep the real default).

Docker: a test that needs the engine takes ``docker_api`` (one low-level client for the session).
Without a reachable engine or without the worker image the test is skipped with the reason locally
and fails under ``CI=true`` (see tests/support/environment.py). ``scripts/provision-docker.sh`` starts the
engine and builds the images.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from codemode.runtimes.docker import DEFAULT_IMAGE, DockerOptions
from codemode.runtimes.kubernetes import KubernetesOptions
from tests.support import environment, postgres
from tests.support.environment import unavailable


def pytest_configure(config: pytest.Config) -> None:
    """The suite never writes the real home: codemode's default data and configuration folders
    (``$XDG_DATA_HOME/codemode``, ``$XDG_CONFIG_HOME/codemode``) point into one temporary folder for
    the whole session, for the tests and every process they start. (Caches of tools the suite
    installs, ``~/.cache/codemode``, stay where they are.)"""
    home = tempfile.mkdtemp(prefix="codemode-tests-")
    config.stash[_HOME] = home
    for name in ("XDG_DATA_HOME", "XDG_CONFIG_HOME"):
        os.environ[name] = os.path.join(home, name.lower())


def pytest_unconfigure(config: pytest.Config) -> None:
    if home := config.stash.get(_HOME, None):
        shutil.rmtree(home, ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say which engines the run uses (their tests skip with a reason when missing, and fail under
    CI=true); ``-q`` hides this header, so the summary says it again."""
    return _engines(config)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    for line in _engines(config):
        terminalreporter.write_line(line)


def _engines(config: pytest.Config) -> list[str]:
    if _ENGINES not in config.stash:
        config.stash[_ENGINES] = [
            f"docker: {environment.docker_found()}",
            f"kubernetes: {environment.cluster_found()}",
            f"postgresql: {postgres.found()}",
        ]
    return config.stash[_ENGINES]


_HOME = pytest.StashKey[str]()
_ENGINES = pytest.StashKey[list[str]]()


# Made by scripts/provision-docker.sh; the worker image is built FROM it.
BASE_IMAGE = "codemode-base:bookworm"
# Generous: image builds and `docker events` waits go through this client too.
DOCKER_API_TIMEOUT_S = 120


@pytest.fixture(autouse=True)
def no_repeat_filter_left_on_the_capture_handlers() -> Iterator[None]:
    """A test that starts the service installs the process-wide repeat filter on the root logger's
    handlers, pytest's capture handlers among them (they live for the session): taken off again after
    each test, so a later test's ``caplog`` sees every record it logs."""
    yield
    from codemode.service.logfilter import _FILTER

    for handler in logging.getLogger().handlers:
        if _FILTER in handler.filters:
            handler.removeFilter(_FILTER)


@pytest.fixture(autouse=True)
def worker_image_under_test(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The default worker image of the runtimes a test makes (``CODEMODE_TEST_WORKER_IMAGE``); unit
    tests keep the real default (they check it)."""
    image = os.environ.get("CODEMODE_TEST_WORKER_IMAGE") or DEFAULT_IMAGE
    if "unit" not in request.node.path.parts:
        for cls in (DockerOptions, KubernetesOptions):
            # the default of the dataclass's ``image`` parameter (every field has a default)
            names = [f.name for f in dataclasses.fields(cls) if f.init]
            defaults = list(cls.__init__.__defaults__ or ())
            defaults[names.index("image") - (len(names) - len(defaults))] = image
            monkeypatch.setattr(cls.__init__, "__defaults__", tuple(defaults))
    return image


def _missing_image(api: Any, image: str) -> str | None:
    import docker.errors

    try:
        api.inspect_image(image)
    except docker.errors.ImageNotFound:
        return f"image {image} not found; run scripts/provision-docker.sh"
    return None


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A DSN of a PostgreSQL database made for this session (tests/support/postgres.py): skipped without a
    server locally, required with ``CI=true``."""
    with postgres.throwaway_database() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def docker_api() -> Iterator[Any]:
    """A ``docker.APIClient`` for the engine from the environment, with the worker image present."""
    import docker

    try:
        api = docker.APIClient(version="auto", timeout=DOCKER_API_TIMEOUT_S, **docker.utils.kwargs_from_env())
        api.ping()
    except Exception as exc:  # any failure to connect means "no usable engine here"
        unavailable(
            "a Docker engine",
            f"not reachable ({type(exc).__name__}: {exc}); run scripts/provision-docker.sh",
        )
    try:
        if problem := _missing_image(api, os.environ.get("CODEMODE_TEST_WORKER_IMAGE") or DEFAULT_IMAGE):
            unavailable("the worker image", problem)
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def docker_base_image(docker_api: Any) -> str:
    """The base image tag (for tests that build images of their own), checked to be present."""
    if problem := _missing_image(docker_api, BASE_IMAGE):
        unavailable("the base image", problem)
    return BASE_IMAGE
