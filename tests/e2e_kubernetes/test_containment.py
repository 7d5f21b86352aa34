"""A compromised interpreter in a worker pod: what arbitrary Python can do there (nothing useful).

``KubernetesRuntime(testing_entry=True)`` runs the test twin of the worker image
(``codemode-worker-testing``, imported by scripts/provision-kubernetes.sh), which executes the exec
frame's source as Python: the worst case of a Starlark escape. The program reports what it finds and
the test checks each fact against the pod spec ``kubernetes_pod.worker_pod`` writes.
"""

from __future__ import annotations

import textwrap

import pytest

import codemode
from codemode import authz
from codemode.runtimes.kubernetes import KubernetesRuntime
from codemode_worker import PROTOCOL_VERSION

from .support import KUBECONFIG, WORKERS

pytestmark = pytest.mark.kubernetes

TESTING_IMAGE = f"codemode-worker-testing:{PROTOCOL_VERSION}"

PROBE = textwrap.dedent(
    """\
    import os

    def attempt(fn):
        try:
            fn()
        except OSError as exc:
            return type(exc).__name__ + ":" + str(exc.errno)
        return "allowed"

    def write(path):
        with open(path, "w") as f:
            f.write("x")

    status = dict(
        line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line
    )
    final({
        "uid": os.getuid(),
        "gid": os.getgid(),
        "cap_eff": status["CapEff"].strip(),
        "no_new_privs": status["NoNewPrivs"].strip(),
        "write_root": attempt(lambda: write("/escape")),
        "write_tmp": attempt(lambda: write("/tmp/escape")),
        "write_shm": attempt(lambda: write("/dev/shm/escape")),
        "token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount"),
        "testing_env": os.environ.get("CODEMODE_WORKER_TESTING"),
    })
    """
)


async def test_arbitrary_python_in_a_worker_pod_is_contained(cluster: None) -> None:
    rt = KubernetesRuntime(
        kubeconfig=KUBECONFIG, namespace=WORKERS, image=TESTING_IMAGE, testing_entry=True, spawn_timeout=60.0
    )
    b = codemode.Builder(
        authorizer=authz.allow_all(), runtime=rt, limits=codemode.Limits(max_execution_time=30.0)
    )
    srv = b.build()
    try:
        found = await srv.execute(PROBE, subject=authz.Subject("mallory"))
    finally:
        await srv.aclose()
    assert found["testing_env"] == "1"  # the test twin really ran (the production image ignores it)
    assert (found["uid"], found["gid"]) == (65532, 65532)
    assert int(found["cap_eff"], 16) == 0
    assert found["no_new_privs"] == "1"
    # EROFS (30) everywhere: read-only root, and the read-only tmpfs over /tmp and /dev/shm.
    assert found["write_root"] == "OSError:30", found
    assert found["write_tmp"] == "OSError:30", found
    assert found["write_shm"] == "OSError:30", found
    assert found["token"] is False
