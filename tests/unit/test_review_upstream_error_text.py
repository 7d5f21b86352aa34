"""Review attacks on ``upstream_error_text`` (docs/reference/errors.md, "capability failed: <upstream
name>: <text>"): what an upstream (or a tenant steering it) can still get past the rule.

Each case asserts what the documented rule promises (URLs, ``host.tld/...`` tokens and absolute
paths replaced, configured credentials redacted); a FAILING case is a bypass that worked. The
cases that pass are attacks that failed, kept so the lead sees what was tried. Bypasses that
worked are marked ``xfail(strict=True)`` with the finding's number from the review report: run
with ``--runxfail`` to see them fail; a fix makes them pass (then drop the mark).
"""

from __future__ import annotations

import pytest

from codemode.packs.upstream import upstream_error_text

SPOOFS = {
    # host.tld/... tokens the rule misses
    "idn-label": "Session expired: sign in again at \u00e9vil.example/login",
    "cyrillic-a": "Session expired: sign in again at evil.ex\u0430mple/login",
    "port": "Session expired: sign in again at evil.example:443/login",
    "userinfo": "Session expired: sign in again at support@evil.example/login",
    "fullwidth": "Session expired: sign in again at "
    + "".join(chr(0xFEE0 + ord(c)) for c in "evil.example/login"),
    "division-slash": "Session expired: sign in again at evil.example\u2215login",
}
# Not a host.tld/... token by the documented rule, but an address all the same.
BARE = {
    "bare-host": "Session expired: sign in again at evil-login.example now",
    "internal-ip": "connect ECONNREFUSED 10.12.0.7:5432",
    "ip-path": "upstream 10.12.0.7:8080/admin refused the key",
}
PATHS = {
    "after-non-ascii-letter": "refused: \u00e9/srv/tenants/alice/diary.txt",
    "percent-encoded": "no such file %2Fsrv%2Ftenants%2Falice%2Fdiary.txt",
}
CAUGHT = {  # bypass attempts that the rule does stop
    "scheme": "sign in at https://evil.example/login",
    "protocol-relative": "sign in at //evil.example/login",
    "zero-width-in-scheme": "sign in at http\u200b://evil.example/login",
    "fullwidth-colon": "sign in at http\uff1a//evil.example/login",
    "www": "sign in at www.evil.example",
    "json-escaped-path": "open '\\/srv\\/tenants\\/alice'",
    "windows": "C:\\Users\\svc\\token.txt and \\\\fileserver\\share\\x",
    "quoted-path": "ENOENT: open '/srv/tenants/alice/diary.txt'",
    "tilde": "see ~/.ssh/id_rsa",
    "file-scheme": "file:///etc/passwd",
    "ansi": "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07",
    "bidi": "ok \u202egol/elpmaxe.live//:sptth\u202c",
}


@pytest.mark.xfail(
    strict=True,
    reason="review F5: host.tld/... tokens with a non-ASCII letter, a port, userinfo or look-alikes pass",
)
@pytest.mark.parametrize("case", sorted(SPOOFS))
def test_a_host_tld_path_token_never_passes(case: str) -> None:
    shown = upstream_error_text("api", SPOOFS[case])
    assert "[url]" in shown, shown


@pytest.mark.xfail(strict=True, reason="review F5: bare host names and IP addresses (internal ones too) pass")
@pytest.mark.parametrize("case", sorted(BARE))
def test_a_host_name_or_address_never_passes(case: str) -> None:
    shown = upstream_error_text("api", BARE[case])
    assert not any(part in shown for part in ("evil-login.example", "10.12.0.7")), shown


@pytest.mark.xfail(
    strict=True, reason="review F5: a path after a non-ASCII letter, or percent-encoded, passes"
)
@pytest.mark.parametrize("case", sorted(PATHS))
def test_an_absolute_path_never_passes(case: str) -> None:
    shown = upstream_error_text("api", PATHS[case])
    assert "srv" not in shown and "alice" not in shown, shown


@pytest.mark.parametrize("case", sorted(CAUGHT))
def test_attempts_that_the_rule_stops(case: str) -> None:
    shown = upstream_error_text("api", CAUGHT[case])
    for part in ("evil", "srv", "Users", "fileserver", "ssh", "passwd"):
        assert part not in shown, shown


SECRET = "sk-live-4f9a1c2e7b"


@pytest.mark.xfail(strict=True, reason="review F3: redaction runs before control characters are removed")
@pytest.mark.parametrize(
    "text",
    [
        f"key {SECRET[:8]}\n{SECRET[8:]} refused",  # hard-wrapped by the upstream
        f"key {SECRET[:8]}\u200b{SECRET[8:]} refused",  # a zero-width space inside
        f"key {SECRET[:8]}\t{SECRET[8:]} refused",
    ],
    ids=["newline", "zero-width", "tab"],
)
def test_a_configured_credential_split_by_what_the_rule_itself_removes_is_redacted(text: str) -> None:
    """Redaction runs before control characters become spaces, so a credential split by a newline
    or a zero-width character leaks in two pieces that the model reads back together."""
    shown = upstream_error_text("api", text, secrets=[SECRET])
    assert SECRET[:8] not in shown or SECRET[8:] not in shown, shown
