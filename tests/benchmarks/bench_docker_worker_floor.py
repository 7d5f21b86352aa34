"""What the default Docker mode's rate would be with a worker that costs nothing, or with one that
is not CPython (prints numbers; not a test). Needs a Docker engine, codemode-worker:1 and gcc;
``--rust`` also needs cargo and crates.io.

    python -m tests.benchmarks.bench_docker_worker_floor [--rounds 3] [--n 40] [--rust]

The goal puts the default mode (a fresh container per execute over a warm pool) at 1.5x the raw
engine's rate (``bench_docker``: hardened containers of the same image, created, started and
removed, 4 at a time). The worker's CPython start is the one part of a default-mode execute that the
raw cycle does not pay. This measures how far removing it could go: per round, interleaved, the raw
engine rate, the default mode with the real worker, and the default mode with ``nothing_worker``
(nothing_worker/nothing_worker.c: a static C program that answers the probe and the exec and exits;
built here into an image made of the worker image plus it, removed at the end). The same host, the
same runtime and hardening, the same pool and concurrency: only the worker's own cost differs. The
rounds run the series in turn, forwards and backwards; at the end, each default mode against the
raw rate of its own round too (median, range, how many rounds reach 1.5x): on a shared machine the
rates drift between rounds, and the spread says how far one run can be trusted.

``--rust`` adds a series with ``starlark_rust_worker`` (starlark_rust_worker/: starlark-rust called
from Rust, the interpreter the Python worker reaches through starlark-pyo3). At its start it builds
what the Python worker's warm-up builds (the globals, the helper module from the worker's own
``<builtins>`` source with its Python callables stubbed, a throwaway program), then runs the exec's
program through the helper module's ``run_main``. It has no confinement, limits, native calls or
diagnostics: it prices the interpreter, not a whole worker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import docker

from codemode.runtimes.docker import DEFAULT_IMAGE

from .bench_docker import MachineCPU, default_rate, raw_rate

HERE = Path(__file__).parent
TAG = "codemode-bench-nothing-worker:1"
RUST_TAG = "codemode-bench-starlark-rust-worker:1"


class Series(NamedTuple):
    """One default-mode series: its image, its entrypoint (None: the worker's) and its label."""

    image: str
    entrypoint: tuple[str, ...] | None
    label: str


def build_image(tag: str, base: str, folder: Path, binary: Path) -> None:
    """``folder``'s Dockerfile over ``base`` with ``binary`` beside it, as ``tag``."""
    with tempfile.TemporaryDirectory() as context:
        shutil.copy(binary, Path(context) / binary.name)
        shutil.copy(folder / "Dockerfile", context)
        api = docker.APIClient(version="auto", timeout=120)
        for chunk in api.build(path=context, tag=tag, buildargs={"BASE": base}, rm=True, decode=True):
            if "error" in chunk:
                raise SystemExit(f"building {tag} failed: {chunk['error']}")
        api.close()


def build_nothing(base: str) -> None:
    """The worker image plus the compiled nothing_worker, as ``TAG``."""
    folder = HERE / "nothing_worker"
    with tempfile.TemporaryDirectory() as out:
        binary = Path(out) / "nothing_worker"
        subprocess.run(
            ["gcc", "-O2", "-static", "-o", str(binary), str(folder / "nothing_worker.c")], check=True
        )
        build_image(TAG, base, folder, binary)


def helper_source() -> str:
    """The Python worker's ``<builtins>`` source, its Python callables as Starlark stubs."""
    from codemode_worker import environment

    # The worker's own source and names (private to it: this benchmark prices exactly that module).
    stubs = "".join(f"def {name}(*args):\n    return None\n" for name in environment._python_callables())
    return stubs + f"MAX_BRIDGE_DEPTH = {environment.MAX_BRIDGE_DEPTH}\n" + environment._builtins_source()


def build_rust(base: str) -> None:
    """starlark_rust_worker built with cargo (its target/ is kept for the next run), as ``RUST_TAG``."""
    folder = HERE / "starlark_rust_worker"
    cargo = shutil.which("cargo")
    if cargo is None:
        raise SystemExit("--rust needs cargo (https://rustup.rs) and crates.io")
    (folder / "env.star").write_text(helper_source())
    print("building starlark_rust_worker with cargo (a few minutes the first time) ...", flush=True)
    subprocess.run([cargo, "build", "--release", "--locked", "--quiet"], cwd=folder, check=True)
    build_image(RUST_TAG, base, folder, folder / "target" / "release" / "starlark_rust_worker")


async def run(args: argparse.Namespace) -> None:
    builds: list[tuple[str, Callable[[str], None]]] = [(TAG, build_nothing)]
    series = {
        "worker": Series(args.image, None, "default mode, the worker"),
        "nothing": Series(TAG, ("/nothing_worker",), "default mode, nothing_worker"),
    }
    if args.rust:
        builds.append((RUST_TAG, build_rust))
        series["rust"] = Series(RUST_TAG, ("/starlark_rust_worker",), "default mode, starlark-rust")
    api = docker.APIClient(version="auto", timeout=60)
    results: dict[str, list[tuple[float, float]]] = {"raw": [], **{name: [] for name in series}}
    order = list(results)
    print(
        f"{args.rounds} rounds of {args.n} containers or executes per series, 4 at a time, pool 4, "
        f"image {args.image}"
    )
    try:
        for _, build in builds:
            build(args.image)
        for r in range(args.rounds):
            # The order turns round by round: a machine that speeds up or slows down over a round
            # favours no series.
            for name in order if r % 2 == 0 else order[::-1]:
                cpu = MachineCPU()
                if name == "raw":
                    with cpu:
                        rate = await asyncio.to_thread(raw_rate, api, args.image, None, 4, args.n)
                else:
                    image, entry, _ = series[name]
                    rate = await default_rate(image, None, 4, 4, args.n, cpu, entrypoint=entry)
                results[name].append((rate, 1000 * cpu.busy / args.n))
            print(
                f"round {r + 1}: "
                + ", ".join(f"{k} {v[-1][0]:.2f}/s ({v[-1][1]:.0f} ms CPU)" for k, v in results.items())
            )
    finally:
        for tag, _ in builds:
            with contextlib.suppress(docker.errors.ImageNotFound):
                api.remove_image(tag, force=True)
        api.close()
    raw = statistics.median(x[0] for x in results["raw"])
    print(
        f"raw engine                       {raw:6.2f} containers/s (median), "
        f"machine CPU {statistics.median(x[1] for x in results['raw']):.1f} ms per container"
    )
    for name, (_, _, label) in series.items():
        rate = statistics.median(x[0] for x in results[name])
        cpu_ms = statistics.median(x[1] for x in results[name])
        print(
            f"{label:<32} {rate:6.2f} executes/s = {rate / raw:.2f}x the raw rate (goal >= 1.5), "
            f"machine CPU {cpu_ms:.1f} ms per execute"
        )
        ratios = sorted(x[0] / y[0] for x, y in zip(results[name], results["raw"], strict=True))
        print(
            f"{'':<32} against the raw rate of the same round: median {statistics.median(ratios):.2f}x, "
            f"rounds {ratios[0]:.2f}-{ratios[-1]:.2f}x, "
            f"{sum(q >= 1.5 for q in ratios)} of {len(ratios)} >= 1.5"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", default=DEFAULT_IMAGE)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=40, help="containers or executes per series")
    p.add_argument("--rust", action="store_true", help="add the starlark-rust worker's series (cargo)")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
