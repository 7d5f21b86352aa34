"""Where one hardened worker container's start goes. Prints numbers; not a test.

    python -m tests.benchmarks.bench_docker_start [--n 10] [--image codemode-worker:1]

Needs root (the bare ``runc`` runs), a Docker engine whose default OCI runtime is ``runc``, and the
worker image. Every variant runs once per round, interleaved, so load from other work on the
machine hits them alike; the printed fractions are of the same run.

- **the runtime's container**: the create request ``DockerRuntime`` sends (its hardening:
  ``codemode.runtimes.docker.container``), timed call by call: create, attach, start, then the
  probe -> probe_ack (the worker's Python up to its first frame), and the remove. The engine's own
  ``create`` and ``start`` events (``docker events``, the engine's clock) split each call into the
  engine's work before the event and the answer after it.
- **the same with ``network_mode=host``**: no network namespace of its own (``--network none``
  makes one with only a loopback); the difference in ``start`` is the namespace's cost.
- **an interpreter alone**: the same container running ``python3 -I -S -c`` that echoes one line:
  the interpreter's start without the worker's imports and confinement.
- **bare runc**: ``runc create`` + ``runc start`` of an OCI bundle exported from the same image
  (``docker export`` and ``runc spec``: the worker's command and user, read-only root), with and
  without a network namespace, then the probe -> probe_ack: the OCI runtime's share of the engine's
  ``start`` without dockerd, containerd and the shim. (The bundle has no seccomp profile and no
  cgroup limits: a lower bound of runc's part.)
- ``DockerRuntime.spawn()`` itself (create .. probe_ack), as the check of the sum.

Then ``python -X importtime`` of the worker in the bare bundle (its costliest imports), and whether
crun (if installed) can create a container on this machine.

    python -m tests.benchmarks.bench_docker_start --ready-cpu IMAGE [IMAGE ...] [--n 10]

instead compares worker images: the worker process's CPU from its start to confined and ready
(``codemode_worker.entry.main`` with its stdin at end of file: warm-up, freeze, filter, uid drop,
confinement, then the exit), read by the process itself (``time.process_time``, which includes
``runc init``'s part: the same process before its ``execve``), one ``docker run`` per image per
round, the images interleaved; p50 and mean per image, and each p50 beside the first image's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import struct
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from codemode.runtimes.docker import DEFAULT_IMAGE, DockerOptions, DockerRuntime
from codemode.runtimes.docker.container import WORKER_USER, create_args, host_config
from codemode_worker import PROTOCOL_VERSION, WORKER_ENV_MARKER
from codemode_worker.protocol import encode_frame

PROBE = encode_frame({"k": "probe", "v": PROTOCOL_VERSION})
ECHO = "import sys; sys.stdout.write(sys.stdin.readline()); sys.stdout.flush()"
LABEL = "io.codemode.role"
ROLE = "bench-start"
WORKER = ["python3", "-I", "-m", "codemode_worker"]


# ------------------------------------------------------------------------------------------ engine


class Events:
    """The engine's ``create`` and ``start`` events of this bench's containers (engine clock, ns)."""

    def __init__(self, api: Any) -> None:
        self.at: dict[str, dict[str, int]] = defaultdict(dict)
        self._stream = api.events(decode=True, filters={"label": f"{LABEL}={ROLE}", "type": "container"})
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._stream:
                action = event.get("Action") or event.get("status")
                if action in ("create", "start"):
                    self.at[event["id"]][action] = int(event["timeNano"])
        except Exception:  # closed at the end
            return

    def wait(self, cid: str, timeout: float = 5.0) -> dict[str, int]:
        end = time.monotonic() + timeout
        while len(self.at.get(cid, {})) < 2 and time.monotonic() < end:
            time.sleep(0.005)
        return self.at.get(cid, {})

    def close(self) -> None:
        self._stream.close()


def read_frame_or_line(sock: Any, want_line: bool) -> None:
    """Read the attach stream (8-byte multiplexing headers) until stdout holds a line or a frame."""
    buf, out = b"", b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError(f"stream ended: {out!r}")
        buf += chunk
        while len(buf) >= 8:
            kind, size = buf[0], struct.unpack(">I", buf[4:8])[0]
            if len(buf) < 8 + size:
                break
            if kind == 1:
                out += buf[8 : 8 + size]
            buf = buf[8 + size :]
        if want_line and out.endswith(b"\n"):
            return
        if not want_line and len(out) >= 4 and len(out) >= 4 + struct.unpack(">I", out[:4])[0]:
            return


def engine_once(api: Any, events: Events, options: DockerOptions, variant: str) -> dict[str, float]:
    """One container of ``variant`` (worker, host-net, python): each call's seconds."""
    kwargs = create_args(options, {LABEL: ROLE})
    hc = host_config(api, options)
    if variant == "host-net":
        hc["NetworkMode"] = "host"
        kwargs["network_disabled"] = False
    if variant == "python":
        kwargs["entrypoint"] = ["python3", "-I", "-S", "-c", ECHO]
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    c0 = time.time_ns()
    cid = api.create_container(**kwargs, host_config=hc)["Id"]
    t1 = time.perf_counter()
    sock = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
    raw = sock._sock
    t2 = time.perf_counter()
    s0 = time.time_ns()
    try:
        api.start(cid)
        t3 = time.perf_counter()
        raw.sendall(b"ping\n" if variant == "python" else PROBE)
        read_frame_or_line(raw, want_line=variant == "python")
        t4 = time.perf_counter()
    finally:
        t5 = time.perf_counter()
        api.remove_container(cid, force=True)
        raw.close()
        t6 = time.perf_counter()
    out = {"create": t1 - t0, "attach": t2 - t1, "start": t3 - t2, "first": t4 - t3, "remove": t6 - t5}
    seen = events.wait(cid)
    if "create" in seen and "start" in seen:
        out["create_event"] = (seen["create"] - c0) / 1e9  # request sent -> the engine's event
        out["start_event"] = (seen["start"] - s0) / 1e9
    return out


