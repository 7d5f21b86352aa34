"""Tests of ``codemode.authz``."""
