"""scripts/provision-kubernetes.sh's extra nodes, offline: what node-2's containerd and kubelet are
configured with (sourced with CODEMODE_K8S_SOURCE_ONLY=1 and the state in a temporary directory;
nothing is started). Each of these, shared with node 1, breaks a node or harms the other
(docs/kubernetes.md, "A second node"); bringing the node up is tests/e2e_kubernetes/test_nodes.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "provision-kubernetes.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def render(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "CODEMODE_K8S_SOURCE_ONLY": "1",
        "CODEMODE_K8S_STATE": str(tmp_path / "state"),
        "CODEMODE_K8S_LOGS": str(tmp_path / "logs"),
    }
    script = f'source "{SCRIPT}"\nRUN_DIR="{tmp_path / "run"}"\nSOCK="$RUN_DIR/containerd.sock"\n{body}'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)


def test_node_2_has_its_own_runtime_ports_cgroup_root_and_pod_logs(tmp_path: Path) -> None:
    done = render(tmp_path, 'node_vars 2\nnode_write_configs\nwrite_configs\necho "$N_HOSTS"')
    assert done.returncode == 0, done.stderr
    state, run, logs = tmp_path / "state", tmp_path / "run", tmp_path / "logs"
    containerd = (state / "node-2/containerd/config.toml").read_text()
    kubelet = (state / "node-2/kubelet/config.yaml").read_text()
    assert f'address = "{run}/node-2/containerd.sock"' in containerd
    assert f'root = "{state}/node-2/containerd/root"' in containerd
    assert f'state = "{run}/node-2/containerd"' in containerd
    assert f'Root = "{run}/node-2/runc"' in containerd
    assert "netns_mounts_under_state_dir = true" in containerd
    assert "port: 11250\n" in kubelet and "healthzPort: 11248\n" in kubelet
    assert f"containerRuntimeEndpoint: unix://{run}/node-2/containerd.sock\n" in kubelet
    assert "cgroupRoot: /codemode-node-2\n" in kubelet
    assert f"podLogsDir: {logs}/node-2/pods\n" in kubelet
    assert "kubelet-serving-node-2.crt" in kubelet
    # Node 1's configuration names none of node-2's paths, and node-2's none of node 1's.
    node1 = (state / "containerd/config.toml").read_text() + (state / "kubelet/config.yaml").read_text()
    assert "node-2" not in node1 and "cgroupRoot" not in node1 and "podLogsDir" not in node1
    assert f"{run}/containerd.sock" not in containerd + kubelet
    assert done.stdout.startswith("127.0.0.1 node-2 # codemode-k8s")


@pytest.mark.parametrize("node", ["1", "5", "x"])
def test_only_nodes_2_to_4_can_be_added(tmp_path: Path, node: str) -> None:
    done = render(tmp_path, f"node_vars {node}")
    assert done.returncode != 0
    assert f"node number must be 2..4 (node 1 is the cluster's own: up/down), not '{node}'" in done.stderr
