"""What code mode buys in front of upstream tools: context bytes and round trips.

Run: ``python -m tests.benchmarks.bench_upstream [--rounds R] [--calls N]``. Prints numbers; asserts
nothing. Needs Node.js (``@modelcontextprotocol/server-everything`` and ``@octokit/openapi`` are
installed into ~/.cache/codemode like the tests do).

1. **Context bytes before the first useful call.** Direct: the upstream's ``tools/list`` JSON (what
   a model reads when the upstream is attached as is). Code mode: codemode's ``tools/list`` plus one
   ``search_api`` and one ``describe_api`` result. For server-everything both sides are measured on
   the wire of the official MCP client. For GitHub's OpenAPI document (1,000+ operations) the
   direct side is a lower bound: a ``tools/list`` with one tool per converted operation carrying its
   name, summary and a JSON Schema of exactly the arguments codemode accepts (real OpenAPI-to-MCP
   gateways also ship parameter descriptions, so they are larger); the raw document size is shown too.
2. **A 50-call task.** ``get-sum`` called N times and the results aggregated, (a) as N direct
   ``tools/call`` round trips from an MCP client over stdio to server-everything, (b) as one
   ``execute`` over stdio to ``codemode serve --stdio`` fronting the same server. Also measured: an
   ``execute`` with no upstream call (the fixed cost of a worker), so the per-call overhead the
   gateway adds over calling the upstream directly is ``(execute_N - execute_0) / N - direct / N``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters

import codemode
from codemode import authz
from codemode.mcp import StaticSubject, create_server
from codemode_capabilities.openapi import openapi_pack

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.support.upstreams import everything_command, octokit_openapi_document  # noqa: E402


def _size(obj: Any) -> int:
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json", by_alias=True, exclude_none=True)
    return len(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode())


def _codemode_cli() -> list[str]:
    script = Path(sys.executable).with_name("codemode")
    return [str(script)] if script.exists() else [sys.executable, "-m", "codemode.cli"]


def _everything_config() -> dict[str, Any]:
    cmd = everything_command()
    return {"name": "everything", "command": cmd[0], "args": [*cmd[1:], "stdio"]}


async def codemode_context(client: Client, query: str, name: str) -> tuple[int, int, int]:
    tools = _size(await client.list_tools())
    search = _size(await client.call_tool("search_api", {"query": query}))
    describe = _size(await client.call_tool("describe_api", {"name": name}))
    return tools, search, describe


def _shape_schema(shape: dict[str, Any]) -> dict[str, Any]:
    t = shape["t"]
    if t == "opt":
        inner = _shape_schema(shape["of"])
        return {"anyOf": [inner, {"type": "null"}]}
    if t == "str":
        return {"type": "string", "enum": shape["enum"]} if "enum" in shape else {"type": "string"}
    if t in ("int", "float", "bool"):
        return {"type": {"int": "integer", "float": "number", "bool": "boolean"}[t]}
    if t == "list":
        return {"type": "array", "items": _shape_schema(shape["of"])}
    if t == "dict":
        return {"type": "object", "additionalProperties": _shape_schema(shape["of"])}
    return {
        "type": "object",
        "properties": {f["name"]: _shape_schema(f["shape"]) for f in shape["fields"]},
        "required": [f["name"] for f in shape["fields"] if f["shape"]["t"] != "opt"],
    }


async def bench_context() -> None:
    print("== context bytes before the first useful call ==")
    params = StdioServerParameters(
        **{k: v for k, v in _everything_config().items() if k in ("command", "args")}
    )
    async with Client(params, mode="legacy") as direct:
        direct_bytes = _size(await direct.list_tools())
    env = {"BENCH_UPSTREAM_MCP": json.dumps([_everything_config()])}
    served = StdioServerParameters(
        command=_codemode_cli()[0],
        args=[*_codemode_cli()[1:], "serve", "--stdio", "--allow-all", "--pack",
              f"{REPO / 'tests' / 'benchmarks' / 'upstream_bench_pack.py'}:pack"],
        env=env,
    )  # fmt: skip
    async with Client(served, mode="legacy") as cm:
        tools, search, describe = await codemode_context(cm, "sum of two numbers", "everything.get_sum")
    total = tools + search + describe
    print(
        f"server-everything  direct tools/list {direct_bytes:>9,} B | codemode tools/list {tools:,} + "
        f"search {search:,} + describe {describe:,} = {total:,} B | ratio {direct_bytes / total:.1f}x"
    )

    document, version = octokit_openapi_document()
    logging.getLogger("codemode.upstream").setLevel(logging.ERROR)
    pack = openapi_pack([{"name": "github", "document": str(document), "base_url": "https://api.github.com"}])
    caps = pack.capabilities()
    server = codemode.Builder(authorizer=authz.allow_all()).register(*caps).build()
    lower_bound = _size(
        {
            "tools": [
                {"name": c.name, "description": c.summary, "inputSchema": _shape_schema(c.input_shape)}
                for c in server.capabilities
            ]
        }
    )
    async with Client(create_server(server, StaticSubject("bench"))) as cm:
        tools, search, describe = await codemode_context(
            cm, "list issues for a repository", "github.issues_list_for_repo"
        )
    total = tools + search + describe
    print(
        f"GitHub REST ({len(caps)} ops, @octokit/openapi {version})  direct tools/list ≥ {lower_bound:,} B "
        f"(document {document.stat().st_size:,} B) | codemode {tools:,} + {search:,} + {describe:,} = "
        f"{total:,} B | ratio ≥ {lower_bound / total:.0f}x"
    )
    await server.aclose()


async def bench_calls(rounds: int, calls: int) -> None:
    print(f"\n== a {calls}-call task over stdio (median of {rounds} rounds, after one warm-up) ==")
    cfg = _everything_config()
    params = StdioServerParameters(command=cfg["command"], args=cfg["args"])
    direct_times: list[float] = []
    async with Client(params, mode="legacy") as direct:
        for r in range(rounds + 1):
            t0 = time.perf_counter()
            texts = [
                (await direct.call_tool("get-sum", {"a": i, "b": 1})).content[0].text  # type: ignore[union-attr]
                for i in range(calls)
            ]
            elapsed = time.perf_counter() - t0
            assert len(texts) == calls
            if r:
                direct_times.append(elapsed)
    program = (
        "def main():\n"
        "    n = 0\n"
        f"    for i in range({calls}):\n"
        "        r = everything.get_sum(a=i, b=1)\n"
        "        n += len(r['text'])\n"
        "    return n\n"
    )
    empty = "def main():\n    return 0\n"
    served = StdioServerParameters(
        command=_codemode_cli()[0],
        args=[*_codemode_cli()[1:], "serve", "--stdio", "--allow-all", "--pack",
              f"{REPO / 'tests' / 'benchmarks' / 'upstream_bench_pack.py'}:pack"],
        env={"BENCH_UPSTREAM_MCP": json.dumps([cfg])},
    )  # fmt: skip
    exec_n: list[float] = []
    exec_0: list[float] = []
    async with Client(served, mode="legacy") as cm:
        for r in range(rounds + 1):
            t0 = time.perf_counter()
            result = await cm.call_tool("execute", {"source": program})
            elapsed = time.perf_counter() - t0
            assert not result.is_error, result
            t1 = time.perf_counter()
            result0 = await cm.call_tool("execute", {"source": empty})
            elapsed0 = time.perf_counter() - t1
            assert not result0.is_error, result0
            if r:
                exec_n.append(elapsed)
                exec_0.append(elapsed0)
    d, e, z = statistics.median(direct_times), statistics.median(exec_n), statistics.median(exec_0)
    per_direct = d / calls
    per_gateway = (e - z) / calls
    print(f"direct: {calls} tools/call round trips   {d * 1000:8.1f} ms  ({per_direct * 1000:.2f} ms/call)")
    print(
        f"codemode: one execute with {calls} calls   {e * 1000:8.1f} ms  (ratio execute/direct {e / d:.2f})"
    )
    print(f"codemode: execute with no call            {z * 1000:8.1f} ms  (fixed cost: one fresh worker)")
    print(
        f"per upstream call inside execute: {per_gateway * 1000:.2f} ms; overhead over a direct call "
        f"{(per_gateway - per_direct) * 1000:+.2f} ms"
    )


async def bench_in_process(rounds: int, calls: int) -> None:
    """The same task with codemode in process (no client hop): where the per-call time goes."""
    from codemode_capabilities.mcp import upstream as mcp_upstream

    handler_times: list[float] = []
    original = mcp_upstream._Tool.__call__

    async def timed(self: Any, ctx: Any, subject: Any, args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await original(self, ctx, subject, args)
        finally:
            handler_times.append(time.perf_counter() - t0)

    pack = mcp_upstream.upstream_mcp_pack([_everything_config()])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    program = (
        f"def main():\n    n = 0\n    for i in range({calls}):\n"
        "        n += len(everything.get_sum(a=i, b=1)['text'])\n    return n\n"
    )
    subject = authz.Subject(id="bench")
    exec_n: list[float] = []
    exec_0: list[float] = []
    mcp_upstream._Tool.__call__ = timed  # type: ignore[method-assign]
    try:
        async with server:
            for r in range(rounds + 1):
                t0 = time.perf_counter()
                await server.execute(program, subject=subject)
                t1 = time.perf_counter()
                await server.execute("def main():\n    return 0\n", subject=subject)
                if r:
                    exec_n.append(t1 - t0)
                    exec_0.append(time.perf_counter() - t1)
    finally:
        mcp_upstream._Tool.__call__ = original  # type: ignore[method-assign]
        await pack.aclose()
    e, z = statistics.median(exec_n), statistics.median(exec_0)
    print(
        f"in process: execute with {calls} calls {e * 1000:.1f} ms, with none {z * 1000:.1f} ms -> "
        f"{(e - z) / calls * 1000:.2f} ms per call, of which the upstream round trip (handler) "
        f"{statistics.median(handler_times) * 1000:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()

    async def run() -> None:
        await bench_context()
        await bench_calls(args.rounds, args.calls)
        await bench_in_process(args.rounds, args.calls)

    asyncio.run(run())


if __name__ == "__main__":
    main()
