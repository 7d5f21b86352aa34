"""What a shared quota store costs per execute (prints numbers; not a test).

    python -m tests.benchmarks.bench_quota_store [--clients 20] [--rounds 15] [--kubeconfig PATH]

``--clients`` concurrent clients each run ``--rounds`` acquire+release pairs (what one admitted
execute costs the store) against the local store (the baseline, in process) and against
``codemode.KubernetesQuota`` on the project's cluster, in two shapes: every client its own subject
(no contention) and all clients one subject whose quota is the number of clients (every acquire
races the others for the same slot Leases). Printed: p50/p99 of the pair in ms, API writes per
admitted execute (creates, takeovers and deletes, failed ones included), and the added latency
against the baseline of the same run. Uses (and deletes) the namespace ``codemode-quota-bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import codemode
from codemode.ops.percentile import percentile

NAMESPACE = "codemode-quota-bench"


async def pairs(store: codemode.QuotaStore, clients: int, rounds: int, shared: bool) -> list[float]:
    seconds: list[float] = []

    async def client(i: int) -> None:
        subject = "bench-shared" if shared else f"bench-{i}"
        for _ in range(rounds):
            started = time.perf_counter()
            hold = await store.acquire(subject, clients)
            seconds.append(time.perf_counter() - started)
            if hold is not None:  # None: the deletes of earlier releases still in flight
                store.release(hold)

    await asyncio.gather(*(client(i) for i in range(clients)))
    return seconds


async def main(clients: int, rounds: int, kubeconfig: str) -> None:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    core = client.CoreV1Api(client.ApiClient(configuration))
    while True:  # one left terminating by an earlier run refuses new Leases: wait until it is gone
        try:
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
            break
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        status = core.read_namespace(NAMESPACE).status
        if status is None or status.phase != "Terminating":
            break
        time.sleep(0.5)
    try:
        print(f"{clients} clients x {rounds} acquire+release pairs")
        print(
            f"{'store':<12}{'subjects':<14}{'p50 ms':>9}{'p99 ms':>9}"
            f"{'writes/execute':>16}{'added p50 ms':>14}"
        )
        for shared in (False, True):
            shape = "one, shared" if shared else "one each"
            local = await pairs(codemode.LocalQuota(), clients, rounds, shared)
            base = statistics.median(local)
            print(f"{'local':<12}{shape:<14}{base * 1e3:>9.3f}{percentile(local, 99) * 1e3:>9.3f}{0:>16.2f}")
            store = codemode.KubernetesQuota(NAMESPACE, kubeconfig=kubeconfig, timeout=10.0)
            shared_pairs = await pairs(store, clients, rounds, shared)
            await store.aclose()
            p50 = statistics.median(shared_pairs)
            writes = store.writes / len(shared_pairs)
            print(
                f"{'kubernetes':<12}{shape:<14}{p50 * 1e3:>9.1f}{percentile(shared_pairs, 99) * 1e3:>9.1f}"
                f"{writes:>16.2f}{(p50 - base) * 1e3:>14.1f}"
            )
    finally:
        core.delete_namespace(NAMESPACE)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("CODEMODE_KUBECONFIG", "/var/lib/codemode-k8s/admin.kubeconfig"),
    )
    args = parser.parse_args()
    asyncio.run(main(args.clients, args.rounds, args.kubeconfig))
