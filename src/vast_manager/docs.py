"""Every generated doc, rewritten by one command and checked by the same one.

``python -m vast_manager.docs`` rewrites them in the checkout it is run from (or ``--root
DIR``); ``python -m vast_manager.docs --check`` writes nothing, prints one line per stale
file and exits 1 when any is stale (CI runs it, and ``tests/test_generated_docs.py``).

What is generated, each from its one declaration:

- the settings tables between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` markers in
  docs/operations.md (``coordinator/settings.py``) and docs/architecture.md
  (``agent/config.py``);
- docs/cli.md, from the commands' own ``--help`` (``coordinator/cli/clidoc.py``);
- ``coordinator/web/data/openapi.json``, the packaged JSON copy of docs/openapi.yaml (the
  YAML is written by hand; this reads it with PyYAML, a test extra: ``pip install -e
  '.[test]'``).

A contributor's tool: it reads and writes the repository's files, never an installed
package's, so it refuses to run anywhere but a checkout's root.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vast_manager.agent import config as agent_config
from vast_manager.coordinator import settings as coord_settings
from vast_manager.coordinator.cli import clidoc
from vast_manager.coordinator.cli.commands import cli

OPENAPI_YAML = "docs/openapi.yaml"
OPENAPI_JSON = "src/vast_manager/coordinator/web/data/openapi.json"


class DocsError(Exception):
    """What stops the generation: not a checkout, a file's markers missing, no PyYAML."""


@dataclass(frozen=True)
class Generated:
    """One generated file: its path in the repository, and its whole new text made from its
    current text (a marked section replaced, or the file written anew)."""

    path: str
    render: Callable[[Path, str], str]


def between_markers(name: str, table: Callable[[], str]) -> Callable[[Path, str], str]:
    """Replace what lies between ``<!-- name:begin -->`` and ``<!-- name:end -->``."""

    def render(root: Path, current: str) -> str:
        begin, end = f"<!-- {name}:begin -->\n", f"\n<!-- {name}:end -->"
        start, stop = current.find(begin), current.find(end)
        if start < 0 or stop < start:
            raise DocsError(f"the {name} markers are missing")
        return current[: start + len(begin)] + table() + current[stop:]

    return render


def openapi_json(root: Path, current: str) -> str:
    try:
        import yaml  # a test extra: only contributors regenerate the packaged copy
    except ImportError as exc:
        raise DocsError("PyYAML is missing: pip install -e '.[test]'") from exc
    document = yaml.safe_load((root / OPENAPI_YAML).read_text())
    return json.dumps(document, indent=1)


GENERATED = (
    Generated("docs/operations.md", between_markers("settings", coord_settings.settings_markdown)),
    Generated("docs/operations.md", between_markers(
        "settings-vast", lambda: coord_settings.settings_markdown(coord_settings.VAST_SETTINGS))),
    Generated("docs/architecture.md",
              between_markers("agent-settings", agent_config.settings_markdown)),
    Generated("docs/cli.md", lambda root, current: clidoc.render(cli)),
    Generated(OPENAPI_JSON, openapi_json),
)


def check_root(root: Path) -> None:
    """Refuse a directory that is not the checkout's root, naming what is missing."""
    missing = [p for p in {g.path for g in GENERATED} | {OPENAPI_YAML, "pyproject.toml"}
               if not (root / p).is_file()]
    if missing:
        raise DocsError(
            f"{root} is not a vast-manager checkout (no {', '.join(sorted(missing))}): run "
            "this from the repository's root, or pass --root DIR")


def regenerate(root: Path) -> dict[str, tuple[str, str]]:
    """Each generated file's (current, fresh) text, sections of one file applied in turn."""
    check_root(root)
    texts: dict[str, tuple[str, str]] = {}
    for item in GENERATED:
        current, fresh = texts.get(item.path) or ((root / item.path).read_text(),) * 2
        try:
            texts[item.path] = (current, item.render(root, fresh))
        except DocsError as exc:
            raise DocsError(f"{item.path}: {exc}") from exc
    return texts


def stale(root: Path) -> list[str]:
    """The generated files whose text is not what their declarations make."""
    return [path for path, (current, fresh) in regenerate(root).items() if current != fresh]


def write(root: Path) -> list[str]:
    """Rewrite every stale generated file; the paths rewritten."""
    changed = []
    for path, (current, fresh) in regenerate(root).items():
        if current != fresh:
            (root / path).write_text(fresh)
            changed.append(path)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vast_manager.docs",
        description="Rewrite every generated doc (settings tables, docs/cli.md, the packaged "
                    "openapi.json) from its declaration; --check only reports the stale ones.")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; one line per stale file, exit 1 if any")
    parser.add_argument("--root", type=Path, default=Path.cwd(),
                        help="the repository's root (default: the current directory)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        if args.check:
            found = stale(root)
            for path in found:
                print(f"{path}: stale; run python -m vast_manager.docs to rewrite it")
            return 1 if found else 0
        for path in write(root):
            print(f"{path}: rewritten")
    except DocsError as exc:
        print(f"python -m vast_manager.docs: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
