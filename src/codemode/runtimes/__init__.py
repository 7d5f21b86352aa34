"""Where workers run: the runtime interface and its implementations."""
