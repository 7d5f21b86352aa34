"""The ``codemode`` command line: parsing, environment configuration, server building, stubs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import cli
from codemode.cli import ConfigError, build_parser, build_server, main, serve_config

RECORDS = "codemode.capabilities.records:pack"


def config(argv: list[str], env: dict[str, str] | None = None) -> cli.ServeConfig:
    args = build_parser().parse_args(["serve", *argv])
    return serve_config(args, env or {})


# --------------------------------------------------------------------------------------------- help


@pytest.mark.parametrize(
    "argv",
    [[], ["serve"], ["image"], ["image", "audit"], ["quotas"], ["quotas", "tune"], ["bench"]],
)
def test_every_command_has_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: codemode" in out


def test_serve_help_lists_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for flag in (
        "--stdio",
        "--http",
        "--host",
        "--port",
        "--pack",
        "--allow-all",
        "--rego-policy",
        "--rego-decision",
        "--runtime",
        "--pool",
        "--subject",
        "--disable",
        "--max-execution-time",
        "--max-native-calls",
        "CODEMODE_PACKS",
    ):
        assert flag in out, flag


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert codemode.__version__ in capsys.readouterr().out


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: codemode" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["image", "audit", "x", "--docker-base-url", "unix:///nonexistent.sock"], "nonexistent"),
        (["quotas", "tune"], "--program"),
        (["bench", "--n", "0"], "--n must be positive"),
    ],
)
def test_operator_commands_reject_bad_input(
    argv: list[str], what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    assert code == 2
    assert what in capsys.readouterr().err


def test_group_without_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["image"]) == 2
    assert "audit" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- config


def test_defaults() -> None:
    c = config(["--stdio"])
    assert c.transport == "stdio"
    assert c.packs == [] and c.disabled == [] and c.allow_all is False
    assert c.runtime == "process" and c.pool == 0
    assert c.limits == codemode.Limits()
    assert c.subject  # the OS user name


def test_flags() -> None:
    c = config(
        [
            "--stdio",
            "--pack",
            RECORDS,
            "--pack",
            "a.b:c,d.e:f",
            "--allow-all",
            "--disable",
            "records.entry.delete",
            "--max-execution-time",
            "2.5",
            "--max-native-calls",
            "7",
            "--max-value-bytes",
            "1000",
            "--pool",
            "3",
            "--subject",
            "alice",
            "--pack-option",
            "K=V=W",
        ]
    )
    assert c.packs == [RECORDS, "a.b:c", "d.e:f"]
    assert c.allow_all is True
    assert c.disabled == ["records.entry.delete"]
    assert c.limits.max_execution_time == 2.5
    assert c.limits.max_native_calls == 7
    assert c.limits.max_value_bytes == 1000
    assert c.pool == 3
    assert c.subject == "alice"
    assert c.pack_options == {"K": "V=W"}


def test_environment() -> None:
    env = {
        "CODEMODE_PACKS": f"{RECORDS}, x.y:z",
        "CODEMODE_ALLOW_ALL": "true",
        "CODEMODE_DISABLE": "a,b",
        "CODEMODE_MAX_EXECUTION_TIME": "1.5",
        "CODEMODE_MAX_NATIVE_CALLS": "9",
        "CODEMODE_SUBJECT": "envuser",
        "CODEMODE_RUNTIME": "docker",
        "CODEMODE_POOL": "2",
        "CODEMODE_DOCKER_MEMORY": "256m",
        "CODEMODE_DOCKER_CPUS": "0.5",
        "CODEMODE_DOCKER_PIDS": "32",
        "CODEMODE_REGO_DECISION": "data.x.allow",
        "CODEMODE_LOG_LEVEL": "debug",
    }
    c = config(["--stdio"], env)
    assert c.packs == [RECORDS, "x.y:z"]
    assert c.allow_all is True
    assert c.disabled == ["a", "b"]
    assert c.limits.max_execution_time == 1.5 and c.limits.max_native_calls == 9
    assert c.subject == "envuser"
    assert c.runtime == "docker" and c.pool == 2
    assert (c.docker_memory, c.docker_cpus, c.docker_pids) == (256 * 1024**2, 0.5, 32)
    assert c.rego_decision == "data.x.allow"
    assert c.log_level == "DEBUG"


def test_flags_beat_environment_and_lists_add() -> None:
    env = {
        "CODEMODE_PACKS": "a.b:c",
        "CODEMODE_MAX_NATIVE_CALLS": "9",
        "CODEMODE_SUBJECT": "envuser",
        "CODEMODE_DISABLE": "x",
    }
    c = config(
        ["--stdio", "--pack", "d.e:f", "--max-native-calls", "3", "--subject", "flag", "--disable", "y"], env
    )
    assert c.packs == ["a.b:c", "d.e:f"]
    assert c.limits.max_native_calls == 3
    assert c.subject == "flag"
    assert c.disabled == ["x", "y"]


def test_transport_from_environment() -> None:
    assert config([], {"CODEMODE_TRANSPORT": "stdio"}).transport == "stdio"
    with pytest.raises(ConfigError, match="choose a transport"):
        config([], {})


def test_stdio_and_http_are_exclusive() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--stdio", "--http"])


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CODEMODE_ALLOW_ALL": "maybe"}, "CODEMODE_ALLOW_ALL"),
        ({"CODEMODE_MAX_NATIVE_CALLS": "lots"}, "CODEMODE_MAX_NATIVE_CALLS must be an integer"),
        ({"CODEMODE_MAX_EXECUTION_TIME": "soon"}, "CODEMODE_MAX_EXECUTION_TIME must be a number"),
        ({"CODEMODE_MAX_NATIVE_CALLS": "-1"}, "must not be negative"),
        ({"CODEMODE_POOL": "-2"}, "--pool must not be negative"),
        ({"CODEMODE_PACK_OPTIONS": "novalue"}, "KEY=VALUE"),
        ({"CODEMODE_DOCKER_MEMORY": "lots"}, "--docker-memory must be a positive byte count"),
    ],
)
def test_bad_environment(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(["--stdio"], env)


def test_allow_all_false_values() -> None:
    for value in ("0", "false", "no", "off", ""):
        assert config(["--stdio"], {"CODEMODE_ALLOW_ALL": value}).allow_all is False


# ------------------------------------------------------------------------------------------- build


def test_build_server_with_records() -> None:
    server = build_server(
        config(["--stdio", "--allow-all", "--pack", RECORDS, "--max-native-calls", "4"]), {}
    )
    assert {c.name for c in server.capabilities} == {
        "records.create",
        "records.get",
        "records.search",
        "records.update",
        "records.delete",
    }
    assert server.limits.max_native_calls == 4
    assert server.limits.max_execution_time == 5.0  # defaults resolved
    assert isinstance(server.runtime, codemode.ProcessRuntime)


def test_build_server_disable_and_pool() -> None:
    c = config(
        ["--stdio", "--allow-all", "--pack", RECORDS, "--disable", "records.entry.delete", "--pool", "2"]
    )
    server = build_server(c, {})
    assert "records.delete" not in {cap.name for cap in server.capabilities}
    assert isinstance(server.runtime, codemode.WarmPool)
    assert server.runtime.size == 2
    assert isinstance(server.runtime.inner, codemode.ProcessRuntime)


def test_no_authorizer_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no authorizer: pass --allow-all"):
        build_server(config(["--stdio", "--pack", RECORDS]), {})


def test_both_authorizers_is_an_error(tmp_path: Path) -> None:
    policy = tmp_path / "p.rego"
    policy.write_text("package x\n\nallow := true\n")
    c = config(["--stdio", "--allow-all", "--rego-policy", str(policy), "--rego-decision", "data.x.allow"])
    with pytest.raises(ConfigError, match="choose one authorizer"):
        build_server(c, {})


def test_rego_needs_decision_and_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="go together"):
        build_server(config(["--stdio", "--rego-decision", "data.x.allow"]), {})
    with pytest.raises(ConfigError, match="cannot read Rego policy"):
        build_server(
            config(
                [
                    "--stdio",
                    "--rego-policy",
                    str(tmp_path / "missing.rego"),
                    "--rego-decision",
                    "data.x.allow",
                ]
            ),
            {},
        )


def test_rego_authorizer_is_built(tmp_path: Path) -> None:
    from codemode.authz.rego import RegoAuthorizer

    policy = tmp_path / "p.rego"
    policy.write_text('package x\n\ndefault allow := false\n\nallow if input.subject.id == "alice"\n')
    c = config(
        ["--stdio", "--pack", RECORDS, "--rego-policy", str(policy), "--rego-decision", "data.x.allow"]
    )
    server = build_server(c, {})
    assert isinstance(server._executor.authorizer, RegoAuthorizer)


def test_rego_rejected_policy(tmp_path: Path) -> None:
    policy = tmp_path / "p.rego"
    policy.write_text(
        'package x\n\nallow if http.send({"method": "get", "url": "http://x"}).status_code == 200\n'
    )
    c = config(["--stdio", "--rego-policy", str(policy), "--rego-decision", "data.x.allow"])
    with pytest.raises(ConfigError, match="Rego policy rejected"):
        build_server(c, {})


def test_bad_pack_and_registration_errors() -> None:
    with pytest.raises(ConfigError, match="cannot import module"):
        build_server(config(["--stdio", "--allow-all", "--pack", "no_such_module_xyz:pack"]), {})
    with pytest.raises(ConfigError, match="disabled id 'nope'"):
        build_server(config(["--stdio", "--allow-all", "--pack", RECORDS, "--disable", "nope"]), {})


def test_docker_runtime_is_constructed(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []

    class FakeDocker:
        name = "docker"

        def __init__(self, **kwargs: Any) -> None:
            made.append(kwargs)

    import codemode.runtimes as runtimes_pkg

    fake_module: Any = type(sys)("codemode.runtimes.docker")
    fake_module.DockerRuntime = FakeDocker
    monkeypatch.setitem(sys.modules, "codemode.runtimes.docker", fake_module)
    monkeypatch.setattr(runtimes_pkg, "docker", fake_module, raising=False)
    c = config(
        [
            "--stdio",
            "--runtime",
            "docker",
            "--docker-image",
            "img:1",
            "--docker-oci-runtime",
            "runsc",
            "--docker-memory",
            "64m",
            "--docker-cpus",
            "2",
            "--docker-pids",
            "50",
            "--docker-base-url",
            "unix:///tmp/docker.sock",
            "--pool",
            "1",
        ]
    )
    runtime = cli.make_runtime(c)
    assert isinstance(runtime, codemode.WarmPool)
    assert isinstance(runtime.inner, FakeDocker)
    assert made == [
        {
            "image": "img:1",
            "runtime": "runsc",
            "memory_bytes": 64 * 1024**2,
            "cpus": 2.0,
            "pids_limit": 50,
            "base_url": "unix:///tmp/docker.sock",
        }
    ]


def test_real_docker_runtime_accepts_the_flags() -> None:
    c = config(["--stdio", "--runtime", "docker", "--docker-image", "img:1", "--docker-memory", "64m"])
    runtime = cli.make_runtime(c)
    assert isinstance(runtime, codemode.DockerRuntime)
    with pytest.raises(ConfigError, match="docker runtime"):
        cli.make_runtime(config(["--stdio", "--runtime", "docker", "--docker-memory", "1k"]))


def test_docker_flags_need_docker_runtime() -> None:
    with pytest.raises(ConfigError, match="need --runtime docker"):
        cli.make_runtime(config(["--stdio", "--docker-image", "img:1"]))


# -------------------------------------------------------------------------------------------- main


def test_main_reports_config_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--stdio", "--pack", RECORDS]) == 2
    err = capsys.readouterr().err
    assert err.startswith("codemode: no authorizer")


def test_main_without_transport(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CODEMODE_TRANSPORT", raising=False)
    assert main(["serve", "--allow-all"]) == 2
    assert "choose a transport" in capsys.readouterr().err


def test_http_without_service(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import codemode.service as service

    monkeypatch.delattr(service, "serve", raising=False)
    assert main(["serve", "--http", "--allow-all"]) == 2
    assert "serve --http is not available" in capsys.readouterr().err


def test_http_overrides() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--http",
            "--host",
            "0.0.0.0",
            "--port",
            "9000",
            "--pack",
            RECORDS,
            "--allow-all",
            "--max-native-calls",
            "3",
            "--disable",
            "b",
        ]
    )
    assert cli.http_overrides(args, {"CODEMODE_DISABLE": "a"}) == {
        "host": "0.0.0.0",
        "port": 9000,
        "packs": [RECORDS],
        "allow_all": True,
        "max_native_calls": 3,
        "disable": ["a", "b"],
    }
    assert cli.http_overrides(build_parser().parse_args(["serve", "--http"]), {}) == {}
    with pytest.raises(ConfigError, match="--subject is for --stdio"):
        cli.http_overrides(build_parser().parse_args(["serve", "--http", "--subject", "x"]), {})


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
    argv = [
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
    assert main(argv) == 0
    (settings,) = seen
    assert settings.port == 9123 and settings.allow_all is True and settings.packs == [RECORDS]
    assert settings.limits.max_execution_time == 2.0
    # the service's own validation reports problems as configuration errors
    assert main(["serve", "--http", "--pack", RECORDS]) == 2
    assert "authorizer" in capsys.readouterr().err


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
    proc = subprocess.run(
        [sys.executable, "-m", "codemode.cli", "serve", "--stdio", "--allow-all", "--pack", RECORDS],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
