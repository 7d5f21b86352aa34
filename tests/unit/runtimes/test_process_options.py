"""The process runtime takes its options whole: ``ProcessRuntime(options)``, where
``ProcessOptions`` holds every option the constructor took as a keyword, under the runtimes' one
name per concept (``memory``, not ``address_space_bytes``), and checks them when it is made: a
refused value is a one-line ``ValueError`` (``OptionError``) naming the option."""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import pytest

import codemode
from codemode.runtimes.base import OptionError
from codemode.runtimes.process import ProcessOptions, ProcessRuntime

#: The keywords ``ProcessRuntime`` took before it took its options whole, and their option now.
EARLIER_KEYWORDS = {
    "python": "python",
    "address_space_bytes": "memory",
    "cpu_seconds": "cpu_seconds",
    "open_files": "open_files",
    "spawn_timeout": "spawn_timeout",
    "module": "module",
    "extra_env": "extra_env",
    "argv": "argv",
    "worker_uid_base": "worker_uid_base",
    "worker_uids": "worker_uids",
    "max_processes": "max_processes",
    "spawn": "spawn",
    "template_argv": "template_argv",
}


def test_every_earlier_keyword_is_an_option() -> None:
    fields = {f.name for f in dataclasses.fields(ProcessOptions)}
    assert set(EARLIER_KEYWORDS.values()) <= fields


def test_the_runtime_takes_the_options_and_nothing_loose() -> None:
    options = ProcessOptions(memory=256 * 1024**2, cpu_seconds=3, open_files=40, spawn="classic")
    runtime = ProcessRuntime(options)
    assert runtime.options is options
    assert (runtime.memory, runtime.cpu_seconds, runtime.open_files, runtime.spawn_mode) == (
        256 * 1024**2,
        3,
        40,
        "classic",
    )
    assert ProcessRuntime().options == ProcessOptions()
    loose: Any = ProcessRuntime
    with pytest.raises(TypeError):
        loose(address_space_bytes=1024)
    with pytest.raises(TypeError, match="ProcessRuntime takes ProcessOptions, not dict"):
        loose({"memory": 1024})


@pytest.mark.parametrize(
    ("given", "option", "message"),
    [
        ({"memory": -1}, "memory", "memory must be a whole number of at least 0, got -1"),
        ({"memory": 1.5}, "memory", "memory must be a whole number of at least 0, got 1.5"),
        ({"open_files": 0}, "open_files", "open_files must be a whole number of at least 1, got 0"),
        ({"max_processes": True}, "max_processes", "max_processes must be a whole number of at least 1"),
        ({"worker_uids": 0}, "worker_uids", "worker_uids must be a whole number of at least 1, got 0"),
        ({"worker_uid_base": -5}, "worker_uid_base", "worker_uid_base must be a whole number of at least 0"),
        ({"cpu_seconds": 0}, "cpu_seconds", "cpu_seconds must be positive, got 0"),
        ({"cpu_seconds": math.nan}, "cpu_seconds", "cpu_seconds must be a number of seconds, got nan"),
        ({"spawn_timeout": math.inf}, "spawn_timeout", "spawn_timeout must be a number of seconds"),
        ({"spawn": "fork"}, "spawn", "spawn must be one of template, classic, not 'fork'"),
        (
            {"spawn": "template", "argv": ["/bin/true"]},
            "spawn",
            "argv replaces the worker's command: it needs spawn='classic'",
        ),
        ({"module": "os"}, "module", "the worker template cannot fork module 'os' (use spawn='classic')"),
        ({"argv": []}, "argv", "argv must be a list of strings, the first naming the program"),
        ({"argv": "python worker.py"}, "argv", "argv must be a list of strings, the first naming"),
        ({"argv": ["python", 3]}, "argv", "argv must be a list of strings, the first naming"),
        ({"template_argv": ["", "-c"]}, "template_argv", "template_argv must be a list of strings"),
        ({"extra_env": {"": "1"}}, "extra_env", "extra_env must map non-empty names to strings"),
        ({"extra_env": {"A": 1}}, "extra_env", "extra_env must map non-empty names to strings"),
        ({"python": ""}, "python", "python must be the path of an interpreter"),
    ],
)
def test_a_refused_value_is_one_line_naming_the_option(
    given: dict[str, Any], option: str, message: str
) -> None:
    with pytest.raises(ValueError) as info:
        ProcessOptions(**given)
    assert isinstance(info.value, OptionError) and info.value.option == option
    text = str(info.value)
    assert text.startswith(message) and "\n" not in text and option in text


def test_the_options_are_frozen_and_keep_no_callers_list() -> None:
    argv = [sys.executable, "-c", "pass"]
    env = {"A": "1"}
    options = ProcessOptions(argv=argv, extra_env=env)
    argv.append("--more")
    env["B"] = "2"
    assert options.argv == (sys.executable, "-c", "pass") and dict(options.extra_env or {}) == {"A": "1"}
    with pytest.raises(TypeError):
        options.extra_env["C"] = "3"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.memory = 0  # type: ignore[misc]


def test_a_replaced_command_is_started_not_forked() -> None:
    options = ProcessOptions(spawn="template", memory=1024**3)
    held = options.with_command([sys.executable, "-m", "hold"])
    assert (held.spawn_mode, held.argv, held.memory) == ("classic", (sys.executable, "-m", "hold"), 1024**3)
    assert ProcessOptions().spawn_mode == "template"
    assert ProcessOptions(argv=["/bin/true"]).spawn_mode == "classic"
    assert ProcessOptions(argv=["/bin/echo", "", "x"]).argv == ("/bin/echo", "", "x")  # empty arguments pass


def test_the_settings_build_the_runtime_from_the_same_options() -> None:
    from codemode.startup.bootstrap import build_runtime
    from codemode.startup.config import load_settings

    settings = load_settings(
        transport="stdio", allow_all=True, runtime="process", process_memory="512m", process_open_files=40
    )
    assert settings.runtime_options == ProcessOptions(memory=512 * 1024**2, open_files=40)
    runtime: Any = build_runtime(settings)
    assert isinstance(runtime, codemode.ProcessRuntime) and runtime.options == settings.runtime_options
