"""The optional extras: what one deployment may leave out (the Kubernetes client, OpenTelemetry), and
the one-line error that names the extra to install when a feature needs a missing one."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtra(ImportError):
    """A feature needs an optional extra that is not installed (the message names it)."""


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module``, or fail naming the extra that provides it.

    Args:
        module: the module the feature needs (``kubernetes``, ``opentelemetry.sdk.trace``).
        extra: the project's extra that installs it (``kubernetes``, ``tracing``).
        feature: what needs it, as the error's subject (``--runtime kubernetes``).

    Returns:
        The imported module.

    Raises:
        MissingExtra: the module is not installed: one line, e.g. ``--runtime kubernetes needs the
            'kubernetes' extra: pip install 'codemode[kubernetes]'``.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing != module and not module.startswith(missing + "."):
            raise  # something the installed module needs is broken: not a missing extra
        raise MissingExtra(f"{feature} needs the {extra!r} extra: pip install 'codemode[{extra}]'") from None
