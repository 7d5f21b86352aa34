"""One place per setting: a setting's facts (its kind, the mode it applies to, its
flag group, a singular flag) live in its field's metadata, and the flag, environment, TOML and docs
generators read them there; runtime tables are nested models whose flat flag and variable names
are generated aliases; one configuration file may hold the tables of several runtimes; the earlier
spelling ``docker_pids`` is an unknown name like any other."""

from __future__ import annotations

import argparse
import logging
import os
import types
from pathlib import Path
from typing import Any

import pytest

from codemode.cli import flags as flags_module
from codemode.cli import main
from codemode.cli.flags import add_settings_flags, overrides, settings_table
from codemode.cli.main import build_parser
from codemode.execution import limits as limits_module
from codemode.startup import config as config_package
from codemode.startup.config import ConfigError, Settings, StrList, leaves, load_settings, setting
from codemode.startup.config.sources import nest


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("CODEMODE_"):
            monkeypatch.delenv(key)


class Extended(Settings):
    """The settings with three more, declared only here: nothing else names them."""

    frob_wait: float = setting(2.0, "seconds a frob may wait", kind="duration", mode="http", gt=0)
    frob_memory: int | None = setting(None, "bytes a frob may use, or 4m/1g", kind="size")
    frob_names: StrList = setting(
        description="names of the frobs", kind="list", flag="--frob-name", default_factory=list
    )
    frob_file: Path | None = setting(None, "a frob's file", kind="path")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_settings_flags(parser, Extended)
    return parser


def test_a_new_settings_metadata_drives_its_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    help_text = _parser().format_help()
    assert "--frob-wait SECONDS" in help_text and "CODEMODE_FROB_WAIT" in help_text
    assert "--frob-memory SIZE" in help_text and "--frob-name VALUE" in help_text
    assert "--frob-file FILE" in help_text
    monkeypatch.setenv("CODEMODE_FROB_NAMES", "x")
    args = _parser().parse_args(["--frob-memory", "2m", "--frob-name", "a", "--frob-name", "b"])
    given = overrides(args, "stdio", model=Extended)
    s = Extended(allow_all=True, **given)
    assert (s.frob_memory, s.frob_names) == (2 * 1024**2, ["x", "a", "b"])
    with pytest.raises(ConfigError, match=r"^--frob-wait is for serve --http; it does nothing with --stdio$"):
        overrides(_parser().parse_args(["--frob-wait", "3"]), "stdio", model=Extended)


def test_a_new_settings_metadata_drives_its_variable_and_toml_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODEMODE_FROB_MEMORY", "1k")
    assert Extended(allow_all=True).frob_memory == 1024
    monkeypatch.delenv("CODEMODE_FROB_MEMORY")
    file = tmp_path / "codemode.toml"
    file.write_text('frob_memory = "3k"\nfrob_file = "frob.txt"\nfrob_names = ["p", "q"]\n')
    monkeypatch.setenv("CODEMODE_CONFIG", str(file))
    s = Extended(allow_all=True)
    assert (s.frob_memory, s.frob_file, s.frob_names) == (3072, tmp_path / "frob.txt", ["p", "q"])


def test_a_new_settings_metadata_drives_its_docs_row() -> None:
    table = settings_table(Extended)
    assert "| `--frob-wait` | `CODEMODE_FROB_WAIT` | 2.0 | http | seconds a frob may wait |" in table
    assert "| `--frob-name` | `CODEMODE_FROB_NAMES` | — | both | names of the frobs |" in table


def test_every_setting_has_its_flag_variable_and_row_from_its_metadata() -> None:
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr, index]
    by_dest = {a.dest: a for a in serve._actions}
    table = settings_table()
    for leaf in leaves():
        if not leaf.facts.flagged:
            continue
        action = by_dest[leaf.name]
        assert action.option_strings[0] == leaf.flag, leaf.name
        assert leaf.env in (action.help or ""), leaf.name
        assert (action.nargs is None and isinstance(action, argparse._AppendAction)) == leaf.facts.repeated
        assert f"| `{leaf.flag}` | `{leaf.env}` |" in table, leaf.name
        assert f"| {leaf.facts.mode} | {leaf.field.description} |" in table, leaf.name
        # its TOML key (and keyword) is the flat name, put where the setting is
        placed: Any = nest(Settings, {leaf.name: "x"})
        for part in leaf.path:
            placed = placed[part]
        assert placed == "x", leaf.name


def _collections_of_names(module: types.ModuleType, setting_names: set[str]) -> list[str]:
    out = []
    for attr, value in vars(module).items():
        if value is getattr(limits_module, attr, None):
            continue  # the limits' own tables, keyed by the fields of codemode.Limits
        if isinstance(value, dict | frozenset | set | tuple | list):
            items = {str(v) for v in value if isinstance(v, str)}
            if len(items & setting_names) >= 2:
                out.append(f"{module.__name__}.{attr}")
    return out


