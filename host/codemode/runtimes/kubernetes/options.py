"""``KubernetesOptions``: every option of the Kubernetes runtime, checked when it is made.

``KubernetesRuntime(options)`` takes them whole. The names are the runtime's one name per concept
(docs/reference/runtimes.md): ``memory`` the worker's memory, ``image`` its image; the settings
(``settings.kubernetes``: the ``--kubernetes-<name>`` flags, ``CODEMODE_KUBERNETES_<NAME>``
variables and the ``[kubernetes]`` TOML table) set the ones an operator may choose, and the others
are for tests, benchmarks and operator tools. A refused value raises :class:`OptionError`, one
line naming the option. This module imports no Kubernetes client until a quantity is checked.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from codemode_worker import PROTOCOL_VERSION

from ...common.extras import require
from ..base import OptionError
from ..streams import STDOUT_BUFFER, CleanupMode

#: What needs the ``kubernetes`` extra, as its missing-extra error names it.
KUBERNETES_FEATURE = "the Kubernetes runtime"

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_NAMESPACE",
    "CleanupMode",
    "KubernetesOptions",
    "OptionError",
    "PullPolicy",
]

#: The worker image; its tag is the protocol version it speaks.
DEFAULT_IMAGE = f"codemode-worker:{PROTOCOL_VERSION}"
DEFAULT_NAMESPACE = "codemode-workers"

PullPolicy = Literal["IfNotPresent", "Always", "Never"]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
#: Options in seconds: those that must be positive, and those that may be 0.
_POSITIVE_SECONDS = (
    "spawn_timeout",
    "probe_timeout",
    "api_timeout",
    "check_timeout",
    "node_ack_timeout",
    "end_timeout",
)
_SECONDS = ("unschedulable_grace", "node_quarantine", "exit_wait")


def _under_seccomp_root(path: str) -> bool:
    """A relative path of plain segments (no ``.``, ``..`` or empty one): a file under the kubelet's
    seccomp root."""
    return all(_PATH_SEGMENT.fullmatch(part) and part not in (".", "..") for part in path.split("/"))


def _quantity(option: str, value: str) -> Any:
    """``value`` as a number (a ``decimal.Decimal``), if it is a positive Kubernetes quantity."""
    require("kubernetes", "kubernetes", KUBERNETES_FEATURE)
    from kubernetes.utils import parse_quantity

    try:
        number = parse_quantity(value)  # type: ignore[no-untyped-call]
    except (ValueError, TypeError):
        number = None
    if number is None or number <= 0:
        raise OptionError(option, f"{option} {value!r} is not a positive Kubernetes quantity")
    return number


@dataclass(frozen=True)
class KubernetesOptions:
    """Every option of ``KubernetesRuntime``, frozen and checked.

    Args:
        namespace: where worker pods run (label it Pod Security ``restricted``; see k8s/).
        image: the worker image (default ``codemode-worker:<protocol version>``).
        memory: the worker container's memory request = limit (a quantity, ``256Mi``).
        cpu: its CPU limit (a quantity, default 1 CPU).
        cpu_request: what the scheduler reserves per worker (default ``100m``; docs/kubernetes.md,
            "Sizing": QoS Burstable, or Guaranteed when it equals ``cpu``); at most ``cpu``.
        ephemeral_storage: the worker container's ephemeral-storage request = limit.
        runtime_class: a RuntimeClass name (e.g. ``"gvisor"``), or None for the cluster default.
        seccomp_profile: a ``Localhost`` seccomp profile for the pods, relative to the kubelet's
            seccomp root (e.g. ``"codemode-worker.json"``, made with ``python -m
            codemode.runtimes.seccomp_profile``; in the reuse mode the supervisor's,
            ``--supervisor``), or None for ``RuntimeDefault``. The worker installs its own filter
            on top either way.
        kubeconfig: a kubeconfig file. Without it and ``context`` the client is configured, first
            match wins, from: the default configuration a caller loaded
            (``kubernetes.config.load_kube_config(...)``); in-cluster; ``$KUBECONFIG`` or
            ``~/.kube/config`` as of the first API call.
        context: a context in that kubeconfig.
        owner: this host's instance id, written to the ``io.codemode.owner`` label (default:
            random per host process, renewed after fork).
        cleanup_orphans: what ``start()`` deletes: ``"dead"`` (worker pods whose owner is provably
            dead), ``"all"`` (every worker pod not owned by this instance), ``"none"``.
        spawn_timeout: seconds from pod creation until its container runs and is attached.
        unschedulable_grace: seconds a pod may stay unschedulable (no node has room) before the
            spawn fails with ``CapacityExhausted``.
        node_ack_timeout: seconds a pod bound to a node may wait for that node's kubelet to
            acknowledge it before the node is checked (and again every ``node_ack_timeout``):
            when the API server cannot reach the kubelet, the node is suspected dead, the pod
            deleted and the spawn tried again on another node; a kubelet that answers is only
            slow, and the pod is waited for (docs/kubernetes.md, "A node lost mid-execute").
        node_quarantine: seconds new pods avoid a node suspected dead (0: never avoid one).
        probe_timeout: seconds for the attached worker to answer the probe (counted from the
            attach that reached it).
        api_timeout: seconds for one API call.
        check_timeout: seconds for ``check()`` as a whole.
        exit_wait: seconds ``destroy()`` waits for an exited worker's terminated state.
        max_lifetime: ``activeDeadlineSeconds`` of every pod: a backstop for pods nobody deletes.
        image_pull_policy: of the worker container.
        stdout_buffer_bytes: how much worker stdout is buffered before the reader stops reading
            (at least 64 KiB are).
        executor_threads: size of the thread pool that runs blocking client calls.
        entrypoint: replaces the image's command (operators' diagnostics only: ``codemode quotas
            tune`` runs the image's worker through a holding wrapper); None = the image's.
        supervisor_entrypoint: the command of a reusable pod (``spawn_supervised``, the reuse
            mode; default ``python3 -I -m codemode_worker.supervisor``, ``--testing`` under
            ``testing_entry``); tests only.
        end_timeout: seconds a reusable pod's supervisor has to end an execute's worker, scrub and
            verify before the pod is recycled instead.
        attach_early: attach from the moment the pod is scheduled, retrying the exact "not
            running yet" refusals, rather than once the API reports it Running (up to a second
            later: the kubelet's relist); False only to measure or to rule it out.
        testing_entry: TEST ONLY. Runs ``codemode_worker.testing_entry`` with
            ``CODEMODE_WORKER_TESTING=1`` (use the test image, ``codemode-worker-testing``): a
            worker that executes arbitrary Python. It exists to prove the pod contains a
            compromised interpreter and to measure the attach channel without Starlark; never
            enable it in a deployment. Excludes ``entrypoint``.

    Raises:
        OptionError: a value is refused (one line naming the option).
    """

    namespace: str = DEFAULT_NAMESPACE
    image: str = DEFAULT_IMAGE
    memory: str = "256Mi"
    cpu: str = "1"
    cpu_request: str = "100m"
    ephemeral_storage: str = "64Mi"
    runtime_class: str | None = None
    seccomp_profile: str | None = None
    kubeconfig: str | os.PathLike[str] | None = None
    context: str | None = None
    owner: str | None = None
    cleanup_orphans: CleanupMode = "dead"
    spawn_timeout: float = 60.0
    unschedulable_grace: float = 2.0
    node_ack_timeout: float = 5.0
    node_quarantine: float = 60.0
    probe_timeout: float = 10.0
    api_timeout: float = 30.0
    check_timeout: float = 5.0
    exit_wait: float = 3.0
    max_lifetime: int = 3600
    image_pull_policy: PullPolicy = "IfNotPresent"
    stdout_buffer_bytes: int = STDOUT_BUFFER
    executor_threads: int = 32
    entrypoint: Sequence[str] | None = None
    supervisor_entrypoint: Sequence[str] | None = None
    end_timeout: float = 5.0
    attach_early: bool = True
    testing_entry: bool = False

    def __post_init__(self) -> None:
        for name in ("entrypoint", "supervisor_entrypoint"):
            command = getattr(self, name)
            if command is not None:
                command = tuple(command)
                if not command or not all(isinstance(part, str) and part for part in command):
                    raise OptionError(name, f"{name} must be a non-empty list of non-empty strings")
                object.__setattr__(self, name, command)  # frozen: a tuple nobody can change
        self._check_names()
        self._check_sizes()
        self._check_times()
        if self.cleanup_orphans not in ("dead", "all", "none"):
            raise OptionError("cleanup_orphans", "cleanup_orphans must be 'dead', 'all' or 'none'")
        if self.image_pull_policy not in ("IfNotPresent", "Always", "Never"):
            raise OptionError(
                "image_pull_policy", "image_pull_policy must be 'IfNotPresent', 'Always' or 'Never'"
            )
        if self.testing_entry and self.entrypoint is not None:
            raise OptionError("entrypoint", "entrypoint and testing_entry exclude each other")

    def _check_names(self) -> None:
        if not _DNS_LABEL.fullmatch(self.namespace):
            raise OptionError("namespace", f"namespace {self.namespace!r} is not a DNS label")
        if not self.image.strip():
            raise OptionError("image", "image must not be empty")
        if self.runtime_class is not None and not _DNS_LABEL.fullmatch(self.runtime_class):
            raise OptionError(
                "runtime_class", f"runtime_class {self.runtime_class!r} is not a valid RuntimeClass name"
            )
        if self.seccomp_profile is not None and not _under_seccomp_root(self.seccomp_profile):
            raise OptionError(
                "seccomp_profile",
                f"seccomp_profile {self.seccomp_profile!r} is not a path relative to the kubelet's"
                " seccomp root",
            )
        if self.owner is not None and not _LABEL_VALUE.fullmatch(self.owner):
            raise OptionError("owner", f"owner {self.owner!r} is not a valid label value")

    def _check_sizes(self) -> None:
        for name in ("memory", "ephemeral_storage"):
            _quantity(name, getattr(self, name))
        if _quantity("cpu_request", self.cpu_request) > _quantity("cpu", self.cpu):
            raise OptionError(
                "cpu_request", f"cpu_request {self.cpu_request!r} exceeds the cpu limit {self.cpu!r}"
            )
        for name in ("max_lifetime", "stdout_buffer_bytes", "executor_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise OptionError(name, f"{name} must be a positive whole number, got {value!r}")

    def _check_times(self) -> None:
        for name in _POSITIVE_SECONDS + _SECONDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise OptionError(name, f"{name} must be a number of seconds, got {value!r}")
            if value < 0 or (value == 0 and name in _POSITIVE_SECONDS):
                least = "positive" if name in _POSITIVE_SECONDS else "0 or more"
                raise OptionError(name, f"{name} must be {least}, got {value!r}")
