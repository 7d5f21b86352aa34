"""One name per setting: each runtime has one table of settings, nested in the
settings, that becomes its frozen options type, with one name per concept across
runtimes (``memory``, ``max_processes``, ``open_files``); the flat names (``--docker-max-processes``,
``CODEMODE_DOCKER_MAX_PROCESSES``, ``docker_max_processes``) are generated from the table;
``quotas tune`` takes the very flags it recommends."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode.cli.flags import overrides
from codemode.cli.main import build_parser
from codemode.ops import quotas
from codemode.ops.quotas import RunSample, recommend
from codemode.runtimes.options import OPTIONS, DockerOptions, KubernetesOptions, ProcessOptions
from codemode.startup.bootstrap import build_runtime
from codemode.startup.config import ConfigError, Settings, load_settings, parse_size


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("CODEMODE_"):
            monkeypatch.delenv(key)


def _serve(argv: list[str], config_file: Path | None = None) -> Settings:
    args = build_parser().parse_args(["serve", "--stdio", "--allow-all", *argv])
    return load_settings(config_file=config_file, **overrides(args, "stdio"))


def test_each_runtime_has_one_options_type_holding_every_setting_of_it() -> None:
    for runtime, options_type in OPTIONS.items():
        table: Any = Settings.model_fields[runtime].annotation
        # the settings an operator may set; the options may hold more, for code
        assert set(table.model_fields) <= {f.name for f in dataclasses.fields(options_type)}, runtime
        assert options_type.__dataclass_params__.frozen  # type: ignore[union-attr]
    names = {runtime: {f.name for f in dataclasses.fields(t)} for runtime, t in OPTIONS.items()}
    # one name per concept across runtimes
    assert all("memory" in n for n in names.values())
    assert {"max_processes", "open_files"} <= names["process"] & names["docker"]
    for earlier in ("pids", "nofile", "address_space_bytes", "memory_bytes", "pids_limit"):
        assert not any(earlier in n for n in names.values()), earlier


def test_the_settings_hold_the_options_of_each_runtime() -> None:
    s = _serve(["--runtime", "docker", "--docker-memory", "64m", "--docker-max-processes", "50"])
    assert s.docker.options() == DockerOptions(memory=64 * 1024**2, max_processes=50)
    assert s.runtime_options == s.docker.options()
    assert s.process.options() == ProcessOptions() and s.kubernetes.options() == KubernetesOptions()
    runtime: Any = build_runtime(s)
    assert runtime.options == DockerOptions(memory=64 * 1024**2, max_processes=50, open_files=64)


@pytest.mark.parametrize("how", ["flag", "variable", "toml", "table", "keyword", "options"])
def test_every_name_of_a_runtime_setting_reaches_the_runtime(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, file = ["--runtime", "docker"], None
    toml = 'runtime = "docker"\n'
    if how == "flag":
        argv += ["--docker-max-processes", "48"]
    elif how == "variable":
        monkeypatch.setenv("CODEMODE_DOCKER_MAX_PROCESSES", "48")
    elif how in ("toml", "table"):
        key = "docker_max_processes = 48" if how == "toml" else None
        file = tmp_path / "codemode.toml"
        file.write_text(toml + (key + "\n" if key else "[docker]\nmax_processes = 48\nopen_files = 40\n"))
    if how == "keyword":
        s = load_settings(transport="stdio", allow_all=True, runtime="docker", docker_max_processes=48)
    elif how == "options":
        s = load_settings(
            transport="stdio", allow_all=True, runtime="docker", docker=DockerOptions(max_processes=48)
        )
    else:
        s = _serve(argv, file)
    assert s.docker.max_processes == 48
    runtime: Any = build_runtime(s)
    assert runtime.options.max_processes == 48
    if how == "table":
        assert runtime.options.open_files == 40


def test_the_flat_names_keep_their_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "codemode.toml"
    file.write_text('runtime = "docker"\n[docker]\nmax_processes = 8\n')
    assert _serve([], file).docker.max_processes == 8
    monkeypatch.setenv("CODEMODE_DOCKER_MAX_PROCESSES", "16")  # the environment over the file
    assert _serve([], file).docker.max_processes == 16
    assert _serve(["--docker-max-processes", "32"], file).docker.max_processes == 32  # a flag over both


def test_a_runtime_table_with_an_unknown_option_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "codemode.toml"
    file.write_text('runtime = "docker"\n[docker]\nmemroy = "1g"\n')
    with pytest.raises(
        ConfigError, match=r"unknown setting 'memroy' in \[docker\] \(did you mean 'memory'\?\)$"
    ):
        _serve([], file)


def test_the_options_name_the_runtime_constructor_parameters() -> None:
    # the process runtime takes its options whole
    options = ProcessOptions(memory=512 * 1024**2, open_files=40, max_processes=8)
    process = codemode.ProcessRuntime(options)
    assert process.options is options
    assert (process.memory, process.open_files, process.max_processes) == (512 * 1024**2, 40, 8)
    # the Docker runtime takes its options whole
    docker_options = DockerOptions(memory=64 * 1024**2, max_processes=20, open_files=30, oci_runtime="runc")
    assert codemode.DockerRuntime(docker_options).options is docker_options


def _samples() -> list[RunSample]:
    return [
        RunSample(
            outcome="ok",
            execute_s=0.5,
            spawn_s=0.2,
            cpu_s=0.3,
            memory_peak_bytes=40 * 1024**2,
            pids_peak=5,
            address_space_peak_bytes=700 * 1024**2,
            fds_peak=9,
            threads_peak=3,
        )
        for _ in range(3)
    ]


@pytest.mark.parametrize("runtime", ["docker", "kubernetes", "process"])
def test_quotas_tune_takes_the_flags_it_recommends(runtime: str) -> None:
    rec = recommend(_samples(), runtime)
    assert rec is not None
    flags = rec.serve_flags()
    # serve takes them ...
    served = _serve(flags)
    for name, value in rec.settings.items():
        table, _, key = name.partition("_")
        given = getattr(getattr(served, table), key)
        assert given == (parse_size(value) if key == "memory" and runtime != "kubernetes" else value), name
    # ... and so does quotas tune, as its measurement limits
    args = build_parser().parse_args(["quotas", "tune", "--program", "x", *flags])
    assert {name: getattr(args, name) for name in rec.settings} == rec.settings
    assert set(quotas.RUNTIME_FLAGS[runtime]) == set(rec.settings)
    assert served.max_execution_time == args.max_execution_time == rec.max_execution_time


def test_the_configuration_pages_runtime_table_loads_as_written(tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"^```toml\n(.*?)^```", page, re.M | re.S) if "[docker]" in b]
    file = tmp_path / "codemode.toml"
    file.write_text(block)
    s = _serve([], file)
    assert s.runtime == "docker"
    assert s.docker.options() == DockerOptions(memory=256 * 1024**2, max_processes=64, open_files=64)