# ------------------------------------------------------------------------------------------ bare runc


def make_bundle(api: Any, image: str, root: Path) -> Path:
    """An OCI bundle of ``image``: its file system (``docker export``) and ``runc spec``'s config
    with the worker's command and user and a read-only root."""
    bundle = root / "bundle"
    rootfs = bundle / "rootfs"
    rootfs.mkdir(parents=True)
    cid = api.create_container(image, labels={LABEL: ROLE})["Id"]
    try:
        export = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(rootfs)], stdin=export.stdout, check=True)
        export.wait()
    finally:
        api.remove_container(cid, force=True)
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    uid, gid = (int(x) for x in WORKER_USER.split(":"))
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"].update(terminal=False, args=WORKER, user={"uid": uid, "gid": gid}, cwd="/")
    spec["process"]["env"] = [*spec["process"].get("env", []), f"{WORKER_ENV_MARKER}=1"]
    spec["root"]["readonly"] = True
    spec["hostname"] = "worker"
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def variant_bundle(bundle: Path, name: str, *, netns: bool, args: list[str] | None = None) -> Path:
    """A config of ``bundle`` (same root file system) with or without its own network namespace."""
    spec = json.loads((bundle / "config.json").read_text())
    if not netns:
        spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"] if n["type"] != "network"]
    if args is not None:
        spec["process"]["args"] = args
    spec["root"]["path"] = str(bundle / "rootfs")
    out = bundle.parent / name
    out.mkdir(exist_ok=True)
    (out / "config.json").write_text(json.dumps(spec))
    return out


def runc_once(bundle: Path, name: str, echo: bool = False) -> dict[str, float]:
    """``runc create`` and ``runc start`` of the bundle, then probe -> probe_ack (``echo``: a line
    echoed by the bare interpreter); each part's seconds."""
    binary = "runc"
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    t0 = time.perf_counter()
    try:
        subprocess.run(
            [binary, "create", "--bundle", str(bundle), name],
            stdin=in_r,
            stdout=out_w,
            stderr=subprocess.DEVNULL,  # the worker's stderr (a pipe would stay open with it)
            check=True,
        )
        os.close(in_r)
        os.close(out_w)
        in_r = out_w = -1
        t1 = time.perf_counter()
        subprocess.run([binary, "start", name], check=True)
        t2 = time.perf_counter()
        os.write(in_w, b"ping\n" if echo else PROBE)
        data = b""
        while not _complete(data, echo):
            chunk = os.read(out_r, 65536)
            if not chunk:
                raise RuntimeError(f"worker ended: {data!r}")
            data += chunk
        t3 = time.perf_counter()
    finally:
        for fd in (in_r, in_w, out_r, out_w):
            if fd >= 0:
                os.close(fd)
        subprocess.run([binary, "delete", "-f", name], capture_output=True, check=False)
    return {"create": t1 - t0, "start": t2 - t1, "first": t3 - t2}


