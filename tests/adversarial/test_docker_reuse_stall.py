"""A compromised worker tries to stall its reusable sandbox's supervisor, on Docker.

The supervisor (PID 1) makes each worker's pipes, so the worker's uid owns them: the worker can
reopen its own stdout or stderr pipe through ``/proc/self/fd`` (the read end included), resize it,
and fill it with packets. A supervisor that blocks in a read or write of such a pipe reads no ``K``
and watches no pidfd: the worker then outlives its execute's deadline until the host gives up on the
epoch (5 s) and removes the container. Two attacks:

* ``PACKETS`` (a worker whose filter failed open: it needs ``pipe2`` and ``splice``): 200 one-byte
  packets reach its stderr pipe in one ``splice``. The supervisor used to splice what ``FIONREAD``
  counted (200 bytes) into its 32-slot stage pipe, which 31 packets fill: blocked for good.
* ``STEAL`` (under the worker's own filter too): a reopened read end takes one byte between the
  supervisor's ``FIONREAD`` and its ``splice``, which then waits for a byte that never comes. A race:
  the worker retries until its probe byte on stdout stays unrelayed (the supervisor is stuck).

Either way the worker then waits for its deadline; the execute's end must come from the supervisor
(``X`` and ``C`` within the host's bound), not from the host giving up. Each test prints the time from
the deadline to the end of the epoch (the worker killed, the sandbox removed).

Image: the test image (``CODEMODE_TEST_TESTING_IMAGE``). Skips locally without Docker; fails under
CI=true.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.common.errors import ResourceLimit
from codemode.runtimes.docker import DockerOptions, DockerRuntime
from tests.support.docker_engine import worker_containers
from tests.support.reuse import reuse_server

from . import reuse_probe as rp
from .test_docker_escape import OCI_RUNTIME, TESTING_IMAGE
from .test_docker_reuse import no_leaked_containers  # noqa: F401  (autouse: applies here too)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ALICE = authz.Subject("alice")
#: The execute's deadline: the attack runs within it, then the worker waits for it.
DEADLINE = 4.0

PACKETS = """
import fcntl, os, time
F_SETPIPE_SZ = 1031
r, w = os.pipe2(os.O_DIRECT)  # a packet pipe: every write is a buffer of its own
for fd in (w, 2):
    fcntl.fcntl(fd, F_SETPIPE_SZ, 1 << 20)  # room for 256 buffers
for _ in range(200):
    os.write(w, b"x")
os.splice(r, 2, 200)  # all 200 reach the stderr pipe at once
while True:
    time.sleep(1)
"""

STEAL = """
import fcntl, os, struct, sys, termios, time
def waiting(fd):
    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\\0\\0\\0\\0"), sys.byteorder)
thief = os.open("/proc/self/fd/2", os.O_RDONLY | os.O_NONBLOCK)  # the read end of its stderr pipe
frames = stdout.fileno()  # its stdout pipe (fd 1 is a copy of fd 2 in a worker)
os.write(frames, struct.pack(">I", 60000))  # a frame the host waits for: the probe bytes below are in it
burst = b"x" * 60000
end = time.monotonic() + DEADLINE - 1.0
attempt = 0
while time.monotonic() < end and attempt < 50000:
    attempt += 1
    os.write(2, burst)
    for _ in range(attempt % 97):
        pass
    try:
        os.read(thief, 1)
    except BlockingIOError:
        pass
    os.write(frames, b"p")  # relayed at once by a supervisor that is not stuck
    settle = time.monotonic() + 0.3
    while waiting(frames) and time.monotonic() < settle:
        time.sleep(0.001)
    if waiting(frames):
        break  # the supervisor is stuck (a byte more on stderr would free it: none comes)
while True:
    time.sleep(1)
"""


@pytest.fixture
async def server(request: pytest.FixtureRequest, docker_api: Any) -> AsyncIterator[codemode.Server]:
    """A reuse pool of one sandbox whose workers run with their filter (``confined``) or without
    it (``unconfined``: the default)."""
    variant = getattr(request, "param", "unconfined")
    command = rp.SUPERVISOR if variant == "confined" else rp.UNCONFINED
    rt = DockerRuntime(
        DockerOptions(
            oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE, supervisor_entrypoint=command
        )
    )
    srv, _, _ = await reuse_server(rt, limits=codemode.Limits(max_execution_time=DEADLINE))
    yield srv
    await srv.aclose()
    assert not worker_containers(docker_api, f"io.codemode.runtime-instance={rt.instance_id}")


async def _overrun(server: codemode.Server, program: str, caplog: pytest.LogCaptureFixture) -> float:
    """Run ``program`` to its deadline; the seconds from the deadline until its epoch has ended (the
    worker killed and the sandbox removed). Fails when the host had to give up on the epoch."""
    caplog.set_level(logging.WARNING, logger="codemode.runtimes.reuse")
    with pytest.raises(ResourceLimit):  # the deadline (ExecutionTimeout)
        await server.execute(program.replace("DEADLINE", repr(DEADLINE)), subject=ALICE)
    deadline = time.monotonic()
    await server._executor.drain()  # the background end of the epoch
    overrun = time.monotonic() - deadline
    print(f"epoch ended {overrun:.2f} s after the deadline")
    stuck = [r.getMessage() for r in caplog.records if "did not finish epoch" in r.getMessage()]
    assert not stuck, (stuck, f"overrun {overrun:.2f} s")
    return overrun


async def test_packets_in_its_own_pipe_do_not_stall_the_supervisor(
    server: codemode.Server, caplog: pytest.LogCaptureFixture
) -> None:
    await _overrun(server, PACKETS, caplog)
    assert await server.execute("final(1)", subject=ALICE) == 1  # the pool serves on


@pytest.mark.parametrize("server", ["confined", "unconfined"], indirect=True)
async def test_a_byte_stolen_from_its_own_pipe_does_not_stall_the_supervisor(
    server: codemode.Server, caplog: pytest.LogCaptureFixture
) -> None:
    await _overrun(server, STEAL, caplog)
    assert await server.execute("final(1)", subject=ALICE) == 1
