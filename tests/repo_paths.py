"""Where the tests find the repository, their data and their helpers, wherever a test file sits in ``tests/``."""
from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA = TESTS / "data"
PLUGINS = TESTS / "plugins"