def _complete(data: bytes, line: bool) -> bool:
    if line:
        return data.endswith(b"\n")
    return len(data) >= 4 and len(data) >= 4 + struct.unpack(">I", data[:4])[0]


def importtime(bundle: Path) -> list[tuple[int, str]]:
    """The worker's top-level imports by cumulative microseconds (``-X importtime``), one run."""
    b = variant_bundle(bundle, "importtime", netns=True, args=[*WORKER[:1], "-X", "importtime", *WORKER[1:]])
    proc = subprocess.run(
        ["runc", "run", "--bundle", str(b), f"bench-start-it-{os.getpid()}"],
        input=PROBE,
        capture_output=True,
        timeout=60,
        check=False,
    )
    rows = []
    for line in proc.stderr.decode(errors="replace").splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            name = parts[2]
            if not name.startswith("  "):  # the worker's own imports, not their dependencies
                rows.append((int(parts[1]), name.strip()))
    return sorted(rows, reverse=True)


def crun_line(bundle: Path) -> str:
    """Whether crun can create the bundle here (its error's first line if not)."""
    if shutil.which("crun") is None:
        return "crun: not installed"
    name = f"bench-start-crun-{os.getpid()}"
    proc = subprocess.run(
        ["crun", "create", "--bundle", str(bundle), name],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        check=False,
    )
    subprocess.run(["crun", "delete", "-f", name], capture_output=True, check=False)
    version = subprocess.run(["crun", "--version"], capture_output=True, text=True, check=False).stdout
    head = version.splitlines()[0] if version else "crun"
    if proc.returncode == 0:
        return f"{head}: creates the bundle"
    return f"{head}: fails: {proc.stderr.decode(errors='replace').strip().splitlines()[-1]}"


# ------------------------------------------------------------------------------------------ the run


