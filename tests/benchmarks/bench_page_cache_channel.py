"""The page-cache channel between two tenants' worker containers on one node (prints numbers; not a
test). Every container of one image reads the image's files through the same lower
inode, so through the same page cache. A sender reads a page of an image file for a 1 and leaves it
for a 0; a receiver in another container, later, reads each page and times it: a page that came from
the cache (a 1) takes microseconds, one from the disk (a 0) much longer. The worker's filter already
refuses the calls that ask the cache directly (``mincore``, ``cachestat``, ``preadv2`` with
``RWF_NOWAIT``); the time of a plain read it cannot refuse.

    python -m tests.benchmarks.bench_page_cache_channel [--runtime runsc] [--bits 256] [--runs 3]

Needs root on the Docker host (it evicts the file's pages from the cache with ``posix_fadvise``
before each run, through the image layer's own path: the pages a real attacker would use are those
nobody on the node read since they were last evicted) and the test image
(``CODEMODE_TEST_TESTING_IMAGE``, default ``codemode-worker-testing:1``). Each bit is one page, read
once: a page the receiver read is cached from then on, so the channel carries at most one bit per
page of the image not yet cached (about 20,000 pages of a 60 MB image) until memory pressure evicts
them. Prints the bits that got through, the time the two executes' reads took, and the rate (the capacity
of a binary symmetric channel with the errors seen, over that time; 0 when the bits right are as many
as coin tosses would get).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import time
from typing import Any

import docker

from codemode.runtimes.docker import DockerOptions, DockerRuntime
from tests.adversarial.channel_probes import message
from tests.adversarial.test_docker_escape import TESTING_IMAGE, run_python

#: An image file no worker reads (Berkeley DB, for ``dbm``): 450 pages.
FILE = "/usr/lib/x86_64-linux-gnu/libdb-5.3.so"
#: Pages between two bits (no read-ahead reaches the next bit's page: the probe also asks
#: MADV_RANDOM).
STRIDE = 2
#: The first bits: a known 1010... that the receiver calibrates its threshold on.
CALIBRATION = 16

_COMMON = r"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
fd = os.open(FILE, os.O_RDONLY)
size = os.fstat(fd).st_size
base = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
libc.madvise(ctypes.c_void_p(base), ctypes.c_size_t(size), 1)  # MADV_RANDOM: no read-ahead
pages = [4096 * STRIDE * (i + 1) for i in range(BITS)]
"""

SENDER = (
    _COMMON
    + r"""
start = time.perf_counter()
for offset, bit in zip(pages, BITS_SENT):
    if bit == "1":
        ctypes.c_char.from_address(base + offset).value
final({"seconds": time.perf_counter() - start})
"""
)

RECEIVER = (
    _COMMON
    + r"""
times = []
start = time.perf_counter()
for offset in pages:
    t = time.perf_counter_ns()
    ctypes.c_char.from_address(base + offset).value
    times.append(time.perf_counter_ns() - t)
final({"seconds": time.perf_counter() - start, "ns": times})
"""
)


def layer_path(image: str, path: str) -> str:
    """The file's path in the image's overlay2 layers on this host."""
    data = docker.from_env().images.get(image).attrs["GraphDriver"]["Data"]
    for layer in [data["UpperDir"], *data.get("LowerDir", "").split(":")]:
        candidate = os.path.join(layer, path.lstrip("/"))
        if layer and os.path.exists(candidate):
            return candidate
    raise SystemExit(f"{path} is in no layer of {image}")


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def capacity(errors: float) -> float:
    """Bits a bit carries over a binary symmetric channel with this error rate."""
    errors = min(errors, 1 - errors)
    if errors <= 0:
        return 1.0
    return 1 + errors * math.log2(errors) + (1 - errors) * math.log2(1 - errors)


def decode(ns: list[int]) -> str:
    """A page read faster than the threshold is a 1: the threshold is the geometric mean of the
    calibration's slow and fast medians."""
    ones = [ns[i] for i in range(0, CALIBRATION, 2)]
    zeros = [ns[i] for i in range(1, CALIBRATION, 2)]
    threshold = (statistics.median(ones) * statistics.median(zeros)) ** 0.5
    return "".join("1" if t < threshold else "0" for t in ns)


async def one_run(rt: DockerRuntime, host_file: str, bits: int) -> dict[str, Any]:
    sent = "10" * (CALIBRATION // 2) + message(bits)
    values = {"FILE": FILE, "STRIDE": STRIDE, "BITS": len(sent), "BITS_SENT": sent}
    head = "".join(f"{k} = {v!r}\n" for k, v in values.items())
    evict(host_file)
    sender, receiver = await rt.spawn(), await rt.spawn()  # two tenants' containers
    try:
        out = await run_python(sender, head + SENDER)
        got = await run_python(receiver, head + RECEIVER)
    finally:
        await asyncio.gather(sender.destroy(), receiver.destroy())
    received = decode(got["ns"])[CALIBRATION:]
    right = sum(a == b for a, b in zip(received, sent[CALIBRATION:], strict=True))
    seconds = out["seconds"] + got["seconds"]
    fast = sorted(got["ns"])
    return {
        "right": right,
        "bits": bits,
        "seconds": seconds,
        # within two standard deviations of a coin's half: nothing got through
        "rate": 0.0
        if abs(right - bits / 2) < math.sqrt(bits)
        else bits * capacity(1 - right / bits) / seconds,
        "fast_us": fast[len(fast) // 4] / 1000,
        "slow_us": fast[3 * len(fast) // 4] / 1000,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default=None, help="the OCI runtime (runsc: gVisor)")
    parser.add_argument("--bits", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.bits * STRIDE + CALIBRATION * STRIDE > 440:
        raise SystemExit("--bits: the file has room for about 200 bits")
    host_file = layer_path(TESTING_IMAGE, FILE)
    rt = DockerRuntime(DockerOptions(oci_runtime=args.runtime, testing_entry=True, image=TESTING_IMAGE))
    try:
        for _ in range(args.runs):
            r = await one_run(rt, host_file, args.bits)
            print(
                f"page cache, {args.runtime or 'runc'}: {r['right']}/{r['bits']} bits right in"
                f" {r['seconds'] * 1000:.1f} ms of reads: {r['rate']:,.0f} bits/s"
                f" (quartile reads {r['fast_us']:.1f} us / {r['slow_us']:.1f} us)"
            )
            time.sleep(0.5)
    finally:
        await rt.aclose()


if __name__ == "__main__":
    asyncio.run(main())
