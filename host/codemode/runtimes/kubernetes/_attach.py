"""The attach websocket to a worker pod: its channels and frames, when a small write may go out on
the event loop's thread (``_has_room``), the exact "not running yet" refusals an early attach may
retry, and opening the stream with a bounded upgrade (docs/kubernetes.md, "Streams" and "Start-up
phases"). The sandbox (``runtime``) and the launch (``_launch``) speak through these."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import socket
import struct
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from kubernetes import client as k8s

from .pod import CONTAINER_NAME
from .upgrade import bounded_upgrade

_WRITE_CHUNK = 64 * 1024
#: Frames up to this size may be sent on the event loop's thread (``KubernetesSandbox._send_now``).
_DIRECT_SEND_MAX = 4096
#: Free send-buffer bytes always left over by a send on the event loop's thread.
_SEND_MARGIN = 32 * 1024
#: Linux: the TCP_NOTSENT_LOWAT socket option and the ioctl that reads a socket's unsent bytes.
_TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
_SIOCOUTQNSD = 0x894B
_STDOUT, _STDERR, _ERROR, _CLOSE = 1, 2, 3, 255
_V5 = "v5.channel.k8s.io"
_OP_TEXT, _OP_BINARY, _OP_CLOSE = 0x1, 0x2, 0x8


def _close_reason(frame: Any) -> str:
    """A websocket close frame's status code and reason, for host logs."""
    data = getattr(frame, "data", b"") or b""
    if isinstance(data, str):
        data = data.encode()
    if len(data) < 2:
        return "no status"
    reason = data[2:200].decode("utf-8", "replace")
    return f"status {int.from_bytes(data[:2], 'big')}{': ' + reason if reason else ''}"


def _hangup(stream: Any) -> None:
    """Cut an attach stream now: wake any thread blocked on it and close its socket."""
    ws: Any = getattr(stream, "sock", None)
    _shut(ws)
    with contextlib.suppress(Exception):
        ws.shutdown()


def _shut(ws: Any) -> None:
    """Shut the websocket's socket down both ways: a thread blocked receiving or sending on it (a
    pool thread writing to a worker that stopped reading) wakes with an error. ``ws.abort()`` does
    this only while the client still counts itself connected; closing the descriptor wakes nobody."""
    with contextlib.suppress(Exception):
        ws.sock.shutdown(socket.SHUT_RDWR)


_system_notsent: tuple[float, int | None] = (-math.inf, None)


def _system_notsent_limit() -> int | None:
    """``net.ipv4.tcp_notsent_lowat`` (None: unlimited), read at most every 10 s."""
    global _system_notsent
    read_at, value = _system_notsent
    now = time.monotonic()
    if now - read_at > 10.0:
        try:
            with open("/proc/sys/net/ipv4/tcp_notsent_lowat", encoding="ascii") as fh:
                system = int(fh.read().strip())
            value = None if system >= 2**31 - 1 else system
        except (OSError, ValueError):
            value = 0  # unknown: treat as the smallest limit (no sends on the loop's thread)
        _system_notsent = (now, value)
    return value


def _notsent_limit(sock: Any) -> int | None:
    """The socket's TCP_NOTSENT_LOWAT (its own, else the system's): a send waits once this many bytes
    are not yet sent, whatever room the buffer has. None when unlimited."""
    own = sock.getsockopt(socket.IPPROTO_TCP, _TCP_NOTSENT_LOWAT)
    return int(own) if own > 0 else _system_notsent_limit()


def _outq(sock: Any, request: int) -> int:
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), request, b"\0\0\0\0"))[0])


def _has_room(sock: Any, size: int) -> bool:
    """Whether ``sock`` takes ``size`` more bytes (with a wide margin for framing and the kernel's
    per-packet overhead) without the sender waiting: room in the send buffer, and below the
    not-sent limit when one is set."""
    need = 4 * size + _SEND_MARGIN
    try:
        capacity = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2  # the kernel doubles it
        if _outq(sock, termios.TIOCOUTQ) + need > capacity:
            return False
        limit = _notsent_limit(sock)
        return limit is None or _outq(sock, _SIOCOUTQNSD) + need <= limit
    except (OSError, ValueError, AttributeError, TypeError):
        return False


