"""``DockerOptions``: the Docker runtime takes its options whole, and the options check
every value when they are made, with one line naming the option (and, through the settings, its
flag and variable). No engine is needed: nothing here starts a container."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest

from codemode.runtimes.docker import (
    DEFAULT_IMAGE,
    DEFAULT_MEMORY_BYTES,
    TESTING_ENTRY,
    WORKER_USER,
    DockerOptions,
    DockerRuntime,
    OptionError,
)
from codemode.runtimes.docker.container import create_args, worker_command
from codemode.runtimes.options import OPTIONS
from codemode.startup.bootstrap import build_runtime
from codemode.startup.config import ConfigError, load_settings


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("CODEMODE_"):
            monkeypatch.delenv(key)


REFUSED: list[tuple[dict[str, Any], str, str]] = [
    ({"image": " "}, "image", "must be a non-empty string"),
    ({"label_prefix": ""}, "label_prefix", "must be a non-empty string"),
    ({"base_url": ""}, "base_url", "must be a non-empty string or None"),
    ({"oci_runtime": " "}, "oci_runtime", "must be a non-empty string or None"),
    ({"owner": ""}, "owner", "must be a non-empty string or None"),
    ({"memory": 6 * 1024**2 - 1}, "memory", "at least 6 MiB"),
    ({"memory": True}, "memory", "at least 6 MiB"),
    ({"memory": "256m"}, "memory", "at least 6 MiB"),
    ({"cpus": 0}, "cpus", "positive number of CPUs"),
    ({"cpus": float("inf")}, "cpus", "positive number of CPUs"),
    ({"max_processes": 0}, "max_processes", "positive whole number"),
    ({"open_files": 2.5}, "open_files", "positive whole number"),
    ({"stdout_buffer_bytes": -1}, "stdout_buffer_bytes", "positive whole number"),
    ({"executor_threads": 0}, "executor_threads", "positive whole number"),
    ({"spawn_timeout": 0}, "spawn_timeout", "positive number of seconds"),
    ({"api_timeout": float("nan")}, "api_timeout", "positive number of seconds"),
    ({"check_timeout": -1}, "check_timeout", "positive number of seconds"),
    ({"wait_timeout": True}, "wait_timeout", "positive number of seconds"),
    ({"end_timeout": 0.0}, "end_timeout", "positive number of seconds"),
    ({"cleanup_orphans": "some"}, "cleanup_orphans", "'dead', 'all' or 'none'"),
    ({"entrypoint": "python3 -m x"}, "entrypoint", "a list of strings, not one string"),
    ({"entrypoint": []}, "entrypoint", "non-empty list of non-empty strings"),
    ({"supervisor_entrypoint": ["python3", ""]}, "supervisor_entrypoint", "non-empty list"),
    ({"testing_entry": True, "entrypoint": ["x"]}, "entrypoint", "exclude each other"),
]


@pytest.mark.parametrize(("given", "option", "why"), REFUSED)
def test_a_refused_value_names_its_option_in_one_line(given: dict[str, Any], option: str, why: str) -> None:
    with pytest.raises(OptionError) as caught:
        DockerOptions(**given)
    assert caught.value.option == option
    text = str(caught.value)
    assert text.startswith(option) and why in text and "\n" not in text, text
    assert isinstance(caught.value, ValueError)


def test_the_defaults_are_the_runtimes() -> None:
    o = DockerOptions()
    assert (o.image, o.memory, o.cpus, o.max_processes, o.open_files) == (
        DEFAULT_IMAGE,
        DEFAULT_MEMORY_BYTES,
        1.0,
        64,
        64,
    )
    assert (o.oci_runtime, o.base_url, o.owner, o.cleanup_orphans, o.testing_entry) == (
        None,
        None,
        None,
        "dead",
        False,
    )
    assert DockerOptions(memory=6 * 1024**2).memory == 6 * 1024**2  # the engine's minimum is accepted


def test_the_options_are_frozen_and_hold_commands_as_tuples() -> None:
    command = ["python3", "-c", "pass"]
    o = DockerOptions(entrypoint=command)
    command.append("changed")
    assert o.entrypoint == ("python3", "-c", "pass")
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.memory = 1  # type: ignore[misc]


def test_the_runtime_takes_its_options_whole() -> None:
    options = DockerOptions(memory=64 * 1024**2, max_processes=20, open_files=30, oci_runtime="runc")
    rt = DockerRuntime(options)
    assert rt.options is options and rt.name == "docker:runc" and rt.memory_limited
    assert DockerRuntime().options == DockerOptions()
    with pytest.raises(TypeError):
        DockerRuntime(memory_bytes=64 * 1024**2)  # type: ignore[call-arg]  # the loose keywords are gone
    with pytest.raises(TypeError, match="takes a DockerOptions"):
        DockerRuntime({"memory": 64 * 1024**2})  # type: ignore[arg-type]


def test_one_name_per_concept() -> None:
    names = {f.name for f in dataclasses.fields(DockerOptions)}
    assert {"memory", "max_processes", "open_files", "oci_runtime", "owner"} <= names
    assert not names & {"memory_bytes", "pids_limit", "nofile", "runtime", "owner_id"}
    assert OPTIONS["docker"] is DockerOptions


def test_the_container_is_made_from_the_options() -> None:
    labels = {"io.codemode.role": "worker"}
    plain = create_args(DockerOptions(image="img:1"), labels)
    assert (plain["image"], plain["user"], plain["entrypoint"], plain["command"]) == (
        "img:1",
        WORKER_USER,
        None,
        None,
    )
    assert plain["environment"] == {"CODEMODE_WORKER": "1"} and plain["labels"] is labels
    testing = create_args(DockerOptions(testing_entry=True), labels)
    assert testing["entrypoint"] == list(TESTING_ENTRY) and testing["command"] == []
    assert testing["environment"]["CODEMODE_WORKER_TESTING"] == "1"
    assert worker_command(DockerOptions(entrypoint=["a", "b"])) == ["a", "b"]
    assert worker_command(DockerOptions(), supervised=True) == [
        "python3",
        "-I",
        "-m",
        "codemode_worker.supervisor",
    ]
    assert worker_command(DockerOptions(supervisor_entrypoint=["s"]), supervised=True) == ["s"]


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (
            ["--docker-memory", "1m"],
            "--docker-memory / CODEMODE_DOCKER_MEMORY: memory must be at least 6 MiB",
        ),
        (
            ["--docker-image", " "],
            "--docker-image / CODEMODE_DOCKER_IMAGE: image must be a non-empty string",
        ),
    ],
)
def test_a_refused_setting_names_its_flag_and_variable(argv: list[str], where: str) -> None:
    values = dict(zip(argv[::2], argv[1::2], strict=True))
    kwargs = {k.removeprefix("--").replace("-", "_"): v for k, v in values.items()}
    with pytest.raises(ConfigError) as caught:  # when the settings are loaded, or the runtime built
        build_runtime(load_settings(transport="stdio", allow_all=True, runtime="docker", **kwargs))
    assert str(caught.value).startswith(where) and "\n" not in str(caught.value), caught.value


def test_the_settings_reach_the_runtime_whole() -> None:
    settings = load_settings(
        transport="stdio", allow_all=True, runtime="docker", docker_memory="64m", docker_oci_runtime="runc"
    )
    rt: Any = build_runtime(settings, worker_command=["python3", "-c", "pass"], cleanup_orphans="none")
    assert isinstance(rt, DockerRuntime)
    assert rt.options == DockerOptions(
        memory=64 * 1024**2, oci_runtime="runc", entrypoint=("python3", "-c", "pass"), cleanup_orphans="none"
    )
