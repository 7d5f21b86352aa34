"""k8s/components/monitoring names only what the service exports: every alert
expression and every dashboard query selects metrics a running service has, with labels they have
(and, for the labels whose values the code fixes, values it emits). The families and their labels
are read off a real uvicorn server's ``/metrics`` after a few executes, and off that server's own
registry for the labelled families that have no sample yet; none is listed by hand."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import httpx
import promql_parser
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from codemode.common.errors import LIMIT_KINDS
from codemode.execution.causes import WAITING_FOR_SLOT, WAITING_FOR_WORKER
from codemode.execution.observe import ApprovalAnswer, CallDecision, ExecuteOutcome
from tests.support.service import execute, http_get, service, settings, write_token_file

pytestmark = [pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[3]
MONITORING = REPO / "k8s" / "components" / "monitoring"
#: Labels Prometheus adds to every scraped series (the ServiceMonitor's target labels).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}
#: The label values the code fixes, per label name.
VALUES = {
    "outcome": set(get_args(ExecuteOutcome)),
    "kind": {k.replace(" ", "_") for k in LIMIT_KINDS} | {WAITING_FOR_SLOT, WAITING_FOR_WORKER},
    "warm": {"true", "false"},
    "answer": set(get_args(ApprovalAnswer)) - {""},
    "decision": set(get_args(CallDecision)),
}
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created")}


@dataclass
class Exported:
    """Sample name → the label names its series have."""

    labels: dict[str, set[str]] = field(default_factory=dict)
    families: set[str] = field(default_factory=set)

    def add(self, family: str, kind: str, names: set[str]) -> None:
        self.families.add(family)
        for suffix in SUFFIXES.get(kind, ("",)):
            extra = {"le"} if suffix == "_bucket" else set()
            self.labels.setdefault(family + suffix, set()).update(names | extra)


async def _exported(tmp_path: Path) -> Exported:
    tokens = write_token_file(tmp_path, ["alice", "bob"])
    app_settings = settings(token_file=tokens.path, pool=1, max_execution_steps=2000)
    async with service(app_settings) as srv:
        ok = await execute(srv.mcp_url, tokens["alice"], "def main():\n    return 1\n")
        assert ok == {"result": 1}, ok
        bad = await execute(srv.mcp_url, tokens["bob"], "def main(:\n")
        assert bad[0] == "error" and bad[1].startswith("invalid program"), bad
        loop = "def main():\n    n = 0\n    for i in range(100000):\n        n += i\n    return n\n"
        limited = await execute(srv.mcp_url, tokens["alice"], loop)
        assert limited == ("error", "resource limit exceeded: steps"), limited
        async with httpx.AsyncClient(timeout=15) as client:  # a refusal before authentication
            refused = await client.post(srv.mcp_url, headers={"Authorization": "Bearer wrong"}, json={})
        assert refused.status_code == 401
        text = (await http_get(srv.metrics_url)).text
        values = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }
        # The gauges are the server's own slots; each of the 3 executes took one worker of the pool.
        assert values[("codemode_execution_slots", ())] == app_settings.max_concurrent_executions
        assert (
            values[("codemode_execution_slots_held", ())]
            == values[("codemode_execution_slot_waiters", ())]
            == 0
        )
        handed = [values[("codemode_pool_handouts_total", (("warm", w),))] for w in ("true", "false")]
        assert sum(handed) == 3, handed
        assert values[("codemode_execute_limits_total", (("kind", "steps"),))] == 1
        out = Exported()
        for family in text_string_to_metric_families(text):
            names = set().union(*(set(s.labels) for s in family.samples)) if family.samples else set()
            out.add(family.name, family.type, names)
        # A labelled family with no sample yet (no upstream restarted) shows its name but not its
        # labels in the text: take those from the very objects the service registered.
        for metric in vars(srv.service.metrics).values():
            if isinstance(metric, MetricWrapperBase):
                name = metric._name
                assert name is not None and name in out.families, f"{name} registered but not on /metrics"
                assert metric._type is not None
                out.add(name, metric._type, set(metric._labelnames))
        assert out.labels["codemode_executes_total"] >= {"outcome"}
        return out


@dataclass
class Use:
    """What one expression selects: (metric, label names, {label: equality values}) per selector,
    and the label names its aggregations and vector matches name (with the metrics beneath)."""

    selectors: list[tuple[str, set[str], dict[str, str]]] = field(default_factory=list)
    groupings: list[tuple[set[str], set[str]]] = field(default_factory=list)


def _walk(node: Any, use: Use) -> set[str]:
    """Collect ``node``'s selectors and groupings; return the metric names beneath it."""
    kind = type(node).__name__
    if kind == "VectorSelector":
        matchers = node.matchers.matchers
        labels = {m.name for m in matchers}
        equal = {m.name: m.value for m in matchers if str(m.op).endswith("Equal")}
        use.selectors.append((node.name, labels, equal))
        return {node.name}
    if kind == "MatrixSelector":
        return _walk(node.vector_selector, use)
    below: set[str] = set()
    for child in ("expr", "lhs", "rhs", "param"):
        value = getattr(node, child, None)
        if value is not None and type(value).__module__ == "promql_parser":
            below |= _walk(value, use)
    for arg in getattr(node, "args", None) or []:
        below |= _walk(arg, use)
    modifier = getattr(node, "modifier", None)
    if modifier is not None:
        labels = set(getattr(modifier, "labels", None) or [])
        matching = getattr(modifier, "matching", None)
        if matching is not None:
            labels |= set(matching.labels or [])
        labels |= set(getattr(modifier, "group_labels", None) or [])
        if labels:
            use.groupings.append((labels, below))
    return below