#: What an attach to a pod whose worker container does not run yet is refused with, and by whom:
#: the API server before the pod is scheduled (HTTP 400); the kubelet before it has admitted the
#: pod (404) and until the container runtime lists the container as running (the kubelet asks it
#: directly, not through the PLEG cache the pod's status comes from). Through the API server's
#: websocket translator (1.30+) the kubelet's answer arrives as a Status on the error channel
#: ("unable to upgrade connection: <the kubelet's text>"); without it, as the handshake's status
#: and body. ``{pod}``/``{namespace}`` are the pod's; nothing else is ever retried.
_NOT_RUNNING_YET = (
    "pod {pod} does not have a host assigned",
    "unable to upgrade connection: container " + CONTAINER_NAME + " not found in pod {pod}_{namespace}",
    "unable to upgrade connection: pod does not exist",
)


def not_running_yet(refusal: str, pod: str, namespace: str) -> bool:
    """Whether an attach refusal says only that the pod's worker container does not run yet.

    Args:
        refusal: the API server's message: an error-channel Status message, or the handshake
            failure's text (status line, headers and body).
        pod: the pod attached to.
        namespace: its namespace.

    Returns:
        True when the refusal is one of the exact "not running yet" answers for this pod (worth
        retrying while the pod is starting); False for anything else.
    """
    return any(form.format(pod=pod, namespace=namespace) in refusal for form in _NOT_RUNNING_YET)


class _Refused(Exception):
    """One attach attempt was refused before it reached the worker container (``text``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


@dataclass
class _Attached:
    """A launched pod's attach stream, with what the worker sent before the sandbox took it over."""

    stream: Any
    early: list[bytes] = field(default_factory=list)


def _error_status(payload: bytes) -> tuple[str, str]:
    """``(status, message)`` of a Status sent on the error channel (``("", raw text)`` if it is
    not one)."""
    text = payload.decode("utf-8", "replace")
    with contextlib.suppress(ValueError, AttributeError):
        body = json.loads(text)
        status, message = body.get("status"), body.get("message")
        return (status if isinstance(status, str) else ""), (message if isinstance(message, str) else "")
    return "", text


def _default_attach() -> Callable[..., Any]:
    from kubernetes.stream import stream

    return cast("Callable[..., Any]", stream)


def _attach_method(api: Any) -> Callable[..., Any]:
    """``connect_get_namespaced_pod_attach`` on a CoreV1Api with an ApiClient of its own.

    ``kubernetes.stream.stream`` swaps ``call_api`` on the ApiClient behind the method for the
    duration of the call: on a shared client, REST calls that other threads make meanwhile
    would be sent as websocket requests. A fresh client shares only the configuration.
    """
    method: Callable[..., Any] = api.connect_get_namespaced_pod_attach
    client = getattr(getattr(method, "__self__", None), "api_client", None)
    if isinstance(client, k8s.ApiClient):
        return cast(
            "Callable[..., Any]",
            k8s.CoreV1Api(k8s.ApiClient(client.configuration)).connect_get_namespaced_pod_attach,
        )
    return method


def _open_attach(
    attach: Callable[..., Any] | None,
    api: Any,
    pod_name: str,
    namespace: str,
    *,
    stdin: bool,
    upgrade_within: float,
) -> Any:
    """Attach to the worker container of ``pod_name``: stdin, stdout and stderr (the worker's
    channel), or its stderr only (``stdin=False``: the node check, which reads the error channel
    alone), with ``attach`` (default ``kubernetes.stream.stream``). The websocket's connect and
    upgrade take at most ``upgrade_within`` seconds each (``bounded_upgrade``: the client sets no
    bound of its own, so an API server or proxy that stalls the upgrade would hold this thread for
    ever)."""
    with bounded_upgrade(upgrade_within):
        return (attach or _default_attach())(
            _attach_method(api),
            pod_name,
            namespace,
            container=CONTAINER_NAME,
            stdin=stdin,
            stdout=stdin,
            stderr=True,
            tty=False,
            binary=True,
            _preload_content=False,
        )
