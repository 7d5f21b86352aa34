"""The reuse mode (an operator's choice): reusable sandboxes, each leased to one subject.

``pool`` (``ReusePool``: the sandboxes kept, leased, recycled and refilled) and ``supervised`` (the
host's side of one reusable sandbox, whose PID 1 is the worker image's supervisor, and of each
execute's lease of it). The runtimes that can start such sandboxes implement
``codemode.runtimes.base.SupervisingRuntime`` (Docker, Kubernetes). See docs/reference/runtimes.md.
"""

from ..base import SupervisingRuntime
from .pool import ReusePool

__all__ = ["ReusePool", "SupervisingRuntime"]
