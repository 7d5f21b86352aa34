"""What a single-use worker imports before its first frame: each module is CPU at every container or
pod start (docs/performance.md, "The worker's own start, cut"), so the costly ones that the worker
does not need stay out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

WORKER_ROOT = Path(__file__).resolve().parents[3] / "worker_image"

# dataclasses brings inspect, and inspect brings ast, dis and tokenize: 12-15 ms of CPU in the image.
KEPT_OUT = ("dataclasses", "inspect", "ast", "dis", "tokenize")


def test_the_entry_path_leaves_the_costly_modules_out() -> None:
    """Before: codemode_worker.interpreter, .environment and .syscalls imported dataclasses."""
    probe = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(WORKER_ROOT)!r})\n"
        "import codemode_worker.__main__, codemode_worker.entry\n"
        f"print(json.dumps([m for m in {list(KEPT_OUT)!r} if m in sys.modules]))\n"
    )
    # -I: as the worker runs (no site-packages hooks of this checkout, no PYTHONPATH); -S would skip
    # the interpreter's site-packages, where starlark is installed.
    out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
