"""Traces end to end: ``serve --http`` with ``trace_endpoint`` exports over OTLP/HTTP to a
real Jaeger the suite starts, and Jaeger's query API returns the execute's spans in a trace of the
host's own, linked (``FOLLOWS_FROM``) to the span the official MCP client named in ``_meta``."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from codemode.execution.tracing import subject_hash
from tests.support.jaeger import running_jaeger
from tests.support.mcp_client import trace_meta
from tests.support.service import RECORDS_SPEC, mcp_client, service, settings, write_token_file

# The first run builds Jaeger from source (about 5.5 minutes on 2 cores) inside the test's time.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span["tags"]}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_execute_spans_reach_jaeger_linked_to_the_clients_span(tmp_path: Path, mode: str) -> None:
    tokens = write_token_file(tmp_path, ["tenant-a"])
    name = f"codemode-e2e-{secrets.token_hex(4)}"
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    with running_jaeger(tmp_path) as jaeger:
        app_settings = settings(
            packs=[RECORDS_SPEC],
            token_file=tokens.path,
            trace_endpoint=jaeger.traces_endpoint,
            trace_service_name=name,
        )
        async with service(app_settings) as svc, mcp_client(svc.mcp_url, tokens["tenant-a"], mode) as client:
            src = (
                "def main():\n"
                '    r = records.create(title="ARG_SECRET")\n'
                "    attempt(records.get, id=99)\n"
                '    return r["id"]\n'
            )
            result = await client.call_tool(
                "execute", {"source": src}, meta=trace_meta(traceparent=f"00-{trace_id}-{parent_id}-01")
            )
            assert result.structured_content is not None
            assert result.structured_content["result"] == 1
        # the service has shut down: the provider flushed its queue on the way out
        (trace,) = jaeger.traces_of(name, count=1, spans=6)
        assert name in jaeger.get("/api/services")["data"]

    spans = {s["spanID"]: s for s in trace["spans"]}
    (root,) = [s for s in spans.values() if s["operationName"] == "codemode.execute"]
    assert root["references"] == [{"refType": "FOLLOWS_FROM", "traceID": trace_id, "spanID": parent_id}]
    assert trace["traceID"] != trace_id
    assert trace["processes"][root["processID"]]["serviceName"] == name
    t = tags(root)
    assert t["codemode.outcome"] == "ok" and t["codemode.native_calls"] == 2
    assert t["codemode.subject"] == subject_hash("tenant-a") and t["codemode.runtime"] == "process"
    children = [s for s in spans.values() if s is not root]
    assert sorted(s["operationName"] for s in children) == [
        "codemode.admission",
        "codemode.native_call",
        "codemode.native_call",
        "codemode.sandbox.acquire",
        "codemode.teardown",
    ]
    for span in children:
        assert span["references"] == [
            {"refType": "CHILD_OF", "traceID": trace["traceID"], "spanID": root["spanID"]}
        ]
    calls = sorted(
        (s for s in children if s["operationName"] == "codemode.native_call"), key=lambda s: s["startTime"]
    )
    assert [(tags(s)["codemode.capability.id"], tags(s)["codemode.call.outcome"]) for s in calls] == [
        ("records.entry.create", "ok"),
        ("records.entry.get", "capability_failed"),
    ]
    dumped = str(trace)
    assert "ARG_SECRET" not in dumped and "tenant-a" not in dumped and "not found" not in dumped
