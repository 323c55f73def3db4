"""Every generated doc is what its declaration makes, and the one command that rewrites them
(``python -m vast_manager.docs``) finds, reports and rewrites a stale one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from vast_manager import docs

from support.paths import REPO_ROOT

COMMAND = [sys.executable, "-m", "vast_manager.docs"]


def test_every_generated_doc_is_fresh() -> None:
    assert docs.stale(REPO_ROOT) == [], "stale generated docs: run python -m vast_manager.docs"


def copy_of_the_checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    for path in {g.path for g in docs.GENERATED} | {docs.OPENAPI_YAML, "pyproject.toml"}:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / path, root / path)
    return root


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def test_check_names_each_stale_file_and_the_command_rewrites_them(tmp_path: Path) -> None:
    root = copy_of_the_checkout(tmp_path)
    operations = root / "docs" / "operations.md"
    fresh_operations = operations.read_text()
    # A setting's row edited by hand in both of operations.md's tables, a command's help
    # in cli.md, and a packaged openapi.json behind its YAML.
    operations.write_text(
        fresh_operations.replace("| `VM_PORT` | `8420` |", "| `VM_PORT` | `1` |")
        .replace("| `VM_DEPLOY_DISK_GB` | `250` |", "| `VM_DEPLOY_DISK_GB` | `9` |"))
    cli_md = root / "docs" / "cli.md"
    cli_md.write_text(cli_md.read_text().replace("Usage: vast-manager", "Usage: old-name", 1))
    packaged = root / docs.OPENAPI_JSON
    packaged.write_text(packaged.read_text().replace('"3.1.0"', '"3.0.0"', 1))

    checked = run("--check", cwd=root)
    assert checked.returncode == 1, checked.stderr
    assert checked.stdout.splitlines() == [
        f"{path}: stale; run python -m vast_manager.docs to rewrite it"
        for path in ("docs/operations.md", "docs/cli.md", docs.OPENAPI_JSON)
    ]
    assert "| `VM_PORT` | `1` |" in operations.read_text()  # --check writes nothing

    rewritten = run(cwd=root)
    assert rewritten.returncode == 0, rewritten.stderr
    assert len(rewritten.stdout.splitlines()) == 3
    assert operations.read_text() == fresh_operations
    for path in ("docs/cli.md", docs.OPENAPI_JSON):
        assert (root / path).read_text() == (REPO_ROOT / path).read_text()
    again = run("--check", "--root", str(root), cwd=tmp_path)
    assert (again.returncode, again.stdout) == (0, "")


def test_outside_a_checkout_it_says_so_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "cli.md").write_text("mine")
    for args in ((), ("--check",)):
        done = run(*args, cwd=tmp_path)
        assert done.returncode == 2
        assert done.stderr.startswith(f"python -m vast_manager.docs: {tmp_path} is not a "
                                      "vast-manager checkout (no docs/architecture.md,")
        assert "run this from the repository's root, or pass --root DIR" in done.stderr
    assert (tmp_path / "docs" / "cli.md").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cli.md", "docs"]


def test_a_file_without_its_markers_is_named(tmp_path: Path) -> None:
    root = copy_of_the_checkout(tmp_path)
    arch = root / "docs" / "architecture.md"
    arch.write_text(arch.read_text().replace("<!-- agent-settings:end -->", ""))
    done = run("--check", cwd=root)
    assert (done.returncode, done.stderr.strip()) == (
        2, "python -m vast_manager.docs: docs/architecture.md: the agent-settings markers "
           "are missing")
