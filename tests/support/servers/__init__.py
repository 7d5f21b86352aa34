"""Programs the tests start as processes or serve in-process (MCP servers, an OpenAPI app, a
credential echo): each runs by its path, ``FOLDER / "<name>.py"``."""

from pathlib import Path

FOLDER = Path(__file__).resolve().parent
