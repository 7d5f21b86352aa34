"""A stdio server that cannot start tells the MCP client why: MCP clients start stdio
servers with a minimal environment, so ``KUBECONFIG`` is gone and the Kubernetes runtime cannot
start. Before, the client saw only "Connection closed"; now its ``initialize`` is answered with an
error carrying the start-up line (the one stderr has), which the client can show."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from tests.support.mcp_client import RECORDS_PACK, child_env, cli_command

pytestmark = pytest.mark.slow


def _client_env(tmp_path: Path) -> dict[str, str]:
    """What an MCP client passes: no KUBECONFIG, a HOME without ~/.kube, and no in-cluster service."""
    env = child_env(HOME=str(tmp_path))
    for key in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        env.pop(key, None)
    return env


def _mcp_error(exc: BaseException) -> MCPError:
    """The client's MCPError (the SDK raises it inside its task group's ExceptionGroup)."""
    while isinstance(exc, BaseExceptionGroup):
        (exc,) = exc.exceptions
    assert isinstance(exc, MCPError), repr(exc)
    return exc


async def test_the_client_sees_why_the_kubernetes_runtime_cannot_start(tmp_path: Path) -> None:
    argv = cli_command("serve", "--stdio", "--allow-all", "--runtime", "kubernetes", "--pack", RECORDS_PACK)
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=_client_env(tmp_path))
    with (tmp_path / "stderr.txt").open("w+") as errlog:
        with pytest.raises((MCPError, ExceptionGroup)) as info:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                await client.list_tools()
        errlog.seek(0)
        stderr = errlog.read()
    error = _mcp_error(info.value)
    message = error.error.message
    assert "\n" not in message
    assert message.startswith("codemode: --runtime / CODEMODE_RUNTIME")
    assert "--kubernetes-kubeconfig / CODEMODE_KUBERNETES_KUBECONFIG" in message
    assert message in stderr.splitlines()  # the same line the operator's log has


def test_without_a_client_the_line_goes_to_stderr_alone(tmp_path: Path) -> None:
    argv = cli_command("serve", "--stdio", "--allow-all", "--runtime", "kubernetes", "--pack", RECORDS_PACK)
    proc = subprocess.run(
        argv, env=_client_env(tmp_path), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert "--kubernetes-kubeconfig / CODEMODE_KUBERNETES_KUBECONFIG" in line


async def test_the_documented_client_configuration_reaches_the_cluster(tmp_path: Path) -> None:
    """docs/mcp.md's Kubernetes client configuration: --kubernetes-kubeconfig in args works under the
    client's minimal environment (needs the project's cluster)."""
    kubeconfig = os.environ.get("KUBECONFIG") or "/var/lib/codemode-k8s/admin.kubeconfig"
    if not Path(kubeconfig).is_file():
        pytest.skip("no kubeconfig here (scripts/provision-kubernetes.sh up makes one)")
    argv = cli_command(
        "serve", "--stdio", "--allow-all", "--runtime", "kubernetes", "--pack", RECORDS_PACK,
        "--kubernetes-kubeconfig", kubeconfig,
    )  # fmt: skip
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=_client_env(tmp_path))
    async with Client(params) as client:
        listed = await client.list_tools()
    assert [t.name for t in listed.tools] == ["search_api", "describe_api", "execute"]
