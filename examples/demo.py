"""Run one program against a demo capability on the process runtime.

.venv/bin/python examples/demo.py
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import codemode
from codemode import authz

pack = codemode.CapabilityPack()


@dataclass
class LookupInput:
    key: str
    limit: int | None = None


@dataclass
class LookupOutput:
    key: str
    count: int


@pack.capability("records.lookup", id="records.entry.lookup", search_terms=["fetch entry"])
async def lookup(ctx: codemode.CallContext, subject: authz.Subject, args: LookupInput) -> LookupOutput:
    """Look up one record by key."""
    return LookupOutput(key=args.key, count=len(args.key) * (args.limit or 1))


PROGRAM = """
def main():
    found = [records.lookup(key=k, limit=2) for k in ["alpha", "beta"]]
    return {"total": sum([f["count"] for f in found]), "keys": [f["key"] for f in found]}
"""


async def main() -> None:
    builder = codemode.Builder(authorizer=authz.allow_all())
    builder.register(*pack.capabilities())
    async with builder.build() as server:  # starts the runtime; stops its workers on exit
        print(json.dumps(server.search("fetch record").to_dict(), indent=2))
        print(json.dumps(server.describe("records.lookup").to_dict(), indent=2))
        print(await server.execute(PROGRAM, subject=authz.Subject("demo")))


if __name__ == "__main__":
    asyncio.run(main())