def _problems(where: str, expr: str, exported: Exported) -> list[str]:
    use = Use()
    _walk(promql_parser.parse(expr), use)
    out = []
    assert use.selectors, f"{where}: selects no metric: {expr}"
    for name, labels, equal in use.selectors:
        if name not in exported.labels:
            out.append(f"{where}: {name} is not exported")
            continue
        unknown = labels - exported.labels[name] - TARGET_LABELS
        if unknown:
            out.append(f"{where}: {name} has no label {sorted(unknown)}")
        for label, value in equal.items():
            if label in VALUES and value not in VALUES[label]:
                out.append(f"{where}: {name}{{{label}={value!r}}}: the service never sets that value")
    for labels, below in use.groupings:
        known = set().union(*(exported.labels.get(n, set()) for n in below)) | TARGET_LABELS
        if labels - known:
            out.append(f"{where}: groups by {sorted(labels - known)}, which {sorted(below)} lack")
    return out


def _dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((f"dashboard panel {panel['title']!r} {target['refId']}", target["expr"]))
    return out


def _grafana_to_promql(expr: str) -> str:
    """Grafana's variables as values PromQL parses (a range, the job regex)."""
    return expr.replace("$__rate_interval", "5m").replace("$job", ".*")


async def test_alerts_and_dashboard_name_only_exported_metrics_with_their_labels(tmp_path: Path) -> None:
    exported = await _exported(tmp_path)
    rules = yaml.safe_load((MONITORING / "codemode.rules.yml").read_text(encoding="utf-8"))
    problems: list[str] = []
    alerts = [r for g in rules["groups"] for r in g["rules"]]
    assert len(alerts) >= 7
    for rule in alerts:
        problems += _problems(f"alert {rule['alert']}", rule["expr"], exported)
    queries = _dashboard_queries()
    assert len(queries) >= 10
    for where, expr in queries:
        problems += _problems(where, _grafana_to_promql(expr), exported)
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            match = re.fullmatch(r"label_values\((\w+), (\w+)\)", query["query"])
            assert match, query
            metric, label = match.groups()
            if metric not in exported.labels or label not in exported.labels[metric] | TARGET_LABELS:
                problems.append(f"dashboard variable {variable['name']}: {metric} / {label} not exported")
    assert not problems, "\n".join(problems)
    # docs/service.md's table lists every family the service exports.
    page = (REPO / "docs" / "service.md").read_text(encoding="utf-8")
    created = {f for f in exported.families if f.endswith("_created")}  # a counter's start time
    missing = [f for f in sorted(exported.families - created) if f"`{f}" not in page]
    assert not missing, f"docs/service.md lacks {missing}"


def test_the_check_catches_a_wrong_name_label_and_value() -> None:
    """The checker itself: a misspelt metric, a label the metric lacks, a value never set."""
    exported = Exported()
    exported.add("codemode_executes", "counter", {"outcome"})
    assert _problems("q", 'sum(rate(codemode_executes_total{outcome="internal"}[5m]))', exported) == []
    assert _problems("q", "rate(codemode_execute_total[5m])", exported)
    assert _problems("q", 'rate(codemode_executes_total{kind="x"}[5m])', exported)
    assert _problems("q", 'rate(codemode_executes_total{outcome="exploded"}[5m])', exported)
    assert _problems("q", "sum by (subject) (rate(codemode_executes_total[5m]))", exported)
    assert _problems("q", "sum by (job) (rate(codemode_executes_total[5m]))", exported) == []
