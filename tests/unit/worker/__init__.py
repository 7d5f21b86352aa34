"""Tests of ``codemode_worker``."""
