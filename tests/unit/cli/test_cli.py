"""The ``codemode`` command line: parsing, the one settings model, server building, exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest

import codemode
from codemode.cli import build_parser, main
from codemode.cli.flags import overrides
from codemode.execution.limits import DEFAULTS, FLOAT_LIMITS
from codemode.startup.bootstrap import build_runtime, build_server
from codemode.startup.config import ConfigError, Settings, load_settings

RECORDS = "codemode_capabilities.records:pack"

Config = Callable[..., Settings]


@pytest.fixture
def config(monkeypatch: pytest.MonkeyPatch) -> Config:
    """Settings as ``codemode serve ARGV`` would build them, under exactly the environment ``env``."""
    for key in list(os.environ):
        if key.startswith("CODEMODE_"):
            monkeypatch.delenv(key)

    def make(argv: list[str], env: dict[str, str] | None = None) -> Settings:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        args = build_parser().parse_args(["serve", *argv])
        mode: Literal["http", "stdio"] = "http" if args.http else "stdio"
        return load_settings(config_file=args.config, **overrides(args, mode))

    return make


# --------------------------------------------------------------------------------------------- help


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["serve"],
        ["token"],
        ["token", "new"],
        ["token", "list"],
        ["token", "revoke"],
        ["image"],
        ["image", "audit"],
        ["quotas"],
        ["quotas", "tune"],
        ["bench"],
    ],
)
def test_every_command_has_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    assert "usage: codemode" in capsys.readouterr().out


def test_serve_help_shows_real_defaults_units_and_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--stdio", "--http", "--pack", "--allow-all", "--rego-policy", "--runtime", "--token-file"):
        assert flag in out, flag
    assert "{process,docker,kubernetes}" in out
    assert "0 = the default" not in out
    for name, default in DEFAULTS.items():
        env = "CODEMODE_" + name.upper()
        shown = str(float(default)) if name in FLOAT_LIMITS else str(int(default))
        assert f"(default: {shown}; {env})" in out, name
    assert "seconds of wall time per execute (default: 5.0; CODEMODE_MAX_EXECUTION_TIME)" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert codemode.__version__ in capsys.readouterr().out


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: codemode" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["serve", "--stdio", "--bogus"], "usage: codemode serve"),
        (["bench", "--bogus"], "usage: codemode bench"),
        (["quotas", "tune", "--program", "x", "--bogus"], "usage: codemode quotas tune"),
        (["token", "list", "--bogus"], "usage: codemode token"),
    ],
)
def test_unknown_flag_prints_the_subcommand_usage(
    argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    first, second = err.splitlines()  # the problem first, then one short usage line
    assert first.startswith(usage.replace("usage: ", "") + ": error: unrecognized arguments: --bogus"), err
    assert second.startswith(usage), err


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["serve", "--stdio", "--alow-all"], "--alow-all: did you mean --allow-all?"),
        (["serve", "--stdio", "--max-execution-tme=3"], "did you mean --max-execution-time?"),
        (["quotas", "tune", "--program", "x", "--dokcer-memory", "1g"], "did you mean --docker-memory?"),
    ],
)
def test_a_mistyped_flag_names_the_close_one(
    argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert hint in first, first


def test_abbreviated_flags_are_not_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--stdio", "--allow-al"])
    assert info.value.code == 2
    assert (
        "unrecognized arguments: --allow-al (--allow-al: did you mean --allow-all?)"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["image", "audit", "x", "--docker-base-url", "unix:///nonexistent.sock"], "nonexistent"),
        (["quotas", "tune"], "--program"),
        (
            ["quotas", "tune", "--program", "x", "--runtime", "docker", "--process-memory", "1g"],
            "--process-memory applies to --runtime process, not --runtime docker",
        ),
        (
            ["quotas", "tune", "--program", "x", "--runtime", "process", "--memory", "1g"],
            "--docker-memory applies to --runtime docker, not --runtime process",
        ),
        (["bench", "--n", "0"], "--n must be positive"),
        (["bench", "--load", "0"], "--load must be positive"),
        (["bench", "--clients", "-1"], "--clients must not be negative"),
        (["bench", "--docker-image", "img:1"], "--docker-image / CODEMODE_DOCKER_IMAGE needs --runtime"),
        (["bench", "--reuse", "10"], "--reuse needs --runtime docker or kubernetes"),
        (["bench", "--runtime", "docker", "--reuse", "-1"], "--reuse needs --runtime docker or kubernetes"),
    ],
)
def test_operator_commands_reject_bad_input(
    argv: list[str], what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors
        assert exc.code == 2
        return
    assert code == 2
    assert what in capsys.readouterr().err


def test_group_without_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["image"]) == 2
    assert "audit" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- config


def test_defaults(config: Config) -> None:
    c = config(["--stdio", "--allow-all"])
    assert c.transport == "stdio"
    assert c.packs == [] and c.disable == [] and c.rego_policy == []
    assert c.runtime == "process" and c.pool == 0
    assert c.limits == codemode.Limits()
    # One static subject: no quota and no reserve, so it may use every slot.
    assert c.subject_quota == 0 and c.effective_reserved_slots == 0
    assert c.subject_id  # the OS user name


def test_quota_defaults_follow_where_subjects_come_from() -> None:
    import inspect

    from codemode.execution.limits import DEFAULT_SUBJECT_QUOTA

    # The HTTP service's subjects come from requests: a quota and a reserve protect them.
    http = load_settings(transport="http", allow_all=True)
    assert http.subject_quota == Settings.model_fields["subject_quota"].default == DEFAULT_SUBJECT_QUOTA == 4
    assert http.effective_reserved_slots == 2
    # stdio has one static subject; so has a library host unless it says otherwise.
    stdio = load_settings(transport="stdio", allow_all=True)
    assert (stdio.subject_quota, stdio.effective_reserved_slots) == (0, 0)
    assert inspect.signature(codemode.Builder).parameters["subject_quota"].default == 0
    # Given explicitly, they hold on stdio too.
    given = load_settings(transport="stdio", allow_all=True, subject_quota=2, reserved_slots=1)
    assert (given.subject_quota, given.effective_reserved_slots) == (2, 1)


def test_flags(config: Config) -> None:
    c = config(
        [
            "--stdio",
            "--pack",
            RECORDS,
            "--pack",
            "a.b:c",
            "--allow-all",
            "--disable",
            "records.entry.delete",
            "--max-execution-time",
            "2.5",
            "--max-native-calls",
            "7",
            "--pool",
            "3",
            "--subject",
            "alice",
            "--pack-option",
            "K=V=W",
        ]
    )
    assert c.packs == [RECORDS, "a.b:c"]
    assert c.allow_all is True
    assert c.disable == ["records.entry.delete"]
    assert c.limits.max_execution_time == 2.5 and c.limits.max_native_calls == 7
    assert c.pool == 3 and c.subject_id == "alice"
    assert c.pack_option_map == {"K": "V=W"}


def test_environment(config: Config) -> None:
    env = {
        "CODEMODE_PACKS": f"{RECORDS}, x.y:z",
        "CODEMODE_ALLOW_ALL": "true",
        "CODEMODE_DISABLE": "a,b",
        "CODEMODE_MAX_EXECUTION_TIME": "1.5",
        "CODEMODE_SUBJECT": "envuser",
        "CODEMODE_RUNTIME": "docker",
        "CODEMODE_POOL": "2",
        "CODEMODE_DOCKER_MEMORY": "256m",
        "CODEMODE_DOCKER_CPUS": "0.5",
        "CODEMODE_LOG_LEVEL": "debug",
    }
    c = config(["--stdio"], env)
    assert c.packs == [RECORDS, "x.y:z"] and c.allow_all is True and c.disable == ["a", "b"]
    assert c.limits.max_execution_time == 1.5 and c.subject_id == "envuser"
    assert c.runtime == "docker" and c.pool == 2
    assert (c.docker.memory, c.docker.cpus) == (256 * 1024**2, 0.5)


def test_toml_file_under_environment_under_flags(config: Config, tmp_path: Path) -> None:
    toml = tmp_path / "codemode.toml"
    toml.write_text('allow_all = true\npool = 1\nsubject = "toml"\n[limits]\nmax_native_calls = 11\n')
    c = config(["--stdio", "--config", str(toml)])
    assert (c.pool, c.subject_id, c.limits.max_native_calls) == (1, "toml", 11)
    c = config(["--stdio", "--config", str(toml), "--pool", "5"], {"CODEMODE_SUBJECT": "env"})
    assert (c.pool, c.subject_id) == (5, "env")


def test_flags_beat_environment_and_lists_add(config: Config) -> None:
    env = {"CODEMODE_PACKS": "a.b:c", "CODEMODE_MAX_NATIVE_CALLS": "9", "CODEMODE_DISABLE": "x"}
    c = config(
        ["--stdio", "--allow-all", "--pack", "d.e:f", "--max-native-calls", "3", "--disable", "y"], env
    )
    assert c.packs == ["a.b:c", "d.e:f"] and c.limits.max_native_calls == 3 and c.disable == ["x", "y"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stdio", "--port", "9"], "--port is for serve --http; it does nothing with --stdio"),
        (["--stdio", "--token-file", "t"], "--token-file is for serve --http"),
        (["--http", "--subject", "x"], "--subject is for serve --stdio"),
    ],
)
def test_flags_that_do_nothing_in_a_mode_are_rejected(config: Config, argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(argv)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CODEMODE_ALLOW_ALL": "maybe"}, "--allow-all / CODEMODE_ALLOW_ALL"),
        ({"CODEMODE_MAX_NATIVE_CALLS": "lots"}, "--max-native-calls / CODEMODE_MAX_NATIVE_CALLS"),
        (
            {"CODEMODE_MAX_NATIVE_CALLS": "-1"},
            "--max-native-calls / CODEMODE_MAX_NATIVE_CALLS: Input should be greater",
        ),
        ({"CODEMODE_POOL": "-2"}, "--pool / CODEMODE_POOL"),
        ({"CODEMODE_PACK_OPTIONS": "novalue"}, "--pack-option / CODEMODE_PACK_OPTIONS: .*KEY=VALUE"),
        ({"CODEMODE_DOCKER_MEMORY": "lots"}, "--docker-memory / CODEMODE_DOCKER_MEMORY"),
        ({"CODEMODE_RUNTIME": "vm"}, "--runtime / CODEMODE_RUNTIME"),
    ],
)
def test_bad_environment_names_flag_and_variable(config: Config, env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        config(["--stdio"], {"CODEMODE_ALLOW_ALL": "true", **env})
    assert "\n" not in str(info.value)


def test_allow_all_false_values(config: Config) -> None:
    for value in ("0", "false", "no", "off"):
        with pytest.raises(ConfigError, match="no authorizer"):
            config(["--stdio"], {"CODEMODE_ALLOW_ALL": value})


# ------------------------------------------------------------------------------------------- build


def test_build_server_with_records(config: Config) -> None:
    server = build_server(config(["--stdio", "--allow-all", "--pack", RECORDS, "--max-native-calls", "4"]))
    assert {c.name for c in server.capabilities} == {
        "records.create",
        "records.get",
        "records.search",
        "records.update",
        "records.delete",
    }
    assert server.limits.max_native_calls == 4
    assert server.limits.max_execution_time == 5.0
    assert isinstance(server.runtime, codemode.ProcessRuntime)


def test_build_server_disable_and_pool(config: Config) -> None:
    c = config(
        ["--stdio", "--allow-all", "--pack", RECORDS, "--disable", "records.entry.delete", "--pool", "2"]
    )
    server = build_server(c)
    assert "records.delete" not in {cap.name for cap in server.capabilities}
    assert isinstance(server.runtime, codemode.WarmPool)
    assert server.runtime.size == 2
    assert isinstance(server.runtime.inner, codemode.ProcessRuntime)


def test_no_authorizer_is_an_error(config: Config) -> None:
    with pytest.raises(ConfigError, match="no authorizer: set --allow-all / CODEMODE_ALLOW_ALL"):
        config(["--stdio", "--pack", RECORDS])


def test_both_authorizers_is_an_error(config: Config, tmp_path: Path) -> None:
    policy = tmp_path / "p.rego"
    policy.write_text("package x\n\nallow := true\n")
    with pytest.raises(ConfigError, match="choose one authorizer"):
        config(["--stdio", "--allow-all", "--rego-policy", str(policy), "--rego-decision", "data.x.allow"])


def test_rego_needs_decision_and_a_readable_file(config: Config, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs both --rego-policy / CODEMODE_REGO_POLICY"):
        config(["--stdio", "--rego-decision", "data.x.allow"])
    missing = str(tmp_path / "missing.rego")
    with pytest.raises(
        ConfigError, match=r"--rego-policy / CODEMODE_REGO_POLICY: policy file .* does not exist"
    ):
        config(["--stdio", "--rego-policy", missing, "--rego-decision", "data.x.allow"])


def test_rego_authorizer_is_built(config: Config, tmp_path: Path) -> None:
    from codemode.authz.rego import RegoAuthorizer

    policy = tmp_path / "p.rego"
    policy.write_text('package x\n\ndefault allow := false\n\nallow if input.subject.id == "alice"\n')
    c = config(
        ["--stdio", "--pack", RECORDS, "--rego-policy", str(policy), "--rego-decision", "data.x.allow"]
    )
    server = build_server(c)
    assert isinstance(server._executor.authorizer, RegoAuthorizer)
    assert server._executor.authorizer._inline is False
    inline = config(
        ["--stdio", "--pack", RECORDS, "--rego-policy", str(policy), "--rego-decision", "data.x.allow"],
        {"CODEMODE_REGO_EVALUATE_INLINE": "true"},
    )
    assert build_server(inline)._executor.authorizer._inline is True  # type: ignore[attr-defined]
    assert server._executor.authorizer._bounded is True  # a bounded policy: decided on the loop's thread
    rego_flags = ["--rego-policy", str(policy), "--rego-decision", "data.x.allow"]
    handed_off = config(["--stdio", "--pack", RECORDS, *rego_flags, "--no-rego-bounded-inline"])
    assert build_server(handed_off)._executor.authorizer._bounded is False  # type: ignore[attr-defined]
    from_env = config(
        ["--stdio", "--pack", RECORDS, "--rego-policy", str(policy), "--rego-decision", "data.x.allow"],
        {"CODEMODE_REGO_BOUNDED_INLINE": "false"},
    )
    assert build_server(from_env)._executor.authorizer._bounded is False  # type: ignore[attr-defined]
    with pytest.raises(
        ConfigError,
        match="--rego-evaluate-inline / CODEMODE_REGO_EVALUATE_INLINE applies to the Rego authorizer only",
    ):
        config(["--stdio", "--pack", RECORDS, "--allow-all", "--rego-evaluate-inline"])


def test_rego_rejected_policy_names_flag_and_variable(config: Config, tmp_path: Path) -> None:
    policy = tmp_path / "p.rego"
    policy.write_text(
        'package x\n\nallow if http.send({"method": "get", "url": "http://x"}).status_code == 200\n'
    )
    c = config(["--stdio", "--rego-policy", str(policy), "--rego-decision", "data.x.allow"])
    with pytest.raises(ConfigError, match=r"--rego-policy / CODEMODE_REGO_POLICY: .*rejected") as info:
        build_server(c)
    assert "\n" not in str(info.value)


def test_bad_pack_and_registration_errors(config: Config) -> None:
    with pytest.raises(
        ConfigError, match="--pack / CODEMODE_PACKS: pack 'no_such_module_xyz:pack': no module"
    ):
        build_server(config(["--stdio", "--allow-all", "--pack", "no_such_module_xyz:pack"]))
    with pytest.raises(ConfigError, match="disabled id 'nope'"):
        build_server(config(["--stdio", "--allow-all", "--pack", RECORDS, "--disable", "nope"]))


def test_docker_runtime_gets_the_flags(config: Config) -> None:
    c = config(
        [
            "--stdio",
            "--allow-all",
            "--runtime",
            "docker",
            "--docker-image",
            "img:1",
            "--docker-memory",
            "64m",
            "--docker-cpus",
            "2",
            "--docker-max-processes",
            "50",
        ]
    )
    runtime: Any = build_runtime(c)
    assert isinstance(runtime, codemode.DockerRuntime)
    o = runtime.options
    assert (o.image, o.memory, o.cpus, o.max_processes) == (
        "img:1",
        64 * 1024**2,
        2.0,
        50,
    )
    with pytest.raises(ConfigError, match="--docker-"):
        build_runtime(config(["--stdio", "--allow-all", "--runtime", "docker", "--docker-memory", "1k"]))


def test_process_runtime_gets_the_flags(config: Config) -> None:
    flags = ["--process-memory", "512m", "--process-cpu-seconds", "5", "--process-open-files", "40"]
    flags += ["--process-max-processes", "8", "--process-worker-uid-base", "0", "--process-worker-uids", "16"]
    runtime: Any = build_runtime(config(["--stdio", "--allow-all", *flags]))
    assert isinstance(runtime, codemode.ProcessRuntime)
    got = (runtime.memory, runtime.cpu_seconds, runtime.open_files, runtime.max_processes)
    assert got == (512 * 1024**2, 5.0, 40, 8)
    assert (runtime.worker_uid_base, runtime.worker_uids, runtime.drops_privileges) == (0, 16, False)
    plain: Any = build_runtime(config(["--stdio", "--allow-all"]))  # the runtime's own defaults
    assert (plain.memory, plain.cpu_seconds, plain.open_files) == (2 * 1024**3, 30.0, 32)
    with pytest.raises(ConfigError, match="--process-memory / CODEMODE_PROCESS_MEMORY needs --runtime"):
        config(["--stdio", "--allow-all", "--runtime", "docker", "--process-memory", "1g"])
    with pytest.raises(ConfigError, match="--process-memory"):
        config(["--stdio", "--allow-all", "--process-memory", "lots"])


def test_kubernetes_runtime_gets_the_flags(config: Config) -> None:
    c = config(
        [
            "--stdio",
            "--allow-all",
            "--runtime",
            "kubernetes",
            "--kubernetes-namespace",
            "ns1",
            "--kubernetes-image",
            "w:1",
        ]
    )
    runtime: Any = build_runtime(c)
    assert isinstance(runtime, codemode.KubernetesRuntime)
    assert (runtime.options.namespace, runtime.options.image) == ("ns1", "w:1")


def test_runtime_flags_need_their_runtime(config: Config) -> None:
    with pytest.raises(
        ConfigError, match="--docker-image / CODEMODE_DOCKER_IMAGE needs --runtime / CODEMODE_RUNTIME docker"
    ):
        config(["--stdio", "--allow-all", "--docker-image", "img:1"])
    with pytest.raises(ConfigError, match="needs --runtime / CODEMODE_RUNTIME kubernetes"):
        config(["--stdio", "--allow-all", "--kubernetes-image", "img:1"])


# -------------------------------------------------------------------------------------------- main


def test_main_reports_config_errors_on_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CODEMODE_ALLOW_ALL", raising=False)
    assert main(["serve", "--stdio", "--pack", RECORDS]) == 2
    err = capsys.readouterr().err
    assert err.startswith("codemode: no authorizer") and err.count("\n") == 1


def test_main_without_transport(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CODEMODE_TRANSPORT", raising=False)
    assert main(["serve", "--allow-all"]) == 2
    assert "choose a transport" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--token-file", "/nonexistent/tokens"],
            "--token-file / CODEMODE_TOKEN_FILE: token file '/nonexistent/tokens' does not exist",
        ),
        (["--token-file", "/"], "is not a regular file"),
    ],
)
def test_http_config_errors_exit_2_naming_flag_and_variable(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in list(os.environ):
        if key.startswith("CODEMODE_"):
            monkeypatch.delenv(key)
    assert main(["serve", "--http", "--allow-all", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_http_hands_settings_to_the_service(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import codemode.service as service

    tokens = tmp_path / "tokens"
    tokens.write_text("")
    for key in list(os.environ):
        if key.startswith("CODEMODE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("CODEMODE_TOKEN_FILE", str(tokens))
    seen: list[Any] = []
    monkeypatch.setattr(service, "serve", seen.append)
    assert (
        main(
            [
                "serve",
                "--http",
                "--port",
                "9123",
                "--allow-all",
                "--pack",
                RECORDS,
                "--max-execution-time",
                "2",
            ]
        )
        == 0
    )
    (settings,) = seen
    assert settings.port == 9123 and settings.allow_all is True and settings.packs == [RECORDS]
    assert settings.limits.max_execution_time == 2.0
    assert main(["serve", "--http", "--pack", RECORDS]) == 2
    assert "authorizer" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- token


def test_token_new_list_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from codemode.service.tokens import hash_token, load_token_file

    path = tmp_path / "sub" / "codemode.tokens"
    assert main(["token", "new", "alice", "--token-file", str(path)]) == 0
    token = capsys.readouterr().out.strip()
    assert main(["token", "new", "bob", "--token-file", str(path)]) == 0
    capsys.readouterr()
    assert load_token_file(path)[hash_token(token)] == "alice"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert token not in path.read_text()
    assert main(["token", "list", "--token-file", str(path)]) == 0
    listed = capsys.readouterr().out
    lines = listed.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["alice", "bob"]
    assert all(line.split("\t")[1].startswith("20") for line in lines)  # ISO creation time
    assert hash_token(token) not in listed
    assert main(["token", "revoke", "alice", "--token-file", str(path)]) == 0
    assert list(load_token_file(path).values()) == ["bob"]
    assert main(["token", "revoke", "alice", "--token-file", str(path)]) == 1


def test_token_file_from_environment_and_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from codemode.startup.config import default_token_file

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CODEMODE_TOKEN_FILE", raising=False)
    assert default_token_file() == tmp_path / "xdg" / "codemode" / "codemode.tokens"
    assert main(["token", "new", "carol"]) == 0
    assert default_token_file().is_file()
    monkeypatch.setenv("CODEMODE_TOKEN_FILE", str(tmp_path / "env.tokens"))
    assert main(["token", "list"]) == 2
    assert "--token-file / CODEMODE_TOKEN_FILE" in capsys.readouterr().err


def test_default_token_name_is_ignored_by_git() -> None:
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        ["git", "check-ignore", "-q", "codemode.tokens"], cwd=root, capture_output=True, timeout=30
    )
    assert proc.returncode == 0


# ------------------------------------------------------------------------------------ entry points


def test_module_entry_point_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "codemode.cli", "bench", "--n", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--n must be positive" in proc.stderr


def test_stdio_server_exits_cleanly_on_eof() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEMODE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "codemode.cli", "serve", "--stdio", "--allow-all", "--pack", RECORDS],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""


def test_configuration_doc_lists_every_setting_as_the_code_defines_it() -> None:
    from codemode.cli.flags import settings_table

    doc = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert settings_table() in doc


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--allow-all", "--pack", "no_such_pack_mod:pack"],
            "--pack / CODEMODE_PACKS: pack 'no_such_pack_mod:pack'",
        ),
        (
            ["--rego-policy", "BAD", "--rego-decision", "data.x.allow"],
            "--rego-policy / CODEMODE_REGO_POLICY: ",
        ),
    ],
)
def test_http_build_errors_exit_2_on_one_line(
    extra: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in list(os.environ):
        if key.startswith("CODEMODE_"):
            monkeypatch.delenv(key)
    tokens = tmp_path / "codemode.tokens"
    tokens.write_text("{}")
    bad = tmp_path / "bad.rego"
    bad.write_text("package x\n\nallow if http.send({}).status_code == 200\n")
    argv = ["serve", "--http", "--token-file", str(tokens), *[str(bad) if a == "BAD" else a for a in extra]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("codemode: " + message), err
    assert err.count("\n") == 1


def test_a_toml_syntax_error_names_the_file_and_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "codemode.toml"
    bad.write_text("pool = \n")
    assert main(["serve", "--stdio", "--allow-all", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    where = f"codemode: --config / CODEMODE_CONFIG: {str(bad)!r}"
    assert err == f"{where} is not valid TOML: Invalid value (at line 1, column 8)\n"


def test_an_unknown_toml_key_names_the_file_and_the_close_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "codemode.toml"
    bad.write_text("pol = 3\n")
    assert main(["serve", "--stdio", "--allow-all", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    where = f"codemode: --config / CODEMODE_CONFIG: {str(bad)!r}"
    assert err == f"{where}: unknown setting 'pol' (did you mean 'pool'?)\n"


def test_misspelled_variables_are_named_and_pack_options_are_not() -> None:
    from codemode.startup.config import misspelled_variables

    environ = {
        "CODEMODE_MAX_EXECUTON_TIME": "3",
        "CODEMODE_POOOL": "2",
        "CODEMODE_POOL": "2",
        "CODEMODE_RECORDS_DB": "x",
        "CODEMODE_RECORDS_MAX_RECORDS": "5",
        "CODEMODE_UPSTREAMS_FILE": "u.toml",
        "CODEMODE_CONFIG": "c.toml",
        "CODEMODE_TRANSPORT": "stdio",
        "HOME": "/root",
    }
    ignored = "is not a setting and is ignored: did you mean"
    assert misspelled_variables(environ) == [
        f"CODEMODE_MAX_EXECUTON_TIME {ignored} CODEMODE_MAX_EXECUTION_TIME?",
        f"CODEMODE_POOOL {ignored} CODEMODE_POOL?",
    ]


def test_a_misspelled_variable_is_warned_about_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from codemode.startup.config import load as loading

    monkeypatch.setenv("CODEMODE_MAX_NATIVE_CALS", "3")
    monkeypatch.setattr(loading, "_warned", set())
    with caplog.at_level("WARNING", logger="codemode.config"):
        loading.load_settings(allow_all=True)
    assert "did you mean CODEMODE_MAX_NATIVE_CALLS?" in caplog.text


def test_a_decision_naming_no_rule_is_refused_at_start(capsys: pytest.CaptureFixture[str]) -> None:
    policy = str(Path(__file__).resolve().parents[3] / "examples" / "policy.rego")
    argv = ["serve", "--stdio", "--rego-policy", policy, "--rego-decision", "data.codemode.records.alow"]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "codemode: --rego-decision / CODEMODE_REGO_DECISION: decision 'data.codemode.records.alow' "
        "names no rule of the loaded modules: data.codemode.records (rules "
    ), line
    assert "allow" in line


def test_the_packs_old_import_path_names_the_new_one() -> None:
    """The shipped packs are the package ``codemode_capabilities`` now: the old spelling of a pack
    spec is refused in one line that names the new one, with the configuration exit code."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "codemode.cli",
            "serve",
            "--stdio",
            "--allow-all",
            "--pack",
            "codemode.capabilities.records:pack",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "codemode: --pack / CODEMODE_PACKS: pack 'codemode.capabilities.records:pack': the packs that "
        "ship moved to codemode_capabilities: use codemode_capabilities.records:pack"
    ]
    new = subprocess.run(
        [
            sys.executable,
            "-c",
            "from codemode.packs import load_pack; print(len(load_pack("
            "'codemode_capabilities.records:pack')) > 0)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert new.stdout.strip() == "True", new.stderr
