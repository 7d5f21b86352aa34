"""The test suite's shared pieces (no tests here): what the environment provides, servers and
clients on loopback, test packs and capabilities, and the programs the tests start as processes
(``servers/``). Every helper lives here, imported as ``tests.support.<module>``."""
