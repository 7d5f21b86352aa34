"""A compromised interpreter in a worker pod: what arbitrary Python can do there (nothing useful).

``KubernetesOptions(testing_entry=True)`` runs the test twin of the worker image
(``codemode-worker-testing``, imported by scripts/provision-kubernetes.sh; another name with
``CODEMODE_TESTING_IMAGE``), which executes the exec frame's source as Python: the worst case of a
Starlark escape. The program reports what it finds: what the pod spec ``kubernetes.pod.worker_pod``
(capabilities dropped, no privilege escalation, RuntimeDefault seccomp, read-only root and tmpfs
mounts, no token) and the cluster (own PID namespace, a network namespace without a route) leave it.
"""

from __future__ import annotations

import contextlib
import json
import os
import textwrap
import threading
import time
import uuid
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.runtimes.kubernetes import INSTANCE_LABEL, KubernetesOptions, KubernetesRuntime
from codemode.runtimes.seccomp_profile import docker_profile
from codemode_worker import PROTOCOL_VERSION
from tests.support.cluster import (
    KUBECONFIG,
    KUBELET_SECCOMP_ROOT,
    WORKERS,
    core_api,
    kubelet_seccomp_roots,
    pod_log_dirs,
)

from ..adversarial import confinement_probes, write_probe
from ..adversarial.kernel_probe import PROBE as KERNEL_PROBE
from ..adversarial.kernel_probe import not_refused

pytestmark = pytest.mark.kubernetes

TESTING_IMAGE = os.environ.get("CODEMODE_TESTING_IMAGE") or f"codemode-worker-testing:{PROTOCOL_VERSION}"

PROBE = textwrap.dedent(
    """\
    import os, socket

    def attempt(fn):
        try:
            fn()
        except OSError as exc:
            return type(exc).__name__ + ":" + str(exc.errno)
        return "allowed"

    def write(path):
        with open(path, "w") as f:
            f.write("x")

    def connect(address):
        socket.create_connection(address, timeout=2).close()

    status = dict(
        line.split(":", 1) for line in proc_text("/proc/self/status").splitlines() if ":" in line
    )
    final({
        "uid": os.getuid(),
        "gid": os.getgid(),
        "cap_eff": status["CapEff"].strip(),
        "cap_prm": status["CapPrm"].strip(),
        "cap_bnd": status["CapBnd"].strip(),
        "seccomp": status["Seccomp"].strip(),
        "no_new_privs": status["NoNewPrivs"].strip(),
        "write_root": attempt(lambda: write("/escape")),
        "write_tmp": attempt(lambda: write("/tmp/escape")),
        "write_shm": attempt(lambda: write("/dev/shm/escape")),
        "token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount"),
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "api_server": attempt(lambda: connect(("10.96.0.1", 443))),  # the kubernetes Service
        "loopback_api": attempt(lambda: connect(("127.0.0.1", 16443))),  # the node's API server
        "testing_env": os.environ.get("CODEMODE_WORKER_TESTING"),
    })
    """
)


async def run_in_a_pod(source: str, **runtime: Any) -> tuple[KubernetesRuntime, Any]:
    """Run ``source`` (Python) in a fresh worker pod of the test image; (runtime, final value)."""
    rt = KubernetesRuntime(
        KubernetesOptions(
            kubeconfig=KUBECONFIG,
            namespace=WORKERS,
            image=TESTING_IMAGE,
            testing_entry=True,
            spawn_timeout=60.0,
            **runtime,
        )
    )
    b = codemode.Builder(
        authorizer=authz.allow_all(), runtime=rt, limits=codemode.Limits(max_execution_time=30.0)
    )
    srv = b.build()
    try:
        return rt, await srv.execute(source, subject=authz.Subject("mallory"))
    except codemode.CodeModeError as exc:
        pytest.fail(
            f"the test worker did not run ({exc}): is {TESTING_IMAGE} in the cluster? "
            "scripts/provision-kubernetes.sh imports it when docker has it (scripts/provision-docker.sh)"
        )
    finally:
        await srv.aclose()


