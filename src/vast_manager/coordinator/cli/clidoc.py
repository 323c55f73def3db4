"""Generate docs/cli.md from the commands' own --help, so the reference cannot drift.

``python -m vast_manager.docs`` writes it with the other generated docs; its ``--check``
(CI, and a test) fails when the file is stale.
"""

from __future__ import annotations

from collections.abc import Iterator

import click

HEADER = """# `vast-manager` command reference

Generated from `--help` by `python -m vast_manager.docs` (with the other generated docs);
`python -m vast_manager.docs --check` fails when this file is stale. Commands that talk to a running
coordinator take `--url` (env `VM_URL`, default `http://127.0.0.1:8420`)
and read the admin token from `VM_ADMIN_TOKEN`.
"""


def walk(
    command: click.Command, path: list[str]
) -> Iterator[tuple[list[str], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            yield from walk(command.commands[name], [*path, name])


def help_text(command: click.Command, path: list[str]) -> str:
    from vast_manager.coordinator.cli.commands import cli

    parent: click.Context | None = None
    for i, name in enumerate(path):
        # The root's context settings (help option names) reach every command,
        # as they do when a user types --help.
        extra = dict(cli.context_settings) if i == 0 else {}
        parent = click.Context(
            click.Command(name) if i < len(path) - 1 else command,
            info_name=name,
            parent=parent,
            **extra,
        )
    assert parent is not None
    parent.terminal_width = 100
    parent.max_content_width = 100
    return command.get_help(parent)


def render(root: click.Command, prog: str = "vast-manager") -> str:
    parts = [HEADER]
    for path, command in walk(root, [prog]):
        title = " ".join(path)
        parts.append(f"## `{title}`\n\n```text\n{help_text(command, path)}\n```\n")
    return "\n".join(parts)

