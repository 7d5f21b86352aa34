"""The TEST-ONLY worker entry shared by the container runtimes.

``codemode_worker.testing_entry`` answers probes like the real worker, then runs the exec frame's
source as arbitrary **Python**. It refuses to start unless ``TESTING_ENV`` is ``1`` in its
environment, which the container runtimes set only when built with ``testing_entry=True`` (tests
and benchmarks give it to a ``ProcessRuntime`` through ``extra_env``); no setting or flag reaches
it. It exists to prove that a container or pod contains a compromised interpreter, and to measure
the transport without the Starlark side; never enable it in a deployment.
"""

from __future__ import annotations

__all__ = ["TESTING_ENTRY", "TESTING_ENV", "WARNING"]

#: The worker's command line in the image (replaces its entrypoint).
TESTING_ENTRY: tuple[str, ...] = ("python3", "-I", "-m", "codemode_worker.testing_entry")
#: The variable that enables it (``codemode_worker.testing_entry.ENABLE_VARIABLE``; not imported from
#: there, which would load the interpreter into the host).
TESTING_ENV = "CODEMODE_WORKER_TESTING"
#: Logged once by a runtime built with the test-only entry.
WARNING = "%s runtime uses the TEST-ONLY worker entry (arbitrary Python)"
