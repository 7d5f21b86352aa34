"""What ``bench_service_load`` needs for the container runtimes (not a benchmark of its own).

``add_arguments`` adds ``--reuse N`` (the reuse mode: ``CODEMODE_REUSE_EXECUTES``), and
``--kubeconfig``, ``--namespace`` and ``--cpu-request`` for ``--runtime kubernetes``; ``server_env``
turns them (and ``--image``) into the server's environment; ``leaked`` counts the worker pods the
server left behind; ``mark`` calls ``args.on_load(server_pid)`` (when a caller set one) as the load
starts and ends.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Callable

RUNTIMES = ("process", "docker", "kubernetes")
KUBECONFIG = os.environ.get("CODEMODE_KUBECONFIG", "/var/lib/codemode-k8s/admin.kubeconfig")
KUBECTL = os.environ.get("CODEMODE_KUBECTL", "/var/cache/codemode/kubernetes/v1.34.4/bin/kubectl")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reuse",
        type=int,
        default=0,
        help="the reuse mode: executes per sandbox (CODEMODE_REUSE_EXECUTES; docker, kubernetes; 0 = off)",
    )
    parser.add_argument("--kubeconfig", default=KUBECONFIG, help="for --runtime kubernetes")
    parser.add_argument("--namespace", default="codemode-workers", help="worker pods' namespace")
    parser.add_argument(
        "--cpu-request",
        help="each worker pod's CPU request (CODEMODE_KUBERNETES_CPU_REQUEST; default the runtime's 100m): "
        "a one-node cluster fits only so many pods",
    )


def server_env(args: argparse.Namespace) -> dict[str, str]:
    env: dict[str, str] = {}
    if args.runtime == "kubernetes":
        env["CODEMODE_KUBERNETES_KUBECONFIG"] = args.kubeconfig
        env["CODEMODE_KUBERNETES_NAMESPACE"] = args.namespace
        if args.image:
            env["CODEMODE_KUBERNETES_IMAGE"] = args.image
        if getattr(args, "cpu_request", None):
            env["CODEMODE_KUBERNETES_CPU_REQUEST"] = args.cpu_request
    elif args.runtime == "docker" and args.image:
        env["CODEMODE_DOCKER_IMAGE"] = args.image
    if args.reuse:
        env["CODEMODE_REUSE_EXECUTES"] = str(args.reuse)
    return env


def leaked(args: argparse.Namespace, server_pid: int) -> int | None:
    """Worker pods of the finished server not being deleted (``--runtime kubernetes``; None
    otherwise or when kubectl cannot tell)."""
    if args.runtime != "kubernetes":
        return None
    fields = "{.metadata.annotations.io\\.codemode\\.owner-pid} {.metadata.deletionTimestamp}"
    cmd = [KUBECTL, "--kubeconfig", args.kubeconfig, "get", "pods", "-n", args.namespace]
    cmd += ["-l", "io.codemode.role=worker", "-o", "jsonpath={range .items[*]}" + fields + "{'\\n'}{end}"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return sum(1 for row in rows if row == [str(server_pid)])


def mark(args: argparse.Namespace, server_pid: int) -> None:
    """The load starts or ends: tell the caller's ``on_load`` (bench_reuse meters CPU with it)."""
    on_load: Callable[[int], None] | None = getattr(args, "on_load", None)
    if on_load is not None:
        on_load(server_pid)
