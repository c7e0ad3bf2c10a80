"""Suite-wide guards.

``RANKWATCH_EXPECT_WHEEL=DIR`` (set by ``make wheel-check``) asserts that the code under
test is the built wheel unpacked in DIR, not the editable link tree, so a module the
wheel left out fails the run instead of being found in the source tree.
"""

from __future__ import annotations

import os
from pathlib import Path

import rankwatch


def pytest_configure() -> None:
    expected = os.environ.get("RANKWATCH_EXPECT_WHEEL")
    if expected:
        loaded = Path(rankwatch.__file__).resolve()
        if not loaded.is_relative_to(Path(expected).resolve()):
            raise RuntimeError(f"testing {loaded}, not the wheel in {expected}")
