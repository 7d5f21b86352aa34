"""The spawn-time handshake every runtime uses: send ``probe``, wait for ``probe_ack``.

The worker answers only once its interpreter is warm, so a sandbox that passed the probe is ready
to run a program at once. Anything else within the timeout is a failed spawn.
"""

from __future__ import annotations

import asyncio

from codemode_worker import PROTOCOL_VERSION
from codemode_worker.protocol import FrameDecoder, ProtocolError, encode_frame

from .base import Sandbox, SandboxClosed, SpawnFailed

__all__ = ["PROBE", "probe"]

_ACK_FRAME_LIMIT = 4096
#: The probe frame, as the host sends it.
PROBE = encode_frame({"k": "probe", "v": PROTOCOL_VERSION})


async def probe(sandbox: Sandbox, timeout: float, *, sent: bool = False) -> None:
    """Send the probe and wait for the worker's acknowledgement.

    Args:
        sandbox: the started worker.
        timeout: seconds to wait.
        sent: the launch has sent ``PROBE`` already (the Kubernetes runtime's early attach proves
            its stream with it): only wait for the answer.

    Raises:
        SpawnFailed: the worker did not acknowledge the probe with our protocol version in time.
    """
    decoder = FrameDecoder(_ACK_FRAME_LIMIT)
    try:
        async with asyncio.timeout(timeout):
            if not sent:
                await sandbox.write(PROBE)
            while True:
                data = await sandbox.read(_ACK_FRAME_LIMIT)
                if not data:
                    raise SpawnFailed(f"worker {sandbox.worker_id} exited before acknowledging the probe")
                frames = decoder.feed(data)
                if not frames:
                    continue
                ack = frames[0]
                if len(frames) > 1 or ack["k"] != "probe_ack" or ack["v"] != PROTOCOL_VERSION:
                    raise SpawnFailed(f"worker {sandbox.worker_id} answered the probe with {ack['k']!r}")
                return
    except TimeoutError:
        raise SpawnFailed(f"worker {sandbox.worker_id} did not acknowledge the probe in {timeout}s") from None
    except SandboxClosed:
        raise SpawnFailed(f"worker {sandbox.worker_id} closed its input during the probe") from None
    except ProtocolError as exc:
        raise SpawnFailed(f"worker {sandbox.worker_id} broke the protocol during the probe: {exc}") from None