async def test_arbitrary_python_in_a_worker_pod_is_contained(cluster: None) -> None:
    rt, found = await run_in_a_pod(PROBE)
    assert found["testing_env"] == "1"  # the test twin really ran (the production image ignores it)
    assert (found["uid"], found["gid"]) == (65532, 65532)
    # capabilities.drop [ALL] empties the bounding set too (CapEff alone is 0 for any non-root exec).
    assert int(found["cap_eff"], 16) == int(found["cap_prm"], 16) == int(found["cap_bnd"], 16) == 0
    assert found["no_new_privs"] == "1"
    assert found["seccomp"] == "2"  # a filter is active (RuntimeDefault, then the worker's own)
    # EPERM everywhere: the worker's filter refuses opening any file for writing (under it: the
    # read-only root, and the read-only tmpfs over /tmp and /dev/shm).
    assert found["write_root"] == "PermissionError:1", found
    assert found["write_tmp"] == "PermissionError:1", found
    assert found["write_shm"] == "PermissionError:1", found
    assert found["token"] is False
    # its own PID namespace: it sees only itself and its stderr relay (codemode_worker.stderr_relay)
    assert found["pids"][0] == 1 and len(found["pids"]) <= 2, found["pids"]
    # No socket at all (the worker's filter); under it no route out of the pod's network namespace.
    assert found["api_server"] == "PermissionError:1", found
    assert found["loopback_api"] == "PermissionError:1", found
    left = core_api().list_namespaced_pod(WORKERS, label_selector=f"{INSTANCE_LABEL}={rt.instance_id}")
    assert all(p.metadata.deletion_timestamp for p in left.items)  # deleted (or already gone)


async def test_the_kernel_surface_is_the_filters(cluster: None) -> None:
    """Whatever the node's RuntimeDefault profile allows, the worker's own seccomp filter
    refuses io_uring, AF_VSOCK and every other new socket, ptrace, bpf, keys, namespaces, mounts, fork
    and execve of anything (a memfd's ELF included)."""
    _, report = await run_in_a_pod(KERNEL_PROBE)
    assert not_refused(report) == {}, report
    assert report["_seccomp"] == "2" and report["_no_new_privs"] == "1", report


async def test_nothing_in_a_worker_pod_can_store_a_byte(cluster: None) -> None:
    """A restricted pod still has writable mounts the pod spec cannot make read-only
    (the kubelet's /dev/termination-log, 600 MiB in 0.9 s before, counted in no ephemeral-storage;
    the runtime's /dev/mqueue), besides the read-only /tmp and /dev/shm of the spec. The worker bounds
    them itself before the program runs: the filter refuses opening anything for writing, and
    RLIMIT_FSIZE is 0 for any descriptor it could still get."""
    _, found = await run_in_a_pod(write_probe.PROBE)
    assert found["checked"] > 50, found  # the whole tree was walked
    assert "/dev/termination-log" in found["mounts"], found  # the holes are there ...
    assert found["stored"] == {}, found  # ... and not one byte went anywhere
    assert set(found["mounts"].values()) == {"EPERM"}, found
    assert found["fsize"] == [0, 0], found


FILTERS = """
status = dict(l.split(":", 1) for l in proc_text("/proc/self/status").splitlines() if ":" in l)
final({"filters": int(status["Seccomp_filters"]), "seccomp": status["Seccomp"].strip()})
"""


async def test_the_projects_profile_as_a_localhost_profile(cluster: None) -> None:
    """docs/kubernetes.md: the profile `python -m codemode.runtimes.seccomp_profile` prints, installed
    in the kubelet seccomp root of every node (a worker may land on any) and named by
    --kubernetes-seccomp-profile, is accepted by Pod Security restricted and the node's containerd;
    the worker's own filter stacks on it and the kernel-surface probe is refused as with
    RuntimeDefault."""
    if not KUBELET_SECCOMP_ROOT.parent.is_dir():
        pytest.fail(f"no kubelet root at {KUBELET_SECCOMP_ROOT.parent} (CODEMODE_KUBELET_SECCOMP_ROOT)")
    name = f"codemode-e2e-{uuid.uuid4().hex[:8]}.json"
    paths = []
    for root in kubelet_seccomp_roots():
        root.mkdir(mode=0o755, exist_ok=True)
        paths.append(root / name)
        paths[-1].write_text(json.dumps(docker_profile()))
    try:
        rt, found = await run_in_a_pod(FILTERS, seccomp_profile=name)
        _, report = await run_in_a_pod(KERNEL_PROBE, seccomp_profile=name)
    finally:
        for path in paths:
            path.unlink()
    pod: Any = rt.pod_manifest("p")
    assert pod.spec.security_context.seccomp_profile.type == "Localhost"
    assert found == {"filters": 2, "seccomp": "2"}, found  # the pod's profile, then the worker's
    assert not_refused(report) == {}, report


