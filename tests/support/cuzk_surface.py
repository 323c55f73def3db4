"""The real cuzk command lines, from the pinned fixture (tests/fixtures/cuzk_e0294b0f.json).

The fixture transcribes the clap declarations of cuzk-daemon and cuzk-bench
(each field's Rust type and ``#[arg(...)]``) at the commit it names. This
module applies clap derive's rules to them (a long option named after its
field in kebab case, ``short`` taking the field's first letter, an optional
field being ``Option<...>``, a field without a default required, ``bool`` a
flag, subcommands named after their variants in kebab case), so the checks
rest on the declarations, not on the simulator's own copy of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vast_manager.sim import clap

from support.paths import FIXTURES

FIXTURE = FIXTURES / "cuzk_e0294b0f.json"
SURFACE: dict[str, Any] = json.loads(FIXTURE.read_text())
COMMIT: str = SURFACE["source"]["commit"]

_KINDS = {"u64": "u64", "u32": "u32", "usize": "usize", "PathBuf": "path", "String": "string",
          "bool": "flag"}


def _kebab(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower().replace("_", "-")


def _arg(field: dict[str, Any]) -> clap.Arg:
    attr: str = field["arg"]
    rust_type: str = field["type"]
    optional = rust_type.startswith("Option<")
    inner = rust_type[len("Option<") : -1] if optional else rust_type
    long = re.search(r'long = "([^"]+)"', attr)
    short = re.search(r"short = '(.)'", attr)
    default = re.search(r'default_value = "([^"]*)"', attr)
    has_short = short is not None or re.search(r"(^|, )short(,|$)", attr) is not None
    return clap.Arg(
        id=field["field"],
        long=long.group(1) if long else _kebab(field["field"]),
        short=(short.group(1) if short else field["field"][0]) if has_short else None,
        kind=_KINDS[inner],
        default=default.group(1) if default else None,
        required=not optional and default is None and inner != "bool",
    )


def _command(name: str, fields: Sequence[dict[str, Any]], program: dict[str, Any],
             subcommand_enum: str | None = None, about: str = "") -> clap.Command:
    args = tuple(_arg(f) for f in fields if f["arg"] != "__subcommand__")
    subs: tuple[clap.Command, ...] = ()
    if subcommand_enum is not None:
        subs = tuple(
            _command(_kebab(v["variant"]), v.get("fields", []), program, v.get("subcommand"))
            for v in program[subcommand_enum]
        )
    return clap.Command(name, args, subs, about)


def bench_command() -> clap.Command:
    p = SURFACE["cuzk-bench"]
    return _command("cuzk-bench", p["Cli"], p, "Commands", p["command"]["about"])


def daemon_command() -> clap.Command:
    p = SURFACE["cuzk-daemon"]
    return _command("cuzk-daemon", p["Cli"], p, None, p["command"]["about"])


def check(argv: Sequence[str]) -> clap.Matches:
    """Parse an agent-built command line as the real program would; raises `clap.ClapError`.

    ``argv[0]`` decides which program: one whose name has ``bench`` in it is
    cuzk-bench, anything else cuzk-daemon (installed as ``cuzk``).
    """
    cmd = bench_command() if "bench" in Path(argv[0]).name else daemon_command()
    return clap.parse(cmd, argv)
