"""The default test suite's wall time: an older commit's against this working tree.

Run: ``python bench/suite_speed.py`` (``--old REV``, default ``ca24996``; ``--new REV``,
default ``HEAD``; ``--keep`` leaves the temporary folder; extra pytest arguments after
``--``).

Each side gets its own checkout and its own fresh virtual environment with the package
installed editable with its test extras (``pip install -e '.[test]'``), so each tree's
``vast_manager`` and its console scripts (``vm-sim-cuzk``, ``vast-agent``, ...) are that
tree's: the old commit may lay the package out differently (top-level folders linked
into ``vast_manager/``) and name other entry points. Each side is a detached
``git worktree`` of its commit (commit what you want timed), so tests that read git
history find it and nothing in the working tree is touched. Both installs happen first;
then the two suites run back to back, each as the README says (``python -m pytest -q``
in its root, with that tree's own pytest configuration), and the script prints both
wall times, their ratio and each summary line.
The machine's other load shows in both; run it on a quiet machine, once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLD = "ca24996"


def sh(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=True, text=True, **kw)  # type: ignore[call-overload]


def checkout(rev: str, dest: Path) -> None:
    """A detached worktree of ``rev`` at ``dest``."""
    sh(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(dest), rev])


def make_venv(tree: Path, venv: Path) -> Path:
    """A fresh environment with ``tree`` installed editable with its test extras."""
    sh([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    done = subprocess.run([str(py), "-m", "pip", "install", "-q", "-e", f"{tree}[test]"],
                          cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:  # pip's warnings are shown only when the install failed
        raise SystemExit(f"installing {tree} failed:\n{done.stderr[-3000:]}")
    return py


def run_suite(tree: Path, py: Path, extra: list[str]) -> tuple[float, int, str]:
    """Wall seconds, exit status and the last line of ``python -m pytest -q`` in ``tree``."""
    env = dict(os.environ)
    env["PATH"] = f"{py.parent}{os.pathsep}{env.get('PATH', '')}"  # this tree's scripts first
    env.pop("PYTHONPATH", None)
    start = time.monotonic()
    done = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra],
                          cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    return wall, done.returncode, lines[-1] if lines else done.stderr.strip()[-300:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--old", default=OLD, help=f"the commit to compare with (default {OLD})")
    ap.add_argument("--new", default="HEAD", help="the commit to time against it (default HEAD)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument("pytest_args", nargs="*", help="extra arguments for both pytest runs")
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="suite-speed-"))
    old_tree, new_tree = base / "old", base / "new"
    try:
        checkout(args.old, old_tree)
        checkout(args.new, new_tree)
        print(f"installing both trees into fresh environments under {base} ...", flush=True)
        old_py = make_venv(old_tree, base / "venv-old")
        new_py = make_venv(new_tree, base / "venv-new")

        print(f"old ({args.old}): running its default suite ...", flush=True)
        old_s, old_rc, old_line = run_suite(old_tree, old_py, args.pytest_args)
        print(f"  {old_s:.0f} s, exit {old_rc}: {old_line}", flush=True)
        print(f"new ({args.new}): running its default suite ...", flush=True)
        new_s, new_rc, new_line = run_suite(new_tree, new_py, args.pytest_args)
        print(f"  {new_s:.0f} s, exit {new_rc}: {new_line}", flush=True)

        change = 100 * (1 - new_s / old_s)
        print(f"old {old_s:.0f} s, new {new_s:.0f} s: the new suite takes "
              f"{new_s / old_s:.2f}x the old one's wall time "
              f"({abs(change):.0f}% {'faster' if change >= 0 else 'slower'})")
        if old_rc != 0 or new_rc != 0:
            print("a suite failed: its time is not comparable", file=sys.stderr)
            raise SystemExit(1)
    finally:
        for tree in (old_tree, new_tree):
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True)
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
