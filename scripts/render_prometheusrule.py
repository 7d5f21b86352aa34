"""Write k8s/components/monitoring/prometheusrule.yaml from codemode.rules.yml beside it.

The plain rules file is the source of truth; the PrometheusRule carries its groups unchanged for
the Prometheus Operator. Run after editing the rules (tests/unit/test_monitoring_rules.py fails
until the two agree):

    python scripts/render_prometheusrule.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parents[1] / "k8s" / "components" / "monitoring"
RULES = HERE / "codemode.rules.yml"
OUTPUT = HERE / "prometheusrule.yaml"

HEADER = """\
# GENERATED from codemode.rules.yml by scripts/render_prometheusrule.py: edit the rules there.
# The Prometheus Operator's form of the same alerts (docs/operators.md, "Alerts"). The label
# release/prometheus selectors vary per installation: add the one your Prometheus selects
# (ruleSelector) in an overlay.
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the expressions) as literal blocks, as in the rules file."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render(rules_text: str) -> str:
    """The PrometheusRule manifest carrying the rules file's groups.

    Args:
        rules_text: the plain rules file.

    Returns:
        The manifest's YAML text.
    """
    groups: Any = yaml.safe_load(rules_text)["groups"]
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "codemode",
            "namespace": "codemode",
            "labels": {"app.kubernetes.io/name": "codemode", "app.kubernetes.io/part-of": "codemode"},
        },
        "spec": {"groups": groups},
    }
    return HEADER + yaml.dump(manifest, Dumper=_Dumper, sort_keys=False, width=100)


def main() -> int:
    """Write the manifest."""
    OUTPUT.write_text(render(RULES.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {OUTPUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