async def test_argument_forms_and_other_abis_are_refused(cluster: None) -> None:
    """Found by a security review: the argument forms and ABIs of ``confinement_probes.FORMS_PROBE``
    (x32 numbers, clone flag mixes, fcntl/ioctl commands, open with a write flag in any spelling,
    signals, pidfds, another seccomp filter, priorities, the splice family) are refused in a pod."""
    _, report = await run_in_a_pod(confinement_probes.FORMS_PROBE)
    assert not_refused(report) == {}, report


async def test_a_worker_pod_takes_no_pseudo_terminal(cluster: None) -> None:
    """Opening ``/dev/ptmx`` read-only (allowed by the filter, and no pod field removes the device)
    allocates a pty from the node-wide count (``kernel.pty.max`` 4096 - ``kernel.pty.reserve``
    1024): one worker holding them (measured: 3071, then ENOSPC) makes every other container's
    ``openpty`` fail with ENOSPC (``kubectl exec -t`` into any pod of the node, a Docker container
    on the same machine) for as long as it lives. The probe stops at ``PTY_CAP``."""
    _, found = await run_in_a_pod(confinement_probes.PTY_PROBE)
    assert found["ptys"] == 0, found


#: Bytes of two-byte lines the log test writes: over the worker's ephemeral-storage limit once the
#: container runtime has prefixed each line (about 14 times over).
LOG_FLOOD = confinement_probes.STDERR_FLOOD.replace(str(confinement_probes.STDERR_FLOOD_BYTES), str(16 << 20))


async def test_a_workers_container_log_stays_within_its_ephemeral_storage(cluster: None) -> None:
    """docs/kubernetes.md: container logs count towards ``ephemeral-storage`` and a worker over it is
    evicted. The kubelet looks only every few seconds, and the runtime stores each two-byte line as
    a ~28-byte record: the node's disk holds several times the limit first. The test reads the
    pod's log directory on the node (every node runs on this machine) while the worker writes."""
    dirs = pod_log_dirs()
    if not dirs[0].is_dir():
        pytest.fail(f"no {dirs[0]} on this machine (the cluster's first node)")
    before = {d / name for d in dirs for name in os.listdir(d)}
    peak: dict[str, int] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for path in {d / name for d in dirs for name in os.listdir(d)} - before:
                if not path.name.startswith(WORKERS + "_"):
                    continue
                size = 0
                name = path.name
                for root, _, files in os.walk(path):
                    for f in files:
                        with contextlib.suppress(OSError):  # rotated or gone meanwhile
                            size += os.path.getsize(os.path.join(root, f))
                peak[name] = max(peak.get(name, 0), size)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    rt = KubernetesRuntime(
        KubernetesOptions(
            kubeconfig=KUBECONFIG,
            namespace=WORKERS,
            image=TESTING_IMAGE,
            testing_entry=True,
            spawn_timeout=60.0,
        )
    )
    srv = codemode.Builder(
        authorizer=authz.allow_all(), runtime=rt, limits=codemode.Limits(max_execution_time=30.0)
    ).build()
    try:
        await srv.execute(LOG_FLOOD, subject=authz.Subject("mallory"))
    except codemode.CodeModeError:
        pass  # evicted: 'internal failure' (a bounded log ends normally); the sizes decide below
    finally:
        await srv.aclose()
        time.sleep(1)
        done.set()
        watcher.join()
    limit = 64 * 1024 * 1024  # PodSizing.ephemeral_storage
    assert peak, "the worker's log directory was never seen"
    assert max(peak.values()) <= limit, peak
