"""The project's own service image (the Dockerfile at the repository root), run as an operator runs it:
it carries no test-only worker entry (``codemode image audit``'s "test entries"
check passes), and it serves an execute authorized by a Rego policy, which needs regopy's
libatomic.so.1 in the image. The container runs the Docker runtime against this machine's engine,
as the Dockerfile's header describes (the socket mounted, its group added).

The image is ``CODEMODE_SERVICE_IMAGE`` (default ``codemode-service:e2e``, what
``scripts/provision-kubernetes.sh up`` builds from the Dockerfile); without it the tests skip, and
under ``CI=true`` they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.environment import unavailable
from tests.support.mcp_client import cli_command
from tests.support.service import call, mcp_client, write_token_file

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SERVICE_IMAGE = os.environ.get("CODEMODE_SERVICE_IMAGE") or "codemode-service:e2e"

REPO = Path(__file__).resolve().parents[3]


def _documented_config() -> str:
    """docs/service.md's codemode.toml for the image, as written."""
    text = (REPO / "docs" / "service.md").read_text(encoding="utf-8")
    start = text.index("cat > deploy/codemode.toml <<'TOML'\n") + len("cat > deploy/codemode.toml <<'TOML'\n")
    return text[start : text.index("\nTOML\n", start) + 1]


@pytest.fixture(scope="module")
def service_image(docker_api: Any) -> str:
    import docker.errors

    try:
        docker_api.inspect_image(SERVICE_IMAGE)
    except docker.errors.ImageNotFound:
        unavailable(
            "the service image",
            f"{SERVICE_IMAGE} is not on the engine (scripts/provision-kubernetes.sh up builds it; "
            "or docker build -t codemode-service:e2e . with CODEMODE_SERVICE_IMAGE)",
        )
    return SERVICE_IMAGE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_service_image_carries_no_test_entry(service_image: str) -> None:
    audit = subprocess.run(
        cli_command("image", "audit", "--json", service_image), capture_output=True, text=True, timeout=300
    )
    report = json.loads(audit.stdout)
    (entries,) = [c for c in report["checks"] if c["name"] == "test entries"]
    assert entries["status"] == "PASS", entries


@contextlib.contextmanager
def _served(image: str, folder: Path, port: int) -> Iterator[str]:
    sock = "/var/run/docker.sock"
    if not os.path.exists(sock):
        pytest.skip("the engine is not at /var/run/docker.sock")
    name = f"codemode-service-test-{os.getpid()}-{port}"
    argv = [
        "docker", "run", "-d", "--name", name, "--network", "host",
        "-v", f"{sock}:{sock}", "--group-add", str(os.stat(sock).st_gid),
        "-v", f"{folder}:/etc/codemode:ro",
        "-e", "CODEMODE_HOST=127.0.0.1", "-e", f"CODEMODE_PORT={port}",
        "-e", "CODEMODE_HEALTH_PORT=0", "-e", "CODEMODE_METRICS_PORT=0",
        "-e", "CODEMODE_CONFIG=/etc/codemode/codemode.toml",
        image,
    ]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            state = subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Running}}", name], capture_output=True, text=True
            )
            if state.stdout.strip() != "true" or time.monotonic() > deadline:
                logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True).stderr
                pytest.fail(f"the service container did not get ready: {logs[-3000:]}")
            time.sleep(0.5)
        yield url + "/mcp"
    finally:
        # SIGTERM first: the service removes the workers it started (CI counts leftovers)
        subprocess.run(["docker", "stop", "--time", "30", name], capture_output=True, timeout=120)
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120)


@pytest.mark.timeout(300)
async def test_the_service_image_serves_a_rego_authorized_execute(service_image: str, tmp_path: Path) -> None:
    """docs/service.md's deploy folder, as written: its codemode.toml, examples/policy.rego, a
    token file owned by the service's uid 10001 (mode 0600, as ``codemode token new`` makes it)."""
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "codemode.toml").write_text(_documented_config(), encoding="utf-8")
    (folder / "policy.rego").write_text((REPO / "examples" / "policy.rego").read_text(), encoding="utf-8")
    tokens = write_token_file(folder, ["alice", "bob"])
    tokens.path.rename(folder / "tokens.json")
    (folder / "tokens.json").chmod(0o600)
    os.chown(folder / "tokens.json", 10001, 10001)
    for path in (tmp_path, folder, folder / "codemode.toml", folder / "policy.rego"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    src = (
        "def main():\n"
        "    r = records.create(title='from the image')\n"
        "    return records.get(id=r['id'])['title']\n"
    )
    with _served(service_image, folder, _free_port()) as url:
        async with mcp_client(url, tokens["alice"]) as alice:
            assert await call(alice, "execute", source=src) == {"result": "from the image"}
        async with mcp_client(url, tokens["bob"]) as bob:
            denied = await bob.call_tool("execute", {"source": src})
    assert denied.is_error
    assert "permission denied" in denied.content[0].text  # type: ignore[union-attr]
