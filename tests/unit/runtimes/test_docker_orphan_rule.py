"""The Docker runtime's orphan rule across replicas (pure: no engine; ``is_orphan`` reads labels and
this machine's ``/proc``). The engine-backed clean-up is in
tests/integration/runtimes/test_docker_runtime.py."""

from __future__ import annotations

import os

import codemode
from codemode.runtimes.docker import DockerOptions
from codemode.runtimes.docker._orphans import OWNER as _OWNER

P = "test.codemode"


def peer_labels(**overrides: str) -> dict[str, str]:
    """A worker of another LIVE replica on this engine with this host's host name (compose
    ``network_mode: host`` scaled to 2, ``hostname:`` set, or one host on the machine and one in a
    container with ``--network host``): its own pid namespace, which this host cannot see into."""
    labels = {
        P + ".role": "worker",
        P + ".owner": "another-live-replica",
        P + ".owner-host": _OWNER.host,
        P + ".owner-boot": _OWNER.boot,
        P + ".owner-pidns": "pid:[4026539999]",
        P + ".owner-pid": "1",
        P + ".owner-start": "12345",
    }
    labels.update(overrides)
    return labels


def test_the_periodic_sweep_never_judges_a_peer_with_the_same_host_name_dead() -> None:
    rt = codemode.DockerRuntime(DockerOptions(base_url="unix:///nonexistent/docker.sock", label_prefix=P))
    # Nothing proves this owner dead: the periodic sweep (every orphan_sweep_interval) keeps it.
    assert rt.is_orphan(peer_labels(), proven_only=True) is False
    assert rt.is_orphan(peer_labels(**{P + ".owner-boot": "another-boot"}), proven_only=True) is False
    # At this host's own start the documented guess applies: same host name, another pid
    # namespace or boot = this host restarted, so the old owner is dead.
    assert rt.is_orphan(peer_labels()) is True
    assert rt.is_orphan(peer_labels(**{P + ".owner-boot": "another-boot"})) is True


def test_the_periodic_sweep_keeps_the_rules_that_prove_death() -> None:
    rt = codemode.DockerRuntime(DockerOptions(base_url="unix:///nonexistent/docker.sock", label_prefix=P))
    same_ns = {P + ".owner-pidns": _OWNER.pidns}
    # Same boot and pid namespace: the owner's pid is not running, or is another process.
    assert rt.is_orphan(peer_labels(**same_ns, **{P + ".owner-pid": "999999999"}), proven_only=True)
    assert rt.is_orphan(peer_labels(**same_ns, **{P + ".owner-pid": str(os.getpid())}), proven_only=True)
    alive = {P + ".owner-pid": str(os.getpid()), P + ".owner-start": _OWNER.start}
    assert not rt.is_orphan(peer_labels(**same_ns, **alive), proven_only=True)
    # cleanup_orphans="all" is the operator's word that one host uses the engine.
    everything = codemode.DockerRuntime(
        DockerOptions(base_url="unix:///nonexistent/docker.sock", label_prefix=P, cleanup_orphans="all")
    )
    assert everything.is_orphan(peer_labels(), proven_only=True)
