"""k8s/components/monitoring: the alerting rules pass ``promtool test rules`` on
synthetic series (each alert firing and not firing), the PrometheusRule is the plain rules file's
groups unchanged, each alert has its runbook paragraph in docs/operators.md, and the ServiceMonitor
selects the base's metrics Service. Whether their queries name exported metrics is
tests/integration/service/test_monitoring_metrics.py; whether they apply,
tests/e2e_kubernetes/test_monitoring.py."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.environment import unavailable

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "k8s" / "components" / "monitoring"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _alerts() -> list[dict[str, Any]]:
    return [r for g in _yaml(MONITORING / "codemode.rules.yml")["groups"] for r in g["rules"]]


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        unavailable("promtool", "not on PATH (Debian: apt-get install prometheus; .ci/run installs it)")
    return found


def test_promtool_checks_and_tests_the_rules() -> None:
    promtool = _promtool()
    check = subprocess.run(
        [promtool, "check", "rules", "codemode.rules.yml"], cwd=MONITORING, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", "codemode.rules.test.yml"], cwd=MONITORING, capture_output=True, text=True
    )
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    cases = _yaml(MONITORING / "codemode.rules.test.yml")["tests"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert fired == names and quiet == names, (names - fired, names - quiet)


def test_promtool_test_fails_when_an_alert_is_wrong(tmp_path: Path) -> None:
    """The synthetic series really decide: a threshold raised tenfold fails the test."""
    promtool = _promtool()
    for name in ("codemode.rules.yml", "codemode.rules.test.yml"):
        shutil.copy(MONITORING / name, tmp_path / name)
    rules = tmp_path / "codemode.rules.yml"
    rules.write_text(rules.read_text(encoding="utf-8").replace(") > 0.05", ") > 0.5"), encoding="utf-8")
    tested = subprocess.run(
        [promtool, "test", "rules", "codemode.rules.test.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    output = tested.stdout + tested.stderr
    assert tested.returncode != 0 and "CodemodeExecutesFailingInternal" in output, output


def test_the_prometheusrule_carries_the_rules_file() -> None:
    """One source of truth: prometheusrule.yaml is scripts/render_prometheusrule.py's output."""
    spec = importlib.util.spec_from_file_location(
        "render_prometheusrule", REPO / "scripts" / "render_prometheusrule.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rendered = module.render((MONITORING / "codemode.rules.yml").read_text(encoding="utf-8"))
    shipped = (MONITORING / "prometheusrule.yaml").read_text(encoding="utf-8")
    assert shipped == rendered, "prometheusrule.yaml is stale: python scripts/render_prometheusrule.py"
    rule = _yaml(MONITORING / "prometheusrule.yaml")
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == _yaml(MONITORING / "codemode.rules.yml")["groups"]


def test_every_alert_has_a_runbook_paragraph() -> None:
    page = (REPO / "docs" / "operators.md").read_text(encoding="utf-8")
    for alert in _alerts():
        name = alert["alert"]
        assert alert["annotations"]["runbook"] == f"docs/operators.md#{name.lower()}", name
        match = re.search(rf"^#### {name}\n\n(.+?)(?=^#)", page, re.M | re.S)
        assert match, f"docs/operators.md has no '#### {name}' section"
        assert len(match.group(1).split()) >= 40, f"{name}: the runbook paragraph is too short"
    for doc in ("README.md", "docs/kubernetes.md"):
        assert "operators.md#alerts" in (REPO / doc).read_text(encoding="utf-8"), doc


def test_the_servicemonitor_selects_the_metrics_service_and_stays_out_of_the_base() -> None:
    monitor = _yaml(MONITORING / "servicemonitor.yaml")
    service = _yaml(REPO / "k8s" / "base" / "metrics-service.yaml")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    component = _yaml(MONITORING / "kustomization.yaml")
    assert component["kind"] == "Component"
    assert sorted(component["resources"]) == ["prometheusrule.yaml", "servicemonitor.yaml"]
    for path in (REPO / "k8s" / "base").glob("*.yaml"):
        assert "monitoring.coreos.com" not in path.read_text(encoding="utf-8"), path


@pytest.mark.parametrize("name", ["codemode.rules.yml", "codemode.rules.test.yml", "servicemonitor.yaml"])
def test_the_files_are_yaml(name: str) -> None:
    assert isinstance(_yaml(MONITORING / name), dict)
