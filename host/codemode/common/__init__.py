"""What every layer of the host shares: the error classes of docs/reference/errors.md (``errors``) and
waiting for work handed to a thread (``handoff``)."""
