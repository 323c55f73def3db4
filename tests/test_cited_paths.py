"""Every file and module the docs and the code's comments cite exists.

Read: README.md, docs/*.md, and the text (docstrings and comments) of src/ and bench/.

- ``something.py`` with a folder is relative to ``src/vast_manager/`` (docs/architecture.md,
  "Layout") or to the repository's root (``bench/...``, ``tests/...``, ``image/...``,
  ``src/...``); a bare ``something.py`` is the name of one of the repository's files.
- A dotted name in backquotes (or at a line's start, as in a code block) that starts with a
  room of the package (``coordinator.web.guard.CredentialThrottle``,
  ``vast_manager.agent.config``) imports, and each name after the module is an attribute.
- Another project's file (vast-cli's ``vast.py``, dstack's ``compute.py``, the ``vastai``
  1.9.1 wheel's ``vastai/api/client.py``) is cited with where it comes from: its paragraph
  (or comment block, or table row) names that project (``OUTSIDE_PROJECTS``, backquotes
  aside) or the commit it was read at; so does a file this repository removed ("removed in
  f458c70").
"""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

from support.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "vast_manager"
#: The projects whose files the docs cite, by the names the docs give them. The ``vastai``
#: wheel is named with its version: its bare name is also the first folder of its paths.
OUTSIDE_PROJECTS = ("vast-cli", "dstack", "skypilot", "gpuhunt", "nvidia-ml-py", "curio",
                    "litestream", "nvitop", "vastai 1.9.1")
ROOMS = ("agent", "coordinator", "protocol", "sim", "common")

PY_PATH = re.compile(r"(?<![\w./%-])([\w./-]*\w\.py)\b")
DOTTED = re.compile(rf"(?:(?<=`)|(?<=\n)|^)(?:vast_manager\.)?((?:{'|'.join(ROOMS)})(?:\.\w+)+)")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
OUTSIDE = re.compile("|".join(re.escape(p) for p in OUTSIDE_PROJECTS), re.IGNORECASE)


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True,
                         check=True).stdout
    return [REPO_ROOT / line for line in out.splitlines()]


def cited_in(files: list[Path]) -> list[Path]:
    return [p for p in files if p.is_file() and (
        (p.suffix == ".md" and (p.parent == REPO_ROOT / "docs" or p == REPO_ROOT / "README.md"))
        or (p.suffix == ".py" and p.relative_to(REPO_ROOT).parts[0] in ("src", "bench")))]


def path_exists(cited: str, names: set[str]) -> bool:
    if "/" not in cited:
        return cited in names
    cited = cited.removeprefix("./")
    return (PACKAGE / cited).is_file() or (REPO_ROOT / cited).is_file()


def module_name_exists(dotted: str) -> bool:
    parts = dotted.split(".")
    here = PACKAGE
    for i, part in enumerate(parts):
        if (here / part).is_dir():
            here = here / part
            continue
        if not (here / f"{part}.py").is_file():
            # A name a package defines (``coordinator.rows.InstanceRow`` is a module's).
            module = importlib.import_module(".".join(["vast_manager", *parts[:i]]))
            return hasattr(module, part)
        obj: object = importlib.import_module(".".join(["vast_manager", *parts[: i + 1]]))
        for attr in parts[i + 1:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return True


def paragraphs(text: str) -> list[tuple[int, str]]:
    """Each paragraph (or comment block, or table row) with its first line's number."""
    out = []
    line = 1
    for block in re.split(r"(\n\s*\n)", text):
        if block.strip():
            rows = block.split("\n") if block.lstrip().startswith("|") else [block]
            for offset, row in enumerate(rows):
                out.append((line + (offset if len(rows) > 1 else 0), row))
        line += block.count("\n")
    return out


def stale_citations(texts: dict[str, str], names: set[str]) -> list[str]:
    """``file:line: citation`` for each stale one of ``texts`` (file -> its text)."""
    found = []
    for path, text in texts.items():
        for first_line, para in paragraphs(text):
            elsewhere = COMMIT.search(para) or OUTSIDE.search(para.replace("`", ""))
            for match in PY_PATH.finditer(para):
                if not path_exists(match.group(1), names) and not elsewhere:
                    number = first_line + para[: match.start()].count("\n")
                    found.append(f"{path}:{number}: {match.group(1)}")
            for match in DOTTED.finditer(para):
                if not module_name_exists(match.group(1).rstrip(".")):
                    number = first_line + para[: match.start()].count("\n")
                    found.append(f"{path}:{number}: {match.group(1)}")
    return found


def test_every_cited_path_and_module_exists() -> None:
    files = tracked()
    read = cited_in(files)
    assert REPO_ROOT / "docs" / "architecture.md" in read and PACKAGE / "docs.py" in read
    texts = {str(p.relative_to(REPO_ROOT)): p.read_text() for p in read}
    found = stale_citations(texts, {p.name for p in files})
    assert found == [], "cited but not in the repository (see this test's docstring):\n" + (
        "\n".join(found))


def test_the_rules_catch_what_is_stale_and_pass_what_is_not() -> None:
    doc = (
        "The model (`model.py`) and `coordinator/store/reads.py`, `agent/gone.py`.\n\n"
        "| row | `store/reads.py` |\n| row | vast-cli `vastai/cli/main.py` |\n"
        "| row | ``vastai`` 1.9.1 `vastai/api/client.py` |\n| row | `vastai/api/client.py` |\n\n"
        "The relay (`coordinator/relay.py`, removed in f458c70), `bench/ingest.py`,\n"
        "`tests/test_cited_paths.py`, `README.md`, `docs.py`.\n\n"
        "``coordinator.web.guard.CredentialThrottle``, `coordinator.guard.CredentialThrottle`,\n"
        "`protocol.scaling.diagnose`, `common.scaling.diagnose`, `vast_manager.agent.config`,\n"
        "`coordinator.rows.InstanceRow`, `sim.host_ram_mb`.\n\n"
        "```python\nprotocol.scaling.diagnose(n)\ncommon.scaling.diagnose(n)\n```\n"
    )
    names = {p.name for p in tracked()}
    assert [line.split(":", 1)[1] for line in stale_citations({"doc.md": doc}, names)] == [
        "1: model.py", "1: agent/gone.py", "3: store/reads.py", "6: vastai/api/client.py",
        "11: coordinator.guard.CredentialThrottle", "12: protocol.scaling.diagnose",
        "13: sim.host_ram_mb", "16: protocol.scaling.diagnose",
    ]
