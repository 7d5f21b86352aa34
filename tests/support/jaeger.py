"""A real trace receiver for the tracing tests (no tests here): Jaeger v2, built from source through the
Go module proxy once and cached (``CODEMODE_JAEGER_DIR``, default ``~/.cache/codemode/jaeger``), run
with an in-memory store on free loopback ports, queried through its HTTP API.

The first build downloads Jaeger's modules and compiles it: about 5.5 minutes on the project's
2-core machine (about 30 s when Go's module and build caches are warm); later runs start the cached
binary (under a second). ``python -m tests.support.jaeger`` builds it ahead (``.ci/run`` does, in the
background beside the machine's provisioning); a test that needs it meanwhile waits on the build's
lock. ``CODEMODE_JAEGER_VERSION``
picks the version. Without Go the tests are skipped with a visible reason, except when ``CI=true``:
then they fail.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.environment import unavailable

VERSION = os.environ.get("CODEMODE_JAEGER_VERSION", "v1.76.0")
MODULE = "github.com/jaegertracing/jaeger/cmd/jaeger"
BUILD_SECONDS = 1500

CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: []
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{grpc}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp}
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


def _cache_dir() -> Path:
    default = Path.home() / ".cache" / "codemode" / "jaeger"
    return Path(os.environ.get("CODEMODE_JAEGER_DIR", str(default))) / VERSION


def jaeger_binary() -> Path:
    """The cached Jaeger binary, built first when missing (one build at a time: a file lock)."""
    where = _cache_dir()
    binary = where / "jaeger"
    if binary.exists():
        return binary
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        unavailable("Jaeger trace receiver", "go not found on PATH (Jaeger is built from source with Go)")
    assert go is not None
    where.mkdir(parents=True, exist_ok=True)
    with open(where.parent / f"{VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():
            return binary
        with tempfile.TemporaryDirectory(dir=where) as build:
            env = {**os.environ, "GOFLAGS": "-buildvcs=false", "GOWORK": "off"}
            steps = (
                [go, "mod", "init", "codemode-jaeger-build"],
                # Jaeger's own go.mod has replace directives, so `go install pkg@version` refuses it;
                # as a tool dependency of a module of ours it builds.
                [go, "get", "-tool", f"{MODULE}@{VERSION}"],
                [go, "build", "-o", str(where / "jaeger.partial"), MODULE],
            )
            started = time.monotonic()
            for step in steps:
                proc = subprocess.run(
                    step, cwd=build, env=env, capture_output=True, text=True, timeout=BUILD_SECONDS
                )
                if proc.returncode != 0:
                    unavailable(
                        "Jaeger trace receiver", f"{' '.join(step[1:3])} failed: {proc.stderr[-800:]}"
                    )
            (where / "jaeger.partial").rename(binary)
            print(f"built Jaeger {VERSION} in {time.monotonic() - started:.0f} s")
    return binary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Jaeger:
    otlp_port: int
    query_port: int

    @property
    def traces_endpoint(self) -> str:
        """The OTLP/HTTP traces URL (what ``trace_endpoint`` takes)."""
        return f"http://127.0.0.1:{self.otlp_port}/v1/traces"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.query_port}{path}", timeout=10) as resp:
            return json.load(resp)

    def traces_of(
        self, service: str, *, count: int, spans: int, timeout: float = 30.0
    ) -> list[dict[str, Any]]:
        """The traces of ``service`` once there are ``count`` of them with at least ``spans`` spans each
        (Jaeger's JSON, found through its search API)."""
        end = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < end:
            last = self.get(f"/api/traces?service={urllib.parse.quote(service)}&limit=100")
            found = [dict(t) for t in last.get("data") or [] if len(t["spans"]) >= spans]
            if len(found) >= count:
                return found
            time.sleep(0.2)
        raise AssertionError(f"{service} did not reach {count} traces of {spans} spans: {last}")


@contextlib.contextmanager
def running_jaeger(directory: Path) -> Iterator[Jaeger]:
    """Jaeger on free loopback ports, stopped (and waited for) on exit."""
    binary = jaeger_binary()
    otlp, query, grpc = _free_port(), _free_port(), _free_port()
    config = directory / "jaeger.yaml"
    config.write_text(CONFIG.format(otlp=otlp, query=query, grpc=grpc))
    log = open(directory / "jaeger.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([str(binary), "--config", f"file:{config}"], stdout=log, stderr=log)
    try:
        jaeger = Jaeger(otlp, query)
        end = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jaeger exited: {(directory / 'jaeger.log').read_text()[-2000:]}")
            try:
                jaeger.get("/api/services")
                with socket.create_connection(("127.0.0.1", otlp), timeout=1):
                    break
            except OSError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.1)
        yield jaeger
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


if __name__ == "__main__":
    print(f"Jaeger trace receiver: {jaeger_binary()}")
