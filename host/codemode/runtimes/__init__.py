"""Where workers run: the runtime interface (``base``) and its implementations (``process``,
``docker``, ``kubernetes``), the warm pool (``pool``). See docs/reference/runtimes.md."""

__all__: list[str] = []
