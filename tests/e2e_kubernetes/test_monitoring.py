"""k8s/components/monitoring on the real cluster: without the Prometheus Operator's
CRDs the base applies (server-side dry run) and the monitoring overlay is refused for its two kinds
alone; with the two kinds defined (stand-in CRDs of this test, removed after) the overlay applies
too. The rules' meaning is tested by promtool (tests/unit/test_monitoring_rules.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.support.cluster import REPO, kubectl

pytestmark = pytest.mark.kubernetes

GROUP = "monitoring.coreos.com"
#: The operator's two kinds as the API server needs them to accept the objects (names, scope,
#: version), with an open schema: this checks that the component applies, not the operator's schema.
KINDS = {"servicemonitors": "ServiceMonitor", "prometheusrules": "PrometheusRule"}
LABEL = "codemode.io/test-stand-in"


def _crd(plural: str, kind: str) -> str:
    return f"""apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.{GROUP}
  labels:
    {LABEL}: "true"
spec:
  group: {GROUP}
  scope: Namespaced
  names:
    plural: {plural}
    singular: {kind.lower()}
    kind: {kind}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"""


def _ours_only() -> None:
    """The cluster has none of the operator's CRDs but (from an interrupted run) our stand-ins."""
    present = {n for n in kubectl("get", "crd", "-o", "name").split() if n.endswith(f".{GROUP}")}
    ours = set(kubectl("get", "crd", "-l", f"{LABEL}=true", "-o", "name").split())
    if present - ours:
        pytest.skip(f"the cluster has the Prometheus Operator's CRDs: {sorted(present - ours)}")
    kubectl("delete", "crd", "-l", f"{LABEL}=true", "--ignore-not-found", "--wait=true")


@contextlib.contextmanager
def stand_in_crds() -> Iterator[None]:
    kubectl("apply", "-f", "-", stdin="---\n".join(_crd(p, k) for p, k in KINDS.items()))
    try:
        for plural in KINDS:
            kubectl(
                "wait", "--for=condition=Established", f"crd/{plural}.{GROUP}", "--timeout=60s", timeout=90
            )
        yield
    finally:
        kubectl("delete", "crd", "-l", f"{LABEL}=true", "--ignore-not-found", "--wait=true")


def test_the_base_applies_without_the_operator_and_the_component_with_it(cluster: None) -> None:
    _ours_only()
    base = kubectl("apply", "-k", str(REPO / "k8s"), "--dry-run=server")
    assert "deployment.apps/codemode" in base and GROUP not in base, base
    overlay = str(REPO / "k8s" / "overlays" / "monitoring")
    refused = kubectl("apply", "-k", overlay, "--dry-run=server", check=False)
    # Refused either as "no matches for kind ServiceMonitor" or, when kubectl's discovery cache
    # still knows the stand-in CRDs of an earlier run, as NotFound on servicemonitors.<group>.
    said = refused.lower()
    assert "servicemonitor" in said and "prometheusrule" in said, refused
    assert "error" in said or "no matches" in said, refused
    with stand_in_crds():
        applied = kubectl("apply", "-k", overlay, "--dry-run=server")
    assert f"servicemonitor.{GROUP}/codemode" in applied, applied
    assert f"prometheusrule.{GROUP}/codemode" in applied, applied
    assert "deployment.apps/codemode" in applied, applied
    assert not [n for n in kubectl("get", "crd", "-o", "name").split() if n.endswith(f".{GROUP}")]