def test_no_module_keeps_a_list_of_setting_names() -> None:
    setting_names = {leaf.name for leaf in leaves()}
    modules = [flags_module, config_package]
    modules += [m for m in vars(config_package).values() if isinstance(m, types.ModuleType)]
    modules = [m for m in modules if m.__name__.startswith(("codemode.cli", "codemode.startup"))]
    found = [name for m in modules for name in _collections_of_names(m, setting_names)]
    assert found == []


def test_runtime_tables_are_nested_models_with_generated_flat_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODEMODE_DOCKER_CPUS", "0.5")
    file = tmp_path / "codemode.toml"
    file.write_text('runtime = "docker"\ndocker_open_files = 30\n[docker]\nmemory = "64m"\nopen_files = 20\n')
    args = build_parser().parse_args(["serve", "--stdio", "--allow-all", "--docker-max-processes", "9"])
    s = load_settings(config_file=file, **overrides(args, "stdio"))
    assert (s.docker.memory, s.docker.cpus, s.docker.max_processes) == (64 * 1024**2, 0.5, 9)
    assert s.docker.open_files == 30  # the flat key wins over the table in one file
    assert type(s).model_fields["docker"].annotation is type(s.docker)


def test_one_file_holds_the_tables_of_several_runtimes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    file = tmp_path / "codemode.toml"
    file.write_text(
        'runtime = "docker"\n[process]\nmemory = "1g"\n[docker]\nmemory = "256m"\n'
        '[kubernetes]\nnamespace = "workers"\n'
    )
    with caplog.at_level(logging.INFO, logger="codemode.config"):
        s = load_settings(config_file=file, transport="stdio", allow_all=True)
    assert s.runtime == "docker" and s.docker.memory == 256 * 1024**2
    assert s.process.memory is None and s.kubernetes.namespace is None
    notes = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert notes == [
        f"--config / CODEMODE_CONFIG: {str(file)!r}: the [process] and [kubernetes] tables are ignored "
        "(--runtime / CODEMODE_RUNTIME is docker)"
    ]
    # the runtime chosen by a flag picks the table of the file
    s = load_settings(config_file=file, transport="stdio", allow_all=True, runtime="process")
    assert s.process.memory == 1024**3 and s.docker.memory is None


def test_a_flag_of_another_runtime_is_still_refused(tmp_path: Path) -> None:
    file = tmp_path / "codemode.toml"
    file.write_text('[docker]\nmemory = "256m"\n')
    with pytest.raises(ConfigError, match="--docker-image / CODEMODE_DOCKER_IMAGE needs --runtime"):
        load_settings(config_file=file, transport="stdio", allow_all=True, docker_image="img:1")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("docker_pids = 4\n", "unknown setting 'docker_pids'"),
        ("[docker]\npids = 4\n", "unknown setting 'pids' in [docker]"),
    ],
)
def test_the_earlier_docker_pids_spelling_is_an_unknown_setting(
    toml: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "codemode.toml"
    file.write_text('runtime = "docker"\n' + toml)
    assert main(["serve", "--stdio", "--allow-all", "--config", str(file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"codemode: --config / CODEMODE_CONFIG: {str(file)!r}: {message}"), err
    assert err.count("\n") == 1


def test_the_earlier_docker_pids_flag_keyword_and_variable_are_unknown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--stdio", "--allow-all", "--runtime", "docker", "--docker-pids", "4"])
    assert "unrecognized arguments: --docker-pids" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown setting 'docker_pids'"):
        load_settings(transport="stdio", allow_all=True, runtime="docker", docker_pids=4)
    monkeypatch.setenv("CODEMODE_DOCKER_PIDS", "4")  # an unknown variable: ignored, as every other
    assert load_settings(transport="stdio", allow_all=True, runtime="docker").docker.max_processes is None


def test_the_chosen_runtimes_options_are_checked_when_the_settings_load() -> None:
    with pytest.raises(
        ConfigError, match=r"^--kubernetes-memory / CODEMODE_KUBERNETES_MEMORY: memory 'lots'"
    ):
        load_settings(transport="stdio", allow_all=True, runtime="kubernetes", kubernetes_memory="lots")


def test_a_runtime_option_refused_at_build_names_its_flag() -> None:
    """An option given in code at build (``build_runtime(settings, memory=...)``) and refused by
    the options is still named by its setting's flag and variable (a table's setting is flat)."""
    from codemode.startup.bootstrap import build_runtime

    settings = load_settings(transport="stdio", allow_all=True, runtime="kubernetes")
    names = "--kubernetes-memory / CODEMODE_KUBERNETES_MEMORY"
    with pytest.raises(ConfigError, match=rf"^{names}: memory 'lots' is not"):
        build_runtime(settings, memory="lots")


def test_quotas_tune_does_not_take_the_earlier_docker_pids_either(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["quotas", "tune", "--program", "x", "--runtime", "docker", "--docker-pids", "4"])
    assert "unrecognized arguments: --docker-pids" in capsys.readouterr().err
