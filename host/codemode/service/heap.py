"""The served process's start-up heap, kept out of Python's cyclic garbage collector.

A started service holds about 135,000 long-lived objects (modules, classes, the catalog, schemas,
the authorizer) that every full collection would walk again while every request of the process
waits: 204-229 ms a full collection during a load on the project's 2-core machine (4-5 ms frozen),
the largest single stop in the service's tail latency. :func:`freeze_start_heap` collects once and moves
what survives into the permanent generation (``gc.freeze``); later collections walk only what was
made afterwards. Only :func:`codemode.service.serve`, which owns its process, calls it, once, before
the port accepts, and :func:`thaw_start_heap` once the service has stopped (so that the stopped
service can be collected). An application that embeds :func:`codemode.service.create_app` or awaits
:func:`codemode.service.serve_async` keeps its own collector settings: freezing there would take in
the application's whole heap.

What it costs: a frozen object that later becomes cyclic garbage is not collected before the stop
(objects freed by their reference count are freed as always). The served process builds its
catalog once, so that is bounded by what the start-up made.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_start_heap", "thaw_start_heap"]


def freeze_start_heap() -> int:
    """Collect once, then move every object the collector tracks into the permanent generation.

    Returns:
        How many objects are frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw_start_heap() -> None:
    """Give the permanent generation back to the collector (``gc.unfreeze``), once the service has
    stopped."""
    gc.unfreeze()
