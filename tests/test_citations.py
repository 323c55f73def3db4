"""Comments and docstrings cite what a reader of the repository has: its own docs
(docs/protocol.md, docs/policy.md...), never a section of a design note or a reference
file that only the project's authors had, nor the tracker's issue numbers."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# "DESIGN 3.5", "DESIGN section 5"; "reference/cuzk.md" (not vast.ai's "api-reference/");
# "../shared"; "issue 6", "(issue 5, item 4)", "Issue 3,".
FORBIDDEN = re.compile(
    r"\bDESIGN (?:section )?\d"
    r"|(?<![\w/-])reference/(?:cuzk|nvml|vast-api|origin)\.md\b"
    r"|\.\./shared\b"
    r"|\b[Ii]ssues? #?\d+\b"
)
CHECKED_SUFFIXES = {".py", ".js", ".sh", ".yaml", ".yml", ".json", ".toml", ".md", ".css",
                    ".html"}


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    paths = [ROOT / line for line in out.splitlines()]
    return [p for p in paths
            if (p.suffix in CHECKED_SUFFIXES or p.name == "Dockerfile" or ".ci" in p.parts)
            and p.name != "CHANGELOG.md" and p != Path(__file__).resolve() and p.is_file()]


def test_nothing_cites_what_the_repository_does_not_have() -> None:
    files = tracked_files()
    assert any(p.name == "policy.py" for p in files)  # the listing found the tree
    found = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}"
        for path in files
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if (match := FORBIDDEN.search(line))
    ]
    assert found == [], "cite the repository's docs instead:\n" + "\n".join(found)


def test_the_pattern_catches_each_kind() -> None:
    for text in ("(DESIGN 3.5)", "DESIGN section 6 rules", "see reference/nvml.md",
                 "../shared/DESIGN.md", "(issue 6)", "Issue 3, end to end"):
        assert FORBIDDEN.search(text), text
    for text in ("api-reference/openapi.yaml", "docs/protocol.md, Errors",
                 "cli/reference/search-offers.mdx", "Register 150 agents"):
        assert not FORBIDDEN.search(text), text
