"""The supervisor channel (codemode_worker.supervisor_channel) as the host decodes it: everything a reusable
sandbox's supervisor sends is hostile input (known kinds, bounded payloads, any fragmentation); and
the reuse mode's settings (docs/configuration.md)."""

from __future__ import annotations

import re

import pytest

from codemode.runtimes.reuse import ReusePool, SupervisingRuntime
from codemode.startup.bootstrap import with_pool
from codemode.startup.config import ConfigError, Settings
from codemode_worker import supervisor_channel as channel


def _feed_bytewise(data: bytes) -> list[tuple[bytes, int, bytes]]:
    decoder = channel.ChannelDecoder()
    out: list[tuple[bytes, int, bytes]] = []
    for i in range(len(data)):
        out += decoder.feed(data[i : i + 1])
    return out


def test_messages_survive_any_fragmentation() -> None:
    stream = (
        channel.encode(channel.HELLO, 1, b'{"v":1,"epoch":1}')
        + channel.encode(channel.STDOUT, 1, b"abc")
        + channel.encode(channel.STDERR, 1, b"")  # empty relays are skipped
        + channel.encode(channel.EXIT, 1, b'{"code":0}')
    )
    whole = channel.ChannelDecoder().feed(stream)
    assert whole == [
        (b"H", 1, b'{"v":1,"epoch":1}'),
        (b"O", 1, b"abc"),
        (b"X", 1, b'{"code":0}'),
    ]
    # Relayed bytes may come in pieces; control payloads only whole.
    pieces = _feed_bytewise(stream)
    assert b"".join(p for k, _, p in pieces if k == b"O") == b"abc"
    assert [m for m in pieces if m[0] != b"O"] == [m for m in whole if m[0] != b"O"]


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (channel.encode(b"D", 1, b"x"), "unknown message kind"),  # a host kind, not the supervisor's
        (channel.encode(b"Z", 1), "unknown message kind"),
        (channel.HEADER.pack(channel.STDOUT, 1, channel.MAX_RELAY + 1), "O message of"),
        (channel.HEADER.pack(channel.CLEAN, 1, channel.CONTROL_LIMIT + 1), "C message of"),
        (channel.encode(channel.EXIT, 1), "empty X message"),
    ],
)
def test_what_the_channel_does_not_allow_is_refused(data: bytes, problem: str) -> None:
    with pytest.raises(channel.ChannelError, match=problem):
        channel.ChannelDecoder().feed(data)


def test_a_huge_announced_payload_is_refused_before_any_is_buffered() -> None:
    decoder = channel.ChannelDecoder()
    with pytest.raises(channel.ChannelError):
        decoder.feed(channel.HEADER.pack(channel.EXIT, 1, 2**32 - 1))


@pytest.mark.parametrize("payload", [b"not json", b"[1]", b"\xff\xfe", b'"text"'])
def test_control_payloads_must_be_json_objects(payload: bytes) -> None:
    with pytest.raises(channel.ChannelError):
        channel.parse_control(payload)


# ------------------------------------------------------------------------------------- settings


def test_the_reuse_mode_is_off_by_default() -> None:
    settings = Settings(allow_all=True, runtime="docker", pool=2)
    assert settings.reuse_executes == 0


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"reuse_executes": 10, "pool": 2}, "--reuse-executes / CODEMODE_REUSE_EXECUTES needs --runtime"),
        ({"runtime": "docker", "reuse_executes": 10}, "needs --pool / CODEMODE_POOL > 0"),
        ({"runtime": "docker", "reuse_idle_seconds": 5}, "applies to the reuse mode only"),
    ],
)
def test_reuse_settings_are_checked_with_their_names(given: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        Settings(allow_all=True, **given)  # type: ignore[arg-type]


class _NoSupervisor:
    name = "plain"

    async def start(self) -> None: ...
    async def spawn(self) -> object: ...
    async def check(self) -> None: ...
    async def aclose(self) -> None: ...


def test_the_pool_of_the_reuse_mode_wraps_only_a_supervising_runtime() -> None:
    from codemode.runtimes.docker import DockerRuntime

    settings = Settings(allow_all=True, runtime="docker", pool=3, reuse_executes=7, reuse_idle_seconds=9)
    pool = with_pool(DockerRuntime(), settings)
    assert isinstance(pool, ReusePool)
    assert (pool.size, pool.max_executes, pool.idle_seconds) == (3, 7, 9)
    assert isinstance(DockerRuntime(), SupervisingRuntime)
    with pytest.raises(ConfigError, match="has no reuse mode"):
        with_pool(_NoSupervisor(), settings)  # type: ignore[arg-type]
