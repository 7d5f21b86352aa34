"""The project's habits hold: the pre-commit hooks run what ``make lint`` runs, the dev environment is
pinned (constraints.txt, used by ``make``), the complexity gate is on for the shipped code, and an
optional extra that is missing fails with one line naming it."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: The extras one deployment may leave out, and what ``make`` installs besides them.
OPTIONAL = ("kubernetes", "tracing")


def _recipe(target: str) -> list[list[str]]:
    """The commands of a Makefile target, ``$(BIN)`` spelled out."""
    text = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+) :?= (.*)$", text, flags=re.M))
    block = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, flags=re.M)
    assert block is not None, f"no {target} target in the Makefile"
    commands = []
    for line in block.group(1).splitlines():
        line = line.strip()
        for _ in range(3):  # $(BIN) is $(VENV)/bin
            line = re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], line)
        command = shlex.split(line.lstrip("@"), comments=True)
        if command:
            commands.append(command)
    return commands


def test_the_pre_commit_hooks_run_what_make_lint_runs() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert all(repo["repo"] == "local" for repo in config["repos"])  # the venv's pinned tools, offline
    assert all(hook["language"] == "system" and hook["pass_filenames"] is False for hook in hooks)
    commands = [shlex.split(hook["entry"]) + list(hook.get("args", [])) for hook in hooks]
    assert commands == _recipe("lint")


def test_every_declared_dependency_is_pinned_in_constraints() -> None:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = version
    declared = list(PYPROJECT["project"]["dependencies"])
    for extra in ("dev", *OPTIONAL):
        declared += PYPROJECT["project"]["optional-dependencies"][extra]
    for spec in declared:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject's {requirement.specifier}"
        )


def test_make_installs_every_extra_under_the_constraints() -> None:
    install = next(c for c in _recipe("$(STAMP)") if c[1:3] == ["install", "-q"])
    assert install[install.index("-c") + 1] == "constraints.txt"
    target = install[install.index("-e") + 1]
    extras = set(re.fullmatch(r"\.\[(.*)\]", target).group(1).split(","))  # type: ignore[union-attr]
    assert extras == set(PYPROJECT["project"]["optional-dependencies"])


def test_the_optional_clients_are_extras_not_dependencies() -> None:
    names = {canonicalize_name(Requirement(s).name) for s in PYPROJECT["project"]["dependencies"]}
    assert "kubernetes" not in names
    assert not [n for n in names if n.startswith("opentelemetry")]


def test_the_service_image_installs_the_extras_it_needs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert '"/src[kubernetes,tracing]"' in dockerfile
    provision = (ROOT / "scripts" / "provision-kubernetes.sh").read_text()
    assert '"$REPO[kubernetes,tracing]"' in provision


def test_the_complexity_gate_covers_the_shipped_code() -> None:
    lint = PYPROJECT["tool"]["ruff"]["lint"]
    assert "C90" in lint["select"]
    assert isinstance(lint["mccabe"]["max-complexity"], int)
    for root in ("host", "worker_image", "capabilities"):
        assert not [g for g in lint.get("per-file-ignores", {}) if g.startswith(root)]


#: Each way into an optional client, with the module made missing and the one line that names it.
MISSING = {
    "kubernetes runtime": (
        "kubernetes",
        ["serve", "--stdio", "--allow-all", "--runtime", "kubernetes"],
        "codemode: --runtime / CODEMODE_RUNTIME: the Kubernetes runtime needs the 'kubernetes' extra: "
        "pip install 'codemode[kubernetes]'",
    ),
    "kubernetes quota store": (
        "kubernetes",
        ["serve", "--stdio", "--allow-all", "--quota-store", "kubernetes", "--quota-namespace", "q"],
        "codemode: --quota-store / CODEMODE_QUOTA_STORE: the Kubernetes quota store needs the "
        "'kubernetes' extra: pip install 'codemode[kubernetes]'",
    ),
    "tracing": (
        "opentelemetry",
        ["serve", "--stdio", "--allow-all", "--trace-endpoint", "http://127.0.0.1:9/v1/traces"],
        "codemode: --trace-endpoint / CODEMODE_TRACE_ENDPOINT: tracing needs the 'tracing' extra: "
        "pip install 'codemode[tracing]'",
    ),
}


@pytest.mark.parametrize("case", sorted(MISSING))
def test_a_missing_extra_fails_with_one_line_naming_it(case: str, tmp_path: Path) -> None:
    module, argv, expected = MISSING[case]
    script = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "from codemode.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("codemode:")]
    assert errors == [expected]


def test_the_python_api_names_the_kubernetes_extra(tmp_path: Path) -> None:
    script = (
        "import sys; sys.modules['kubernetes'] = None\n"
        "import codemode\n"
        "try:\n"
        "    codemode.KubernetesRuntime\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.stdout == (
        "the Kubernetes runtime needs the 'kubernetes' extra: pip install 'codemode[kubernetes]'\n"
    ), done.stderr
