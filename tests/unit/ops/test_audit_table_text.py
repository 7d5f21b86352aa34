"""``codemode image audit``'s table prints what an image says (file names, its entrypoint, the
probe's output): nothing of it may reach the operator's terminal as anything but plain ASCII text."""

from __future__ import annotations

from codemode.ops.image_audit import SHOWN_CHARS, format_report
from codemode.ops.image_rules import AuditReport, Check


def table(*findings: str, detail: str = "found") -> str:
    checks = [Check("world-writable paths", "FAIL", detail, list(findings))]
    return format_report(AuditReport("img\x1b[2J", "sha256:" + "0" * 64, 1, "linux\u202e/amd64", checks))


def test_every_character_but_printable_ascii_is_escaped_and_a_backslash_too() -> None:
    text = table(
        "/srv/\x1b]0;owned\x07",  # sets the terminal's title
        "/srv/\u3164\u3164hidden",  # a "printable" filler that shows as blank
        "/srv/\u05e9\u05dc\u05d5\u05dd",  # right-to-left letters, reordered by some terminals
        "/srv/a\u0336b",  # a combining strike-through
        "/srv/literal\\x1b",  # a backslash: must not pass for an escaped ESC
        detail="line\nbreak",
    )
    assert all(" " <= ch <= "~" for ch in text.replace("\n", "")), text
    assert "/srv/\\x1b]0;owned\\x07" in text
    assert "/srv/\\u3164\\u3164hidden" in text
    assert "/srv/\\u05e9\\u05dc\\u05d5\\u05dd" in text
    assert "/srv/a\\u0336b" in text
    assert "/srv/literal\\\\x1b" in text
    assert "line\\nbreak" in text and "img\\x1b[2J" in text and "linux\\u202e/amd64" in text
    text.encode("ascii")  # a terminal of any encoding prints it


def test_a_long_finding_is_cut_with_a_note() -> None:
    text = table("/" + "a" * (SHOWN_CHARS + 99))
    assert ("a" * (SHOWN_CHARS - 1)) + " ... (100 more characters, --json)" in text
    assert "a" * SHOWN_CHARS not in text
