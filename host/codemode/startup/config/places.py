"""Where the settings look when a path is not given: the token file, the data directory, a pod's
own namespace; and why a named file cannot be read."""

from __future__ import annotations

import os
from pathlib import Path

#: A pod's own namespace (the default of ``quota_namespace`` in a cluster).
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_token_file() -> Path:
    """Where ``codemode token`` and ``serve --http`` look for the token file when none is named:
    ``$XDG_CONFIG_HOME/codemode/codemode.tokens`` (``~/.config/...``), never the working directory.

    Returns:
        The path.
    """
    base = os.environ.get("XDG_CONFIG_HOME", "").strip()
    root = Path(base) if base else Path.home() / ".config"
    return root / "codemode" / "codemode.tokens"


def default_data_dir() -> Path:
    """Where ``serve --http`` lets packs keep state when ``data_dir`` is not given:
    ``$XDG_DATA_HOME/codemode`` (``~/.local/share/codemode``).

    Returns:
        The path.
    """
    base = os.environ.get("XDG_DATA_HOME", "").strip()
    root = Path(base) if base else Path.home() / ".local" / "share"
    return root / "codemode"


def unreadable(path: Path) -> str | None:
    """Why ``path`` cannot be read as a configuration file.

    Args:
        path: the file.

    Returns:
        The reason (``does not exist``, ...), or None when it can be read.
    """
    try:
        if not path.exists():
            return "does not exist"
        if not path.is_file():
            return "is not a regular file"
    except OSError as exc:  # a folder on the way cannot be searched by this user
        return f"cannot be reached by uid {os.getuid()} ({exc.strerror})"
    if not os.access(path, os.R_OK):
        return f"is not readable by uid {os.getuid()}"
    return None
