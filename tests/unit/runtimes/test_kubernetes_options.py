"""``KubernetesOptions``: the Kubernetes runtime takes its options whole, and the options
check every value when they are made, with one line naming the option (and, through the settings,
its flag and variable)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from codemode.runtimes.base import LimitedLifetime, MemoryLimited, SupervisingRuntime, concurrent_refill
from codemode.runtimes.exhaustion import memory_limited
from codemode.runtimes.kubernetes import DEFAULT_IMAGE, DEFAULT_NAMESPACE, KubernetesRuntime, OptionError
from codemode.runtimes.options import DockerOptions, KubernetesOptions
from codemode.startup.bootstrap import build_runtime
from codemode.startup.config import ConfigError, load_settings


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("CODEMODE_"):
            monkeypatch.delenv(key)


REFUSED: list[tuple[dict[str, Any], str, str]] = [
    ({"namespace": "Workers_1"}, "namespace", "is not a DNS label"),
    ({"namespace": ""}, "namespace", "is not a DNS label"),
    ({"image": " "}, "image", "must not be empty"),
    ({"runtime_class": "g/visor"}, "runtime_class", "is not a valid RuntimeClass name"),
    ({"seccomp_profile": "../etc/profile.json"}, "seccomp_profile", "relative to the kubelet's seccomp root"),
    ({"seccomp_profile": "/abs.json"}, "seccomp_profile", "relative to the kubelet's seccomp root"),
    ({"owner": ""}, "owner", "is not a valid label value"),
    ({"owner": "-x"}, "owner", "is not a valid label value"),
    ({"memory": "0"}, "memory", "is not a positive Kubernetes quantity"),
    ({"memory": "lots"}, "memory", "is not a positive Kubernetes quantity"),
    ({"ephemeral_storage": "-1Mi"}, "ephemeral_storage", "is not a positive Kubernetes quantity"),
    ({"cpu": "0m"}, "cpu", "is not a positive Kubernetes quantity"),
    ({"cpu": "500m", "cpu_request": "1"}, "cpu_request", "exceeds the cpu limit '500m'"),
    ({"spawn_timeout": 0}, "spawn_timeout", "must be positive"),
    ({"probe_timeout": -1.0}, "probe_timeout", "must be positive"),
    ({"api_timeout": math.inf}, "api_timeout", "must be a number of seconds"),
    ({"check_timeout": "5"}, "check_timeout", "must be a number of seconds"),
    ({"node_ack_timeout": 0.0}, "node_ack_timeout", "must be positive"),
    ({"end_timeout": 0}, "end_timeout", "must be positive"),
    ({"exit_wait": -0.1}, "exit_wait", "must be 0 or more"),
    ({"node_quarantine": math.nan}, "node_quarantine", "must be a number of seconds"),
    ({"unschedulable_grace": True}, "unschedulable_grace", "must be a number of seconds"),
    ({"max_lifetime": 0}, "max_lifetime", "must be a positive whole number"),
    ({"max_lifetime": 1.5}, "max_lifetime", "must be a positive whole number"),
    ({"executor_threads": 0}, "executor_threads", "must be a positive whole number"),
    ({"stdout_buffer_bytes": True}, "stdout_buffer_bytes", "must be a positive whole number"),
    ({"cleanup_orphans": "some"}, "cleanup_orphans", "must be 'dead', 'all' or 'none'"),
    ({"image_pull_policy": "Sometimes"}, "image_pull_policy", "must be 'IfNotPresent', 'Always' or 'Never'"),
    ({"entrypoint": []}, "entrypoint", "must be a non-empty list of non-empty strings"),
    ({"supervisor_entrypoint": ["python3", ""]}, "supervisor_entrypoint", "non-empty strings"),
    ({"entrypoint": ["sh"], "testing_entry": True}, "entrypoint", "exclude each other"),
]


@pytest.mark.parametrize(("values", "option", "reason"), REFUSED, ids=[r[1] for r in REFUSED])
def test_a_refused_value_names_its_option_in_one_line(
    values: dict[str, Any], option: str, reason: str
) -> None:
    with pytest.raises(OptionError) as refused:
        KubernetesOptions(**values)
    assert refused.value.option == option
    message = str(refused.value)
    assert message.startswith(option + " ") and reason in message and "\n" not in message


def test_the_defaults_are_the_runtimes_and_pass() -> None:
    options = KubernetesOptions()
    assert (options.namespace, options.image, options.memory, options.cpu, options.cpu_request) == (
        DEFAULT_NAMESPACE,
        DEFAULT_IMAGE,
        "256Mi",
        "1",
        "100m",
    )
    runtime = KubernetesRuntime(options, api=object())
    assert runtime.options is options
    assert KubernetesRuntime(api=object()).options == options  # no options: the defaults


def test_commands_are_frozen_with_the_options() -> None:
    command = ["python3", "-I", "-m", "codemode_worker"]
    options = KubernetesOptions(entrypoint=command)
    command.append("--evil")
    assert options.entrypoint == ("python3", "-I", "-m", "codemode_worker")
    assert KubernetesRuntime(options, api=object()).command == ["python3", "-I", "-m", "codemode_worker"]


def test_the_runtime_declares_its_part_of_the_seam() -> None:
    runtime = KubernetesRuntime(KubernetesOptions(max_lifetime=600), api=object())
    assert isinstance(runtime, LimitedLifetime) and runtime.max_lifetime == 600.0
    assert isinstance(runtime, MemoryLimited) and memory_limited(runtime)
    assert isinstance(runtime, SupervisingRuntime) and concurrent_refill(runtime)


def test_the_runtime_takes_its_options_whole_and_nothing_else() -> None:
    with pytest.raises(TypeError):
        KubernetesRuntime(namespace="workers")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="takes KubernetesOptions, not DockerOptions"):
        KubernetesRuntime(DockerOptions())  # type: ignore[arg-type]


def test_a_refused_setting_names_its_flag_and_variable() -> None:
    with pytest.raises(ConfigError) as refused:  # when the settings are read, or at the latest built
        build_runtime(
            load_settings(transport="stdio", allow_all=True, runtime="kubernetes", kubernetes_memory="0")
        )
    assert str(refused.value) == (
        "--kubernetes-memory / CODEMODE_KUBERNETES_MEMORY: memory '0' is not a positive Kubernetes quantity"
    )


def test_the_settings_set_only_what_an_operator_may(tmp_path: Path) -> None:
    settings = load_settings(
        transport="stdio",
        allow_all=True,
        runtime="kubernetes",
        kubernetes_namespace="ns1",
        kubernetes_cpu="2",
    )
    assert settings.runtime_options == KubernetesOptions(namespace="ns1", cpu="2")
    runtime: Any = build_runtime(settings, cleanup_orphans="none")
    assert (runtime.options.namespace, runtime.options.cpu, runtime.cleanup_orphans) == ("ns1", "2", "none")
    file = tmp_path / "codemode.toml"
    file.write_text('runtime = "kubernetes"\n[kubernetes]\nspawn_timeout = 5\n')
    with pytest.raises(ConfigError, match=r"unknown setting 'spawn_timeout' in \[kubernetes\]"):
        load_settings(config_file=file, transport="stdio", allow_all=True)
