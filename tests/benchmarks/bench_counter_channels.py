"""The machine's counters as a channel between two tenants' workers on one node (prints numbers; not a
test). A sender makes threads in the first or the second half of each bit's time (one
more thread each is one more fork in ``/proc/stat``, one more in ``/proc/loadavg``'s and
``sysinfo()``'s counts), a receiver in another tenant's worker samples the counter
(``tests/adversarial/channel_probes``). What it prints for each counter is the rate it carried (the
capacity of a binary symmetric channel with the errors seen), or that the worker could not read it.

    python -m tests.benchmarks.bench_counter_channels [--runtime process|docker|kubernetes]
        [--runs 2] [--counter sysinfo_procs ...]

process: two workers of the process runtime (a host running as root: the uid drop); docker: two
containers of the test image (``CODEMODE_TEST_TESTING_IMAGE``); kubernetes: two pods of the test image
(``CODEMODE_TESTING_IMAGE``) pinned to one node of the cluster of scripts/provision-kubernetes.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import codemode
from codemode import authz
from codemode.runtimes.docker import DockerOptions, DockerRuntime
from codemode.runtimes.process import ProcessOptions, ProcessRuntime
from tests.adversarial import channel_probes as cp
from tests.adversarial.test_docker_escape import TESTING_IMAGE as DOCKER_TESTING_IMAGE

#: Seconds from the request to the first slot: both workers are up by then.
LEAD = {"process": 3.0, "docker": 6.0, "kubernetes": 20.0}


def runtime(kind: str) -> codemode.Runtime:
    if kind == "process":
        return ProcessRuntime(
            ProcessOptions(module="codemode_worker.testing_entry", extra_env={"CODEMODE_WORKER_TESTING": "1"})
        )
    if kind == "docker":
        return DockerRuntime(DockerOptions(testing_entry=True, image=DOCKER_TESTING_IMAGE))
    from tests.e2e_kubernetes.test_channels import OnOneNode
    from tests.e2e_kubernetes.test_containment import TESTING_IMAGE
    from tests.support.cluster import KUBECONFIG, WORKERS, ready_nodes

    return OnOneNode(
        ready_nodes()[0],
        kubeconfig=KUBECONFIG,
        namespace=WORKERS,
        image=TESTING_IMAGE,
        testing_entry=True,
        spawn_timeout=60.0,
    )


async def one(server: codemode.Server, kind: str, counter: str) -> tuple[float, Any]:
    begin = time.time() + LEAD[kind]
    sent, got = await asyncio.gather(
        server.execute(cp.counter_sender(counter, begin), subject=authz.Subject("alice")),
        server.execute(cp.counter_receiver(counter, begin), subject=authz.Subject("bob")),
    )
    return cp.counter_capacity(sent["sent"], got["samples"], counter), got["refused"]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", choices=("process", "docker", "kubernetes"), default="docker")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--counter", action="append", choices=cp.COUNTERS)
    args = parser.parse_args()
    server = codemode.Builder(
        authorizer=authz.allow_all(),
        runtime=runtime(args.runtime),
        limits=codemode.Limits(max_execution_time=60.0),
    ).build()
    try:
        for counter in args.counter or cp.COUNTERS:
            for _ in range(args.runs):
                bits, refused = await one(server, args.runtime, counter)
                state = f"refused ({refused})" if refused else f"{bits:,.1f} bits/s"
                print(f"{args.runtime:<10} {counter:<22} {state}")
    finally:
        await server.aclose()


if __name__ == "__main__":
    asyncio.run(main())
