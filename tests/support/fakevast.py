"""The fake vast.ai lives in the package (``coordinator.providers.fakevast``: ``vast-manager
serve --provider fake`` runs it); the tests' agents also get the repository on PYTHONPATH."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vast_manager.coordinator.providers import fakevast as _fake
from vast_manager.coordinator.providers.fakevast import (  # noqa: F401  (the tests' names)
    FAKE_API_KEY,
    MAX_LABEL_CHARS,
    MAX_ONSTART_CHARS,
    OCI_START_FAILURE,
    PRICED_STORAGE_GB,
    STATUSES,
    FakeVast,
)

from support.paths import REPO_ROOT


class SimAgents(_fake.SimAgents):
    """The package's launcher, with the repository on the agents' ``PYTHONPATH``."""

    def __init__(self, workdir: Path, **kwargs: Any) -> None:
        extra = {"PYTHONPATH": str(REPO_ROOT), **(kwargs.pop("extra_env", None) or {})}
        super().__init__(workdir, extra_env=extra, **kwargs)
