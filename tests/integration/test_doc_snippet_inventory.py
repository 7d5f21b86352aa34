"""Every README/docs snippet meant to run runs as written, and the suite says how many.

The inventory reads every fenced block of README.md, CONTRIBUTING.md and docs/. A ``python``,
``sh`` or ``toml`` block is *runnable*: it must be claimed in :data:`RUN_BY` by the test that runs it
as written (a test of this file, another test of the suite, or ``.ci/run`` for the provisioning
commands CI runs before the suite), unless an HTML comment on the line before its fence marks it:

* ``<!-- snippet: template: <reason> -->``: it needs what CI lacks, and the reason says which:
  ``internet``, ``secret`` or ``placeholder`` (a value the reader fills in);
* ``<!-- snippet: fragment -->``: an excerpt for reading (a protocol's shape), not a program; a
  python fragment must still compile.

Other blocks (``json``, ``rego``, plain text: outputs, data, messages) are shown, not run. The
summary line (``doc snippets: ...``) is printed at the end of the run. CONTRIBUTING.md documents
the markers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import codemode
from codemode import authz
from codemode.startup.config import load_settings
from tests.support.mcp_client import child_env, cli_command

ROOT = Path(__file__).resolve().parents[2]
THIS = "tests/integration/test_doc_snippet_inventory.py"
FASTAPI_EXAMPLE = (
    "tests/integration/capabilities/test_openapi_fastapi.py::"
    "test_the_packs_page_fastapi_example_runs_as_written"
)
RUNNABLE = ("python", "sh", "toml")
TEMPLATE_REASONS = ("internet", "secret", "placeholder")
_FENCE = re.compile(r"^```(\S*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
_MARK = re.compile(r"<!--\s*snippet:\s*(template|fragment)\s*(?::\s*(.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    text: str
    mark: str | None  # "template" / "fragment" / None
    reason: str

    def __str__(self) -> str:
        first = self.text.splitlines()[0] if self.text else ""
        return f"{self.page}:{self.line}: {first[:70]}"


def pages() -> list[str]:
    docs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
    return ["README.md", "CONTRIBUTING.md", *docs]


def blocks() -> list[Block]:
    out = []
    for page in pages():
        text = (ROOT / page).read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            before = [line for line in text[: m.start()].splitlines() if line.strip()]
            mark = _MARK.search(before[-1]) if before else None
            out.append(
                Block(
                    page, text[: m.start()].count("\n") + 1, m.group(1), m.group(2),
                    mark.group(1) if mark else None, (mark.group(2) or "") if mark else "",
                )
            )  # fmt: skip
    return out


def block(page: str, needle: str) -> Block:
    (found,) = [b for b in blocks() if b.page == page and needle in b.text]
    return found


SERVICE_PAGE_TEST = (
    "tests/integration/test_doc_snippets.py::test_service_page_builds_the_app_and_its_server_configuration"
)

MONITORING_TEST = (
    "tests/e2e_kubernetes/test_monitoring.py::"
    "test_the_base_applies_without_the_operator_and_the_component_with_it"
)

#: (page, a string of the block) -> where it runs as written: "path::test" or ".ci/run".
RUN_BY: dict[tuple[str, str], str] = {
    (
        "README.md",
        "make run     #",
    ): "tests/integration/test_readme_run.py::test_make_run_speaks_only_mcp_on_stdout",
    (
        "README.md",
        "@pack.capability(",
    ): "tests/integration/test_readme_snippet.py::test_library_snippet_runs_as_written",
    (
        "README.md",
        "codemode token new alice",
    ): "tests/integration/test_readme_client.py::test_readme_token_serve_and_client",
    (
        "README.md",
        "streamable_http_client",
    ): "tests/integration/test_readme_client.py::test_readme_token_serve_and_client",
    (
        "CONTRIBUTING.md",
        "make run      #",
    ): "tests/integration/test_readme_run.py::test_make_run_speaks_only_mcp_on_stdout",
    (
        "CONTRIBUTING.md",
        "# weather.py",
    ): "tests/integration/test_contributing_pack.py::test_pack_example_loads_and_runs",
    ("docs/authz.md", "RegoAuthorizer("): f"{THIS}::test_authz_page_builds_its_authorizer",
    ("docs/configuration.md", 'runtime = "docker"'): f"{THIS}::test_settings_files_load",
    (
        "docs/configuration.md",
        "codemode token revoke alice",
    ): f"{THIS}::test_configuration_page_token_commands",
    ("docs/configuration.md", 'store = "sqlite"'): f"{THIS}::test_settings_files_load",
    ("docs/docker.md", "docker build -t codemode-worker:1 worker_image"): ".ci/run",
    ("docs/docker.md", "sudo scripts/provision-docker.sh"): ".ci/run",
    ("docs/docker.md", "--reuse-executes 100"): f"{THIS}::test_settings_files_load",
    ("docs/kubernetes.md", "sudo bash scripts/provision-kubernetes.sh          #"): ".ci/run",
    (
        "docs/mcp.md",
        "make run    #",
    ): "tests/integration/test_readme_run.py::test_make_run_speaks_only_mcp_on_stdout",
    (
        "docs/mcp.md",
        "create_server(server, StaticSubject",
    ): "tests/integration/test_doc_snippets.py::test_mcp_page_builds_the_mcp_server",
    (
        "docs/operators.md",
        "codemode image audit codemode-worker:1",
    ): "tests/integration/ops/test_operator_docker.py::test_audit_worker_image_passes",
    (
        "docs/operators.md",
        "codemode quotas tune --program job.star",
    ): "tests/integration/ops/test_operator_process.py::test_quotas_tune_measures_process_workers",
    (
        "docs/operators.md",
        "codemode bench ",
    ): "tests/integration/ops/test_operator_rules.py::test_bench_process_runtime",
    ("docs/operators.md", "kubectl apply -k k8s/overlays/monitoring"): MONITORING_TEST,
    ("docs/packs.md", "args: AddIn) -> Notes"): f"{THIS}::test_packs_page_first_pack_is_the_example",
    ("docs/packs.md", "# upstreams.toml"): f"{THIS}::test_packs_page_upstreams_file_serves",
    (
        "docs/packs.md",
        "from codemode_capabilities.state import pack",
    ): f"{THIS}::test_packs_page_state_pack_runs",
    ("docs/packs.md", "--config upstreams.toml"): f"{THIS}::test_packs_page_upstreams_file_serves",
    (
        "docs/kubernetes.md",
        "kubectl apply -k k8s/ ",
    ): "tests/e2e_kubernetes/test_deployment.py::test_k8s_applies_cleanly_as_shipped",
    ("docs/kubernetes.md", "provision-kubernetes.sh up-node 2"): ".ci/run",
    (
        "docs/packs.md",
        'add_pack("./examples/notes_pack.py:pack")',
    ): "tests/integration/test_doc_snippets.py::test_packs_page_from_python",
    (
        "docs/packs.md",
        "codemode serve --stdio --allow-all --pack ./examples/notes_pack.py:pack",
    ): f"{THIS}::test_packs_page_serves_the_notes_pack",
    (
        "docs/packs.md",
        "def add(text: str, owner: Subject)",
    ): "tests/integration/test_doc_snippets.py::test_packs_page_short_form_runs_as_a_script",
    (
        "docs/packs.md",
        "class VisitsPack",
    ): "tests/integration/test_doc_snippets.py::test_packs_page_lifecycle_pack_runs_as_a_script",
    (
        "docs/packs.md",
        "# todo_api.py",
    ): FASTAPI_EXAMPLE,
    (
        "docs/packs.md",
        "# todo.toml",
    ): FASTAPI_EXAMPLE,
    ("docs/reference/program.md", "attempt(records.delete, id=7)"): f"{THIS}::test_program_page_attempt_runs",
    ("docs/reference/program.md", "rs = parallel([(records.get"): f"{THIS}::test_program_page_parallel_runs",
    (
        "docs/reference/python-api.md",
        "disabled=[",
    ): "tests/integration/test_doc_snippets.py::test_python_api_page_builds_and_uses_a_server_as_a_script",
    (
        "docs/reference/python-api.md",
        "max_print_bytes=1024",
    ): "tests/integration/execution/test_outcomes.py::test_the_python_api_example_runs",
    (
        "docs/service.md",
        "--token-file tokens.txt",
    ): SERVICE_PAGE_TEST,
    (
        "docs/service.md",
        "server_config(app)",
    ): SERVICE_PAGE_TEST,
    (
        "docs/service.md",
        "inspector@",
    ): "tests/integration/service/test_inspector_http.py::test_inspector_lists_tools_over_http_with_a_token",
    ("docs/service.md", "port = 8000"): f"{THIS}::test_settings_files_load",
    ("docs/service.md", 'quota_store = "kubernetes"'): f"{THIS}::test_settings_files_load",
    (
        "docs/service.md",
        "docker build -t codemode-service:0.1 .",
    ): "tests/integration/service/test_service_image.py::"
    "test_the_service_image_serves_a_rego_authorized_execute",
    (
        "docs/tracing.md",
        "codemode.Tracing(provider",
    ): "tests/integration/test_doc_snippets.py::test_tracing_page_traces_an_execute",
}


#: Runnable blocks the suite does not run, and why (they are counted as not run).
KNOWN_GAPS: dict[tuple[str, str], str] = {
    ("docs/docker.md", "tests.benchmarks.bench_docker"): "a benchmark (minutes of Docker time): run by hand",
}


def _gap(b: Block) -> bool:
    return any(page == b.page and needle in b.text for page, needle in KNOWN_GAPS)


def _claims(b: Block) -> list[str]:
    return [runner for (page, needle), runner in RUN_BY.items() if page == b.page and needle in b.text]


def test_every_runnable_snippet_is_run_or_marked() -> None:
    runnable = [b for b in blocks() if b.lang in RUNNABLE]
    unclaimed = [str(b) for b in runnable if b.mark is None and not _gap(b) and len(_claims(b)) != 1]
    assert unclaimed == [], "run it in a test and list it in RUN_BY, or mark it (see the module docstring)"
    templates = [b for b in runnable if b.mark == "template"]
    bad = [str(b) for b in templates if not any(word in b.reason for word in TEMPLATE_REASONS)]
    assert bad == [], f"a template's reason names what CI lacks: {TEMPLATE_REASONS}"
    for b in runnable:
        if b.mark == "fragment" and b.lang == "python":
            compile(b.text, str(b), "exec", dont_inherit=True)
    meant = [b for b in runnable if b.mark is None]
    run = [b for b in meant if not _gap(b)]
    print(
        f"\ndoc snippets: {len(run)} of {len(meant)} runnable snippets run as written "
        f"({len(templates)} templates, {sum(b.mark == 'fragment' for b in runnable)} fragments, "
        f"{len(blocks()) - len(runnable)} outputs and data shown, not run); not run: "
        + ("; ".join(f"{page} {needle!r}: {why}" for (page, needle), why in KNOWN_GAPS.items()) or "none")
    )


def test_every_claim_names_a_real_test() -> None:
    # (a claim whose block is gone claims nothing; a block it was meant for is then unclaimed, which
    # the test above reports)
    for runner in RUN_BY.values():
        if runner == ".ci/run":
            script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
            assert any(word in script for word in ("provision-docker.sh", "provision-kubernetes.sh")), runner
            continue
        path, test = runner.split("::")
        assert re.search(rf"^(async )?def {test}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), runner


def test_the_markers_are_documented() -> None:
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert "<!-- snippet: template: " in contributing and "<!-- snippet: fragment -->" in contributing


# ------------------------------------------------------------------------ the runners of this file


def _run_python(source: str, cwd: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", source], cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


@pytest.mark.timeout(120)
def test_authz_page_builds_its_authorizer(tmp_path: Path) -> None:
    source = block("docs/authz.md", "RegoAuthorizer(").text
    probe = (
        "\nfrom codemode.authz import AuthorizationInput, Subject\n"
        "print(authorizer.decide(AuthorizationInput(Subject('alice'), 'x.y', 'x.get', {})),\n"
        "      authorizer.decide(AuthorizationInput(Subject('bob'), 'e', 'records.lookup',\n"
        "                                           {'key': 'secret/x'})))\n"
    )
    assert _run_python(source + probe, tmp_path) == ["True False"]


def test_settings_files_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings files of the pages load as settings (every key known, every value valid)."""
    for key in [k for k in __import__("os").environ if k.startswith("CODEMODE_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    for page, needle in [k for k, v in RUN_BY.items() if v == f"{THIS}::test_settings_files_load"]:
        path = tmp_path / "codemode.toml"
        text = block(page, needle).text
        path.write_text(text, encoding="utf-8")
        # the files a table names, beside it (its relative paths are relative to the file)
        (tmp_path / "policy.rego").write_text((ROOT / "examples" / "policy.rego").read_text())
        flags = {} if "rego_policy" in text else {"allow_all": True}
        load_settings(config_file=path, transport="http", **flags)


@pytest.mark.timeout(120)
def test_configuration_page_token_commands(tmp_path: Path) -> None:
    env = child_env(XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"))
    outputs = []
    for line in block("docs/configuration.md", "codemode token revoke alice").text.splitlines():
        argv = line.split("#")[0].split()
        assert argv[0] == "codemode"
        proc = subprocess.run(cli_command(*argv[1:]), env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
    made, listed, _ = outputs
    assert made.strip() and made.strip() not in listed and "alice" in listed


def test_packs_page_first_pack_is_the_example() -> None:
    """The page says the block is examples/notes_pack.py (which tests/unit/packs/test_registry.py runs)."""
    example = (ROOT / "examples" / "notes_pack.py").read_text(encoding="utf-8")
    assert block("docs/packs.md", "args: AddIn) -> Notes").text.strip() in example


@pytest.mark.timeout(120)
def test_packs_page_state_pack_runs(tmp_path: Path) -> None:
    """The state pack from Python: 'It prints 1, 2 and 1'."""
    found = [
        b
        for b in blocks()
        if b.page == "docs/packs.md" and "from codemode_capabilities.state import" in b.text
    ]
    if not found:
        pytest.skip("docs/packs.md has no state pack script")
    assert _run_python(found[0].text, tmp_path) == ["1", "2", "1"]


@pytest.mark.timeout(120)
def test_packs_page_upstreams_file_serves(tmp_path: Path) -> None:
    (tmp_path / "upstreams.toml").write_text(
        block("docs/packs.md", "# upstreams.toml").text, encoding="utf-8"
    )
    argv = block("docs/packs.md", "--config upstreams.toml").text.split()
    proc = subprocess.run(
        cli_command(*argv[1:]),
        cwd=tmp_path,
        env=child_env(),
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "codemode: serving 2 capabilities over stdio: time (2)" in proc.stderr.splitlines()


@pytest.mark.timeout(120)
def test_packs_page_serves_the_notes_pack() -> None:
    (line,) = block("docs/packs.md", "--pack ./examples/notes_pack.py:pack").text.splitlines()
    argv = line.split()
    proc = subprocess.run(
        cli_command(*argv[1:]),
        cwd=ROOT,
        env=child_env(),
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "serving 1 capability over stdio: notes (1)" in proc.stderr


async def test_program_page_attempt_runs(tmp_path: Path) -> None:
    from codemode.packs import PackSettings
    from codemode_capabilities.records import pack

    source = block("docs/reference/program.md", "attempt(records.delete, id=7)").text
    builder = codemode.Builder(authorizer=authz.allow_all())
    builder.register(
        *pack.capabilities(PackSettings(environ={"CODEMODE_RECORDS_DB": str(tmp_path / "r.db")}))
    )
    async with builder.build() as server:
        value = await server.execute(source, subject=authz.Subject("alice"))
    assert value == {"kept": 7, "why": "capability failed: record 7 not found"}, json.dumps(value)


async def test_program_page_parallel_runs(tmp_path: Path) -> None:
    from codemode.packs import PackSettings
    from codemode_capabilities.records import pack

    source = block("docs/reference/program.md", "rs = parallel([(records.get").text
    builder = codemode.Builder(authorizer=authz.allow_all())
    builder.register(
        *pack.capabilities(PackSettings(environ={"CODEMODE_RECORDS_DB": str(tmp_path / "r.db")}))
    )
    async with builder.build() as server:
        value = await server.execute(source, subject=authz.Subject("alice"))
    assert value == ["first", "capability failed: record 999 not found"], json.dumps(value)
