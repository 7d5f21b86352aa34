"""Where the per-subject quota is counted (codemode.execution.quota): the local store as before,
the settings of the shared one, a subject busy on another replica in fair admission, and the
Kubernetes store failing closed when its API refuses connections (no cluster needed: the port is
closed). The store against the real cluster: tests/e2e_kubernetes/test_shared_quota.py."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest
import yaml

import codemode
from codemode.execution.admission import FairAdmission
from codemode.execution.quota import QuotaUnavailable
from codemode.execution.quota_kubernetes import lease_name, subject_digest
from codemode.startup.bootstrap import build_quota_store
from codemode.startup.config import ConfigError, load_settings, places


async def test_the_local_store_counts_in_process() -> None:
    store = codemode.LocalQuota()
    holds = [await store.acquire("alice", 2) for _ in range(2)]
    assert all(holds) and await store.acquire("alice", 2) is None
    assert await store.acquire("bob", 2) is not None
    assert holds[0] is not None
    store.release(holds[0])
    assert await store.acquire("alice", 2) is not None
    assert isinstance(store, codemode.QuotaStore) and isinstance(store.name, str)


async def test_a_subject_busy_elsewhere_is_no_newcomer_for_the_reserve() -> None:
    adm = FairAdmission(2, 1)
    await adm.acquire("bob")  # one slot free, and it is the reserved one
    busy_elsewhere = asyncio.ensure_future(adm.acquire("alice", elsewhere=1))
    await asyncio.sleep(0)
    assert not busy_elsewhere.done() and adm.waiting == 1
    await asyncio.wait_for(adm.acquire("carol"), 1)  # a true newcomer takes the reserve
    adm.release("bob")  # one free again, the reserved one: still not hers
    await asyncio.sleep(0)
    assert not busy_elsewhere.done()
    adm.release("carol")
    await asyncio.wait_for(busy_elsewhere, 1)
    assert adm.held == {"alice": 1}


def test_the_shared_store_needs_a_namespace_outside_a_pod(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(places, "POD_NAMESPACE_FILE", tmp_path / "absent")
    with pytest.raises(ConfigError) as info:
        load_settings(allow_all=True, quota_store="kubernetes")
    assert "--quota-store / CODEMODE_QUOTA_STORE" in str(info.value)
    assert "--quota-namespace / CODEMODE_QUOTA_NAMESPACE" in str(info.value)
    with pytest.raises(ConfigError, match="--quota-namespace / CODEMODE_QUOTA_NAMESPACE needs --quota-store"):
        load_settings(allow_all=True, quota_namespace="codemode")
    pod = tmp_path / "namespace"
    pod.write_text("codemode\n")
    monkeypatch.setattr(places, "POD_NAMESPACE_FILE", pod)
    store = build_quota_store(load_settings(allow_all=True, quota_store="kubernetes", quota_lease_seconds=9))
    assert isinstance(store, codemode.KubernetesQuota)
    assert (store.namespace, store.lease_seconds, store.timeout) == ("codemode", 9, 2.0)
    assert build_quota_store(load_settings(allow_all=True)) is None


def test_lease_names_carry_no_subject_text() -> None:
    name = lease_name("alice@example.com", 3)
    assert name == f"codemode-quota-{subject_digest('alice@example.com')}-3"
    assert "alice" not in name and len(subject_digest("x")) == 20


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kubeconfig_for(port: int, tmp_path: Path) -> Path:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return kubeconfig


async def test_a_hung_api_fails_closed_after_the_timeout(tmp_path: Path) -> None:
    # A listener that accepts and never answers: the store is slow, not down.
    accepted: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await reader.read()

    listener = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    store = codemode.KubernetesQuota("ns", kubeconfig=kubeconfig_for(port, tmp_path), timeout=1.0)
    started = time.monotonic()
    with pytest.raises(QuotaUnavailable, match=r"no answer within 1\.0 s"):
        await store.acquire("alice", 2)
    assert time.monotonic() - started >= 1.0
    await store.aclose()
    listener.close()
    for writer in accepted:
        writer.transport.abort()
    await listener.wait_closed()
    await asyncio.sleep(0)  # the aborted transports finish closing


async def test_an_unreachable_api_fails_closed_quickly(tmp_path: Path) -> None:
    store = codemode.KubernetesQuota("ns", kubeconfig=kubeconfig_for(closed_port(), tmp_path), timeout=5.0)
    started = time.monotonic()
    with pytest.raises(QuotaUnavailable, match="Kubernetes API Leases in namespace ns"):
        await store.acquire("alice", 2)
    assert time.monotonic() - started < 5.0  # refused at once: no wait for the timeout
    await store.aclose()


def test_the_documented_settings_load(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "service.md").read_text(encoding="utf-8")
    block = next(b for b in doc.split("```toml\n")[1:] if b.startswith('quota_store = "kubernetes"'))
    path = tmp_path / "codemode.toml"
    path.write_text(block.split("```")[0] + "allow_all = true\n", encoding="utf-8")
    settings = load_settings(path)
    assert (settings.quota_store, settings.effective_quota_namespace) == ("kubernetes", "codemode")
    assert (settings.quota_lease_seconds, settings.quota_store_timeout) == (15, 2.0)
