"""Where the repository and the tests' pinned data are, wherever a test module sits."""

from __future__ import annotations

from pathlib import Path

#: The repository's root: this file is tests/support/paths.py.
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Pinned data the tests compare with (tests/fixtures).
FIXTURES = REPO_ROOT / "tests" / "fixtures"
