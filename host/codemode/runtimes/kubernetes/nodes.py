"""Nodes that stopped answering: how the Kubernetes runtime tells a lost node, and the short list of
nodes it keeps new worker pods away from (docs/kubernetes.md, "A node lost mid-execute").

The host may read and attach to pods only (no ``nodes`` or ``leases`` rights), so it judges a node
by what its pods show:

- **a spawn stuck on a silent node**: the scheduler bound the pod to a node, but that node's kubelet
  never acknowledged it (no ``status.startTime``, which the kubelet sets when it accepts a pod) within
  ``node_ack_timeout``, and an attach to the pod fails because the API server cannot dial that
  kubelet (the timer alone proves nothing: a loaded node's kubelet is slow to write it). A dead node
  stays Ready in the API for 40-50 s (until the node lifecycle controller misses its heartbeats),
  and the scheduler keeps binding pods to it meanwhile;
- **a worker lost mid-execute**: its attach stream broke while the API still says its container
  runs, and a fresh attach to it fails because the API server cannot dial the node's kubelet.

Either way the node is *suspected* for ``node_quarantine`` seconds: new worker pods carry a required
node affinity that excludes it (``pod.avoid_nodes``). The list is a hint, never a reason
to fail: a pod that no other node can take is made again without it.
"""

from __future__ import annotations

import re
import threading
import time

__all__ = ["NodeQuarantine", "kubelet_unreachable"]

#: What the API server answers when it cannot reach a node's kubelet: its stream translator's
#: failed request to the kubelet (1.30+; measured on 1.34 with the kubelet killed: ``Internal error
#: occurred: error sending request: Post "https://node-2:11250/attach/...": dial tcp
#: 127.0.0.1:11250: connect: connection refused``), its proxy's dial error, and the konnectivity
#: agent's when the API server reaches nodes through one.
_UNREACHABLE = re.compile(
    r"error sending request: [A-Z]+ \\?\"https?://[^\"\\]*\\?\": dial "
    r"|error dialing backend|no agent available",
    re.IGNORECASE,
)


def kubelet_unreachable(text: str) -> bool:
    """Whether an API error says the API server could not reach the node's kubelet.

    Args:
        text: the error's text (a Status message, or the websocket handshake's status and body).

    Returns:
        True for the API server's dial failures; False for anything the kubelet itself answered
        (e.g. a container that is no longer running) and for every other error.
    """
    return _UNREACHABLE.search(text) is not None


class NodeQuarantine:
    """The nodes suspected dead, each until a moment on the monotonic clock. Thread-safe."""

    def __init__(self, seconds: float) -> None:
        """An empty list.

        Args:
            seconds: how long a node stays suspected after the last evidence (0: never).
        """
        self.seconds = seconds
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def suspect(self, node: str) -> bool:
        """Suspect a node (again) for ``seconds`` from now.

        Args:
            node: the node's name.

        Returns:
            Whether it was not suspected before (the first evidence: worth an operator log).
        """
        if self.seconds <= 0 or not node:
            return False
        now = time.monotonic()
        with self._lock:
            fresh = self._until.get(node, 0.0) <= now
            self._until[node] = now + self.seconds
            return fresh

    def nodes(self) -> list[str]:
        """The nodes suspected now, sorted.

        Returns:
            Their names.
        """
        now = time.monotonic()
        with self._lock:
            for node in [n for n, until in self._until.items() if until <= now]:
                del self._until[node]
            return sorted(self._until)

    def forget(self, nodes: list[str]) -> None:
        """Suspect these nodes no more (no other node could take a worker).

        Args:
            nodes: their names.
        """
        with self._lock:
            for node in nodes:
                self._until.pop(node, None)