def p50(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


# The worker's own entry, then its CPU so far on stderr (the confined worker may still write there).
READY_CPU = (
    "import sys, time\n"
    "import codemode_worker.entry as entry\n"
    "code = entry.main()\n"
    "sys.stderr.write(f'ready-cpu {time.process_time() * 1000:.2f} {code}\\n')\n"
)


def ready_cpu_once(image: str) -> float:
    """One worker of ``image`` run to ready and out; its CPU in ms."""
    hardening = ["--network", "none", "--read-only", "--user", WORKER_USER]
    proc = subprocess.run(
        ["docker", "run", "--rm", "-i", *hardening, "--entrypoint", "python3", image, "-I", "-c", READY_CPU],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line.split() for line in proc.stderr.splitlines() if line.startswith("ready-cpu ")]
    if not lines or lines[-1][2] != "0":
        raise RuntimeError(f"{image}: the worker did not end ready: {proc.stderr[-500:]}")
    return float(lines[-1][1])


def ready_cpu(images: list[str], n: int) -> None:
    for image in images:  # caches warm; not counted
        ready_cpu_once(image)
    cpu: dict[str, list[float]] = {image: [] for image in images}
    for _ in range(n):
        for image in images:
            cpu[image].append(ready_cpu_once(image))
    first = statistics.median(cpu[images[0]])
    print(f"worker CPU from start to ready, {n} rounds, images interleaved (ms; runc init included)")
    for image in images:
        med = statistics.median(cpu[image])
        print(
            f"  {image:<32} p50 {med:7.1f}   mean {statistics.mean(cpu[image]):7.1f}   "
            f"= {med / first:.2f}x {images[0]}'s p50"
        )


async def runtime_spawns(options: DockerOptions, n: int) -> list[float]:
    rt = DockerRuntime(options)
    await rt.check()
    out = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            sandbox = await rt.spawn()
            out.append(time.perf_counter() - t0)
            await sandbox.destroy()
    finally:
        await rt.aclose()
    return out


def main() -> None:
    import docker

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10, help="rounds (default 10)")
    p.add_argument("--image", default=DEFAULT_IMAGE)
    p.add_argument(
        "--ready-cpu",
        nargs="+",
        metavar="IMAGE",
        help="instead: each image's worker CPU from start to ready, interleaved, beside the first's",
    )
    args = p.parse_args()
    if args.ready_cpu:
        ready_cpu(args.ready_cpu, args.n)
        return
    api = docker.APIClient(version="auto", timeout=60)
    options = DockerOptions(image=args.image)
    print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    events = Events(api)
    series: dict[str, list[dict[str, float]]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        bundle = make_bundle(api, args.image, Path(tmp))
        netns = variant_bundle(bundle, "netns", netns=True)
        nonet = variant_bundle(bundle, "nonet", netns=False)
        bare = variant_bundle(bundle, "python", netns=True, args=["python3", "-I", "-S", "-c", ECHO])
        for variant in ("worker", "host-net", "python"):  # caches warm; not counted
            engine_once(api, events, options, variant)
        runc_once(netns, f"bench-start-warm-{os.getpid()}")
        for i in range(args.n):
            for variant in ("worker", "host-net", "python"):
                series[variant].append(engine_once(api, events, options, variant))
            series["runc"].append(runc_once(netns, f"bench-start-{os.getpid()}-{i}"))
            series["runc-nonet"].append(runc_once(nonet, f"bench-start-{os.getpid()}-{i}-n"))
            series["runc-python"].append(runc_once(bare, f"bench-start-{os.getpid()}-{i}-p", echo=True))
        spawns = asyncio.run(runtime_spawns(options, args.n))
        imports = importtime(bundle)
        crun = crun_line(netns)
    events.close()
    print(f"load average after:  {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")

    def med(variant: str, part: str) -> float:
        return p50([row[part] for row in series[variant] if part in row])

    print(f"\nper call, p50 of {args.n} rounds (ms)")
    print(f"{'variant':<22}{'create':>9}{'attach':>9}{'start':>9}{'first':>9}{'remove':>9}")
    for variant in ("worker", "host-net", "python"):
        cells = "".join(
            f"{med(variant, part):9.1f}" for part in ("create", "attach", "start", "first", "remove")
        )
        print(f"{'engine, ' + variant:<22}{cells}")
    for variant in ("runc", "runc-nonet", "runc-python"):
        cells = "".join(f"{med(variant, part):9.1f}" for part in ("create",))
        print(
            f"{'bare ' + variant:<22}{cells}{'':>9}{med(variant, 'start'):9.1f}{med(variant, 'first'):9.1f}"
        )
    print(
        f"engine events (worker): create request -> event {med('worker', 'create_event'):.1f} ms, "
        f"start request -> event {med('worker', 'start_event'):.1f} ms"
    )
    spawn = p50(spawns)
    print(f"DockerRuntime.spawn() (create .. probe_ack) p50 {spawn:.1f} ms")

    create, attach = med("worker", "create"), med("worker", "attach")
    start, first = med("worker", "start"), med("worker", "first")
    whole = create + attach + start + first
    runc = med("runc", "create") + med("runc", "start")
    net = max(0.0, start - med("host-net", "start"))
    runc_net = max(0.0, runc - med("runc-nonet", "create") - med("runc-nonet", "start"))
    python = med("runc-python", "first")  # after runc start: nothing of dockerd overlaps it
    rows = [
        ("engine create (API call)", create),
        ("attach (API call)", attach),
        ("engine start: runc create + start (bare runc, own netns)", runc),
        ("engine start: dockerd, containerd, shim (the rest)", start - runc),
        ("worker: interpreter start to a first line (bare runc, python -I -S)", min(python, first)),
        ("worker: its imports and confinement to the first frame", max(0.0, first - python)),
    ]
    print(f"\ncreate -> first frame of the runtime's container: {whole:.1f} ms (sum of the p50s)")
    for label, ms in rows:
        print(f"  {label:<60}{ms:8.1f} ms  {ms / whole:6.1%}")
    print(
        f"  of the start: the network namespace (start, none - host) {net:.1f} ms = {net / whole:.1%};"
        f" bare runc with - without netns {runc_net:.1f} ms"
    )
    print(f"  not in the sum: remove {med('worker', 'remove'):.1f} ms (the pool cannot hide it)")
    print("\nworker imports by cumulative time (-X importtime, one run, us):")
    for us, name in imports[:6]:
        print(f"  {us:>8}  {name}")
    print(crun)


if __name__ == "__main__":
    main()
