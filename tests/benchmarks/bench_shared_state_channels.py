"""Channels between two tenants' workers on one node through state of the kernel they share (prints
numbers; not a test), besides those of ``bench_counter_channels`` and ``bench_page_cache_channel``:

- ``mapcount``: a page-cache page of a file every worker can read is one page for every process of
  the node, and a worker's own ``numa_maps`` tells how many processes map each page it maps. A
  sender maps the pages whose bits are 1 for a slot, a receiver reads which pages others map
  (``channel_probes.mapcount_*``, with slots shorter than the tests' ``MAP_SLOT``). Closed where
  the worker's Landlock domain holds (it reads no file of ``/proc``): the receiver then reports what
  refused it.
- ``inode``: the kernel numbers ``/proc`` inodes (and pipes, sockets) from one counter for the whole
  machine; a sender takes numbers in one slot of each bit or the other (``channel_probes.inode_*``).

It prints, for each run, the rate carried (the capacity of a binary symmetric channel with the
errors seen), or what refused the receiver.

    python -m tests.benchmarks.bench_shared_state_channels [--runtime process|docker|kubernetes]
        [--runs 2] [--channel mapcount|inode ...] [--slot SECONDS]

The runtimes are ``bench_counter_channels``' (the test images of ``CODEMODE_TEST_TESTING_IMAGE`` and
``CODEMODE_TESTING_IMAGE``; a host running as root for ``process``).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import codemode
from codemode import authz
from tests.adversarial import channel_probes as cp
from tests.benchmarks.bench_counter_channels import LEAD, runtime

CHANNELS = ("mapcount", "inode")


async def one(server: codemode.Server, kind: str, channel: str, slot: float) -> str:
    begin = time.time() + LEAD[kind]
    alice, bob = authz.Subject("alice"), authz.Subject("bob")
    if channel == "mapcount":
        slots = max(int(2.0 / slot), 1)
        sent, got = await asyncio.gather(
            server.execute(cp.mapcount_sender(begin, slots, slot), subject=alice),
            server.execute(cp.mapcount_receiver(begin, slots, slot), subject=bob),
        )
        if got["refused"] and not got["bits"]:
            return f"refused ({got['refused']})"
        return f"{cp.mapcount_capacity(sent, got, slot):,.0f} bits/s"
    sent, got = await asyncio.gather(
        server.execute(cp.inode_sender(begin), subject=alice),
        server.execute(cp.inode_receiver(begin), subject=bob),
    )
    return f"{cp.inode_capacity(sent['sent'], got['gaps']):,.1f} bits/s"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", choices=("process", "docker", "kubernetes"), default="docker")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--channel", action="append", choices=CHANNELS)
    parser.add_argument("--slot", type=float, default=0.01, help="mapcount: seconds per slot")
    args = parser.parse_args()
    server = codemode.Builder(
        authorizer=authz.allow_all(),
        runtime=runtime(args.runtime),
        limits=codemode.Limits(max_execution_time=60.0),
    ).build()
    try:
        for channel in args.channel or CHANNELS:
            for _ in range(args.runs):
                print(
                    f"{args.runtime:<10} {channel:<10} {await one(server, args.runtime, channel, args.slot)}"
                )
    finally:
        await server.aclose()


if __name__ == "__main__":
    asyncio.run(main())
