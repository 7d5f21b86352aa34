"""What a stdio upstream writes to its stderr: before, the server inherited the host's
stderr, so one call of ``noise("flood")`` put 20 MB on the host's stderr in well under a second,
past the log limiter and with nothing saying whose server wrote it. Now each line is cut and counted
by the relay, reaches the host as a log record of the session's subject at a bounded rate, and the
service's repeat filter (``codemode.service.logfilter``) treats it like every other line: one
subject's flood does not hide another subject's lines.

The host runs in a child process here, so that its real stderr (descriptor 2) can be measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.support.servers import FOLDER as SERVERS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HOSTILE = SERVERS / "hostile_mcp_server.py"

HOST = textwrap.dedent(
    """
    import asyncio, json, logging, sys
    import codemode
    from codemode import authz
    from codemode.service.logfilter import RepeatFilter
    from codemode_capabilities.mcp.upstream import upstream_mcp_pack

    class Kept(logging.Handler):
        # each record with the subject it was logged for; and those the repeat filter passed

        def __init__(self):
            super().__init__(logging.DEBUG)
            self.seen, self.passed, self.limiter = [], [], RepeatFilter()

        def emit(self, record):
            subject = authz.current_subject()
            entry = (subject.id if subject else None, record.getMessage())
            self.seen.append(entry)
            if self.limiter.filter(record):
                self.passed.append(entry)

    kept = Kept()
    logger = logging.getLogger("codemode.capabilities.mcp_upstream")
    logger.addHandler(kept)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False

    async def main():
        table = {"name": "hostile", "command": sys.executable, "args": [sys.argv[1]]}
        pack = upstream_mcp_pack([table])
        server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
        try:
            for subject, text in (("bob", "flood"), ("alice", "alice-was-here")):
                source = f'def main():\\n    return hostile.noise(text="{text}")\\n'
                assert await server.execute(source, subject=authz.Subject(subject)) == {"text": "written"}
        finally:
            await pack.aclose()  # the sessions end: what the relays passed on has been read
            await server.aclose()

    asyncio.run(main())

    def lines(records, subject):
        return [m for who, m in records if who == subject and " stderr: " in m]

    print(json.dumps({
        who: {"seen": lines(kept.seen, who), "passed": lines(kept.passed, who)} for who in ("alice", "bob")
    }))
    """
)


def test_a_flood_on_an_upstreams_stderr_is_bounded_and_limited_per_subject() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", HOST, str(HOSTILE)], capture_output=True, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = len(proc.stderr)
    logs = json.loads(proc.stdout)
    bobs = logs["bob"]["seen"]
    print(f"host stderr: {written} bytes; bob's stderr records: {len(bobs)}, {sum(map(len, bobs))} bytes")
    assert written < 16 * 1024, written  # before: over 20 MB
    assert 0 < len(bobs) <= 100 and sum(map(len, bobs)) < 64 * 1024
    assert any("dropped" in m for m in bobs)  # the relay says how much it dropped
    assert all(len(m) < 2048 for m in bobs)  # the 2 MiB line was cut
    # the limiter keys by subject: bob's flood leaves alice's line alone
    assert any("alice-was-here" in m for m in logs["alice"]["passed"])
    assert len(logs["bob"]["passed"]) <= 5
