"""The worker pod, as data: the hardened manifest ``KubernetesRuntime`` submits and the reading of a
starting pod's status. Pure functions over ``kubernetes.client`` models, no API I/O.

Sizing (docs/kubernetes.md, "Sizing"): memory and ephemeral storage have requests = limits (the
memory limit is the worker's OOM boundary and is what the scheduler reserves); CPU has a small
request (what the scheduler reserves per worker, default 100m) and a limit (the most one worker may
burn, default 1 CPU). The pod's QoS class is therefore ``Burstable``; with ``cpu_request == cpu``
it is ``Guaranteed``. Workers have no network: ``dnsPolicy: None`` with an empty resolver list (no
cluster DNS warning, nothing to resolve with), and the deny-all NetworkPolicy of k8s/ where a CNI
enforces it. (``dnsPolicy: None`` requires one nameserver: 127.0.0.1, where nothing listens.)

Spread (docs/kubernetes.md, "Several nodes"): one ``topologySpreadConstraint`` on
``kubernetes.io/hostname`` over every worker pod of the namespace (``io.codemode.role=worker``, all
replicas' workers: they share the nodes), ``maxSkew: 1``, ``whenUnsatisfiable: ScheduleAnyway``. It
is a scoring preference, so a full or lone node never leaves a worker Pending because of it.

Avoided nodes (docs/kubernetes.md, "A node lost mid-execute"): while the runtime suspects a node
dead, its new pods carry a required node affinity ``metadata.name NotIn [...]`` (``avoid_nodes``);
otherwise the pod has no affinity at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kubernetes import client as k8s

from codemode_worker import STDERR_BOUNDED, STDERR_VARIABLE, WORKER_ENV_MARKER

from .options import DEFAULT_IMAGE as DEFAULT_IMAGE

__all__ = [
    "CONTAINER_NAME",
    "DEFAULT_IMAGE",
    "INSTANCE_LABEL",
    "MIN_KUBERNETES",
    "OWNER_LABEL",
    "PROTOCOL_LABEL",
    "ROLE_LABEL",
    "SPREAD_TOPOLOGY_KEY",
    "WORKER_UID",
    "PodSizing",
    "Progress",
    "acknowledged",
    "avoid_nodes",
    "progress",
    "scheduled",
    "spread",
    "worker_pod",
    "worker_status",
]

CONTAINER_NAME = "worker"
#: The numeric non-root user and group every worker runs as.
WORKER_UID = 65532
ROLE_LABEL = "io.codemode.role"
OWNER_LABEL = "io.codemode.owner"
INSTANCE_LABEL = "io.codemode.runtime-instance"
PROTOCOL_LABEL = "io.codemode.protocol-version"
#: The topology the worker pods spread over: the node.
SPREAD_TOPOLOGY_KEY = "kubernetes.io/hostname"
#: Oldest Kubernetes the runtime and k8s/ support: Pod Security admission (``restricted`` on the
#: workers' namespace) is GA from 1.25. Proven on 1.34 (docs/kubernetes.md).
MIN_KUBERNETES = (1, 25)

#: Container waiting reasons that will not resolve by waiting: the image can't be had.
_IMAGE_REASONS = ("ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "ErrImagePull")

Progress = Literal["running", "waiting", "unschedulable", "ended", "no-image"]


@dataclass(frozen=True)
class PodSizing:
    """Resources of the worker container (Kubernetes quantities): ``memory`` (request and limit),
    ``cpu`` (limit), ``cpu_request`` and ``ephemeral_storage`` (request and limit)."""

    memory: str = "256Mi"
    cpu: str = "1"
    cpu_request: str = "100m"
    ephemeral_storage: str = "64Mi"

    def requests(self) -> dict[str, str]:
        """The container's ``resources.requests``.

        Returns:
            ``{memory, cpu, ephemeral-storage}`` (``cpu`` is ``cpu_request``).
        """
        return {"memory": self.memory, "cpu": self.cpu_request, "ephemeral-storage": self.ephemeral_storage}

    def limits(self) -> dict[str, str]:
        """The container's ``resources.limits``.

        Returns:
            ``{memory, cpu, ephemeral-storage}``.
        """
        return {"memory": self.memory, "cpu": self.cpu, "ephemeral-storage": self.ephemeral_storage}


def spread(role: str) -> list[k8s.V1TopologySpreadConstraint]:
    """The worker pods' spread over the nodes (a preference, never a reason to stay Pending).

    Worker pods belong to no Service or ReplicaSet, so the scheduler's built-in default spread
    does not apply to them, and its resource scores alone send a burst of workers to the node
    with the most free requests. A ``topologySpreadConstraint`` states the intent (balance the
    counts per node, ``maxSkew: 1``) rather than a preferred pod anti-affinity, which says
    "avoid sharing a node" (workers share nodes by the dozen) and is the costlier rule to
    schedule: pods are created at the execute rate. ``ScheduleAnyway``: one node, or room on a
    single node only, still schedules every worker at once.

    Args:
        role: the value of the workers' ``io.codemode.role`` label.

    Returns:
        The pod's ``topologySpreadConstraints``.
    """
    return [
        k8s.V1TopologySpreadConstraint(
            max_skew=1,
            topology_key=SPREAD_TOPOLOGY_KEY,
            when_unsatisfiable="ScheduleAnyway",
            label_selector=k8s.V1LabelSelector(match_labels={ROLE_LABEL: role}),
        )
    ]


def avoid_nodes(nodes: list[str]) -> k8s.V1Affinity | None:
    """A required node affinity that keeps a pod off these nodes (by node name, not by a label a
    node might not carry).

    Args:
        nodes: the node names to avoid.

    Returns:
        The pod's ``affinity``, or None when there is nothing to avoid.
    """
    if not nodes:
        return None
    off = k8s.V1NodeSelectorRequirement(key="metadata.name", operator="NotIn", values=list(nodes))
    term = k8s.V1NodeSelectorTerm(match_fields=[off])
    return k8s.V1Affinity(
        node_affinity=k8s.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(node_selector_terms=[term])
        )
    )


def _worker_container(
    image: str, command: list[str] | None, image_pull_policy: str, env: list[k8s.V1EnvVar], sizing: PodSizing
) -> k8s.V1Container:
    """The worker container: stdin once, non-root, read-only, no capabilities, sized."""
    return k8s.V1Container(
        name=CONTAINER_NAME,
        image=image,
        command=command,
        image_pull_policy=image_pull_policy,
        stdin=True,
        stdin_once=True,
        tty=False,
        working_dir="/",
        env=env,
        resources=k8s.V1ResourceRequirements(requests=sizing.requests(), limits=sizing.limits()),
        security_context=k8s.V1SecurityContext(
            read_only_root_filesystem=True,
            allow_privilege_escalation=False,
            privileged=False,
            capabilities=k8s.V1Capabilities(drop=["ALL"]),
            run_as_non_root=True,
            run_as_user=WORKER_UID,
            run_as_group=WORKER_UID,
        ),
        # gVisor mounts a writable tmpfs at /tmp unless the spec has one, and every pod gets a
        # writable /dev/shm: shadow both with an empty, read-only, tiny tmpfs.
        volume_mounts=[
            k8s.V1VolumeMount(name="empty", mount_path="/tmp", read_only=True),
            k8s.V1VolumeMount(name="empty", mount_path="/dev/shm", read_only=True),
        ],
    )


def worker_pod(
    pod_name: str,
    *,
    namespace: str,
    image: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    sizing: PodSizing,
    runtime_class: str | None,
    max_lifetime: int,
    seccomp_profile: str | None = None,
    image_pull_policy: str,
    env_marker: str = WORKER_ENV_MARKER,
    command: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
    avoided_nodes: list[str] | None = None,
) -> k8s.V1Pod:
    """The exact pod ``KubernetesRuntime.spawn()`` submits.

    Args:
        pod_name: the pod's name.
        namespace: the workers' namespace.
        image: the worker image.
        labels: the pod's labels (role and owner).
        annotations: the pod's annotations.
        sizing: the worker container's resources.
        runtime_class: the RuntimeClass (gVisor, Kata), or None.
        max_lifetime: ``activeDeadlineSeconds``.
        seccomp_profile: a ``Localhost`` profile instead of ``RuntimeDefault``, or None.
        image_pull_policy: the container's ``imagePullPolicy``.
        env_marker: the variable that tells the worker it runs in a worker pod.
        command: replaces the image's entrypoint (only the test-only worker entry uses it).
        extra_env: more variables for the worker.
        avoided_nodes: nodes the pod must not run on (suspected dead), or None.

    Returns:
        The pod object.
    """
    # A pod's stderr is its container log on the node's disk (the kubelet bounds it against
    # ephemeral-storage only every few seconds): the confined worker bounds it.
    env = [k8s.V1EnvVar(name=env_marker, value="1"), k8s.V1EnvVar(name=STDERR_VARIABLE, value=STDERR_BOUNDED)]
    env += [k8s.V1EnvVar(name=name, value=value) for name, value in (extra_env or {}).items()]
    container = _worker_container(image, command, image_pull_policy, env, sizing)
    return k8s.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=k8s.V1ObjectMeta(name=pod_name, namespace=namespace, labels=labels, annotations=annotations),
        spec=k8s.V1PodSpec(
            containers=[container],
            restart_policy="Never",
            automount_service_account_token=False,
            enable_service_links=False,
            host_network=False,
            host_pid=False,
            host_ipc=False,
            share_process_namespace=False,
            hostname="worker",
            # Workers have no network at all (deny-all NetworkPolicy), so no cluster DNS either.
            # dnsPolicy None needs one nameserver: loopback, where nothing answers.
            dns_policy="None",
            dns_config=k8s.V1PodDNSConfig(nameservers=["127.0.0.1"]),
            active_deadline_seconds=max_lifetime,
            termination_grace_period_seconds=1,
            runtime_class_name=runtime_class,
            topology_spread_constraints=spread(labels[ROLE_LABEL]),
            affinity=avoid_nodes(avoided_nodes or []),
            security_context=k8s.V1PodSecurityContext(
                run_as_non_root=True,
                run_as_user=WORKER_UID,
                run_as_group=WORKER_UID,
                seccomp_profile=(
                    k8s.V1SeccompProfile(type="RuntimeDefault")
                    if seccomp_profile is None
                    else k8s.V1SeccompProfile(type="Localhost", localhost_profile=seccomp_profile)
                ),
            ),
            volumes=[
                k8s.V1Volume(
                    name="empty", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit="4Ki")
                )
            ],
        ),
    )


def worker_status(pod: Any) -> Any:
    """The worker container's status in a pod.

    Args:
        pod: the pod as the API returned it.

    Returns:
        Its container status, or None.
    """
    for cs in getattr(pod.status, "container_statuses", None) or []:
        if cs.name == CONTAINER_NAME:
            return cs
    return None


def scheduled(pod: Any) -> bool:
    """Whether the scheduler has bound a pod to a node.

    Args:
        pod: the pod as the API returned it.

    Returns:
        True once it has a node.
    """
    if getattr(pod.spec, "node_name", None):
        return True
    return any(
        c.type == "PodScheduled" and c.status == "True" for c in getattr(pod.status, "conditions", None) or []
    )


def acknowledged(pod: Any) -> bool:
    """Whether the kubelet of the pod's node has accepted it (it sets ``status.startTime`` then).

    Args:
        pod: the pod as the API returned it.

    Returns:
        True once the node's kubelet has taken the pod on.
    """
    return getattr(pod.status, "start_time", None) is not None


def progress(pod: Any) -> tuple[Progress, str]:
    """Where a starting pod is.

    Args:
        pod: the pod as the API returned it.

    Returns:
        The progress, and a short description for host logs.
    """
    status = pod.status
    phase = getattr(status, "phase", None) or "Pending"
    cs = worker_status(pod)
    state = getattr(cs, "state", None)
    if phase in ("Succeeded", "Failed") or getattr(state, "terminated", None) is not None:
        term = getattr(state, "terminated", None)
        detail = f"phase {phase}"
        if getattr(status, "reason", None):
            detail += f", {status.reason}"
        if term is not None:
            detail += f", container exited {term.exit_code} ({term.reason or 'no reason'})"
        return "ended", detail
    if getattr(state, "running", None) is not None and phase == "Running":
        return "running", "running"
    waiting = getattr(state, "waiting", None)
    if waiting is not None:
        detail = f"container waiting: {waiting.reason or '?'}"
        if waiting.message:
            detail += f": {waiting.message[:200]}"
        return ("no-image" if waiting.reason in _IMAGE_REASONS else "waiting"), detail
    for cond in getattr(status, "conditions", None) or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            detail = f"not scheduled: {cond.reason or '?'}: {(cond.message or '')[:200]}"
            return ("unschedulable" if cond.reason == "Unschedulable" else "waiting"), detail
    return "waiting", f"phase {phase}"
