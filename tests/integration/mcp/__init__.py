"""Tests of ``codemode.mcp``."""
