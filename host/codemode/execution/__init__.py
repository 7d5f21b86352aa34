"""The execute pipeline: ``Builder``/``Server`` (``server``), one execution (``execute``), fair worker
slots (``admission``), the host's frame reader (``frames``), limits, call context, observer hooks and
the worker's text rules. See docs/execute.md and docs/reference/limits.md."""
