"""clap 4's argument parsing, emulated: the simulated cuzk refuses what the real one refuses.

cuzk-daemon and cuzk-bench parse their command lines with clap's derive API
(clap 4.5.59 in Curio's extern/cuzk/Cargo.lock at e0294b0f). This module
parses a command line against a `Command` tree the same way for the parts
those two programs use (options with values, boolean flags, nested
subcommands, defaults, required options, unsigned integers) and fails the
way clap does: the message clap prints (``error: unexpected argument '-n'
found``, the usage line, ``For more information, try '--help'.``) on
stderr and exit status 2; ``-h``/``--help`` print help on stdout, status 0.
The wording follows clap_builder's error/format.rs and parser/parser.rs at
v4.5.59 (docs/cuzk.md). Neither program sets ``version``, so ``-V`` and
``--version`` are unknown arguments, as with the real ones.

`Command.from_spec` builds a tree from the JSON shape of the project's
pinned fixture (tests/fixtures), so the tests check command lines against
the real definitions with the same parser.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TAB = "  "
USAGE_CODE = 2
# clap's unsigned integer value parsers: Rust's own parse errors.
INT_BITS = {"u32": 32, "u64": 64, "usize": 64}


@dataclass(frozen=True)
class Arg:
    """One option (``--long <VALUE>``, maybe ``-s``) or boolean flag of a command."""

    id: str
    long: str
    short: str | None = None
    kind: str = "string"  # string, path, u32, u64, usize, or flag (SetTrue, no value)
    default: str | None = None
    required: bool = False

    @property
    def value_name(self) -> str:
        return self.id.upper()

    @property
    def takes_value(self) -> bool:
        return self.kind != "flag"

    def display(self) -> str:
        """How clap names the argument in errors: ``--count <COUNT>``."""
        return f"--{self.long} <{self.value_name}>" if self.takes_value else f"--{self.long}"


@dataclass(frozen=True)
class Command:
    name: str
    args: tuple[Arg, ...] = ()
    subcommands: tuple[Command, ...] = ()
    about: str = ""

    @property
    def subcommand_required(self) -> bool:
        # Every command here with subcommands has a non-optional subcommand field.
        return bool(self.subcommands)

    def sub(self, name: str) -> Command | None:
        return next((s for s in self.subcommands if s.name == name), None)

    @classmethod
    def from_spec(cls, name: str, spec: Mapping[str, Any]) -> Command:
        """A command from the fixture's JSON shape: ``{"args": [...], "subcommands": {...}}``."""
        args = tuple(
            Arg(
                id=a["id"], long=a["long"], short=a.get("short"), kind=a.get("kind", "string"),
                default=a.get("default"), required=bool(a.get("required", False)),
            )
            for a in spec.get("args", [])
        )
        subs = tuple(cls.from_spec(n, s) for n, s in (spec.get("subcommands") or {}).items())
        return cls(name, args, subs, spec.get("about", ""))

    def to_spec(self) -> dict[str, Any]:
        """The inverse of `from_spec` (the fixture's JSON shape), for comparing definitions."""
        out: dict[str, Any] = {"args": []}
        for a in self.args:
            item: dict[str, Any] = {"id": a.id, "long": a.long, "kind": a.kind}
            if a.short is not None:
                item["short"] = a.short
            if a.default is not None:
                item["default"] = a.default
            if a.required:
                item["required"] = True
            out["args"].append(item)
        if self.subcommands:
            out["subcommands"] = {s.name: s.to_spec() for s in self.subcommands}
        return out


class ClapError(Exception):
    """A refused command line (or help). ``text`` is what clap prints; ``code`` its exit status."""

    def __init__(self, text: str, code: int = USAGE_CODE, *, kind: str = "usage") -> None:
        super().__init__(text.rstrip("\n").splitlines()[0] if text else kind)
        self.text = text
        self.code = code
        self.kind = kind

    @property
    def to_stdout(self) -> bool:
        return self.code == 0


@dataclass
class Matches:
    """What a successful parse found: values by arg id (defaults filled in), and the subcommand."""

    command: Command
    values: dict[str, Any] = field(default_factory=dict)
    subcommand: Matches | None = None

    def path(self) -> list[str]:
        """The subcommand names, outermost first (``["batch"]``)."""
        out: list[str] = []
        m = self.subcommand
        while m is not None:
            out.append(m.command.name)
            m = m.subcommand
        return out

    def leaf(self) -> Matches:
        m = self
        while m.subcommand is not None:
            m = m.subcommand
        return m


def jaro(a: str, b: str) -> float:
    """Jaro similarity (strsim::jaro, which clap uses for its "a similar argument" tip)."""
    if a == b:
        return 1.0
    if not a or not b:
        return 0.0
    window = max(max(len(a), len(b)) // 2 - 1, 0)
    a_hit = [False] * len(a)
    b_hit = [False] * len(b)
    matches = 0
    for i, ch in enumerate(a):
        lo, hi = max(0, i - window), min(len(b), i + window + 1)
        for j in range(lo, hi):
            if not b_hit[j] and b[j] == ch:
                a_hit[i] = b_hit[j] = True
                matches += 1
                break
    if matches == 0:
        return 0.0
    a_chars = [c for c, hit in zip(a, a_hit, strict=True) if hit]
    b_chars = [c for c, hit in zip(b, b_hit, strict=True) if hit]
    transpositions = sum(1 for x, y in zip(a_chars, b_chars, strict=True) if x != y) / 2
    m = float(matches)
    return (m / len(a) + m / len(b) + (m - transpositions) / m) / 3.0


def _did_you_mean(value: str, candidates: Sequence[str]) -> str | None:
    best: tuple[float, str] | None = None
    for c in candidates:
        score = jaro(value, c)
        # clap keeps candidates above 0.7 and takes the most similar, the later on a tie.
        if score > 0.7 and (best is None or score >= best[0]):
            best = (score, c)
    return best[1] if best else None


def _parse_uint(arg: Arg, raw: str) -> int:
    bits = INT_BITS[arg.kind]
    if raw == "":
        reason = "cannot parse integer from empty string"
    elif not all(c.isdigit() and c.isascii() for c in raw.lstrip("+")) or raw in ("+",):
        reason = "invalid digit found in string"
    elif int(raw) >= 1 << bits:
        reason = "number too large to fit in target type"
    else:
        return int(raw)
    raise ClapError(
        f"error: invalid value '{raw}' for '{arg.display()}': {reason}\n\n"
        "For more information, try '--help'.\n"
    )


class _Parser:
    def __init__(self, bin_name: str) -> None:
        self.bin_name = bin_name

    def usage(self, cmd: Command, usage_name: str, used: Sequence[Arg] = ()) -> str:
        parts = [usage_name]
        optional = [a for a in cmd.args if not a.required]
        if not used and optional:
            parts.append("[OPTIONS]")
        shown = [a for a in cmd.args if a.required]
        shown += [a for a in used if a not in shown]
        parts.extend(a.display() for a in shown)
        if cmd.subcommand_required:
            parts.append("<COMMAND>")
        return "Usage: " + " ".join(parts)

    def fail(
        self, message: str, cmd: Command, usage_name: str, used: Sequence[Arg] = ()
    ) -> ClapError:
        return ClapError(
            f"error: {message}\n\n{self.usage(cmd, usage_name, used)}\n\n"
            "For more information, try '--help'.\n"
        )

    def help_text(self, cmd: Command, usage_name: str) -> str:
        lines = [cmd.about, ""] if cmd.about else []
        lines.append(self.usage(cmd, usage_name))
        if cmd.subcommands:
            lines += ["", "Commands:"]
            lines += [f"  {s.name}" for s in cmd.subcommands]
            lines.append("  help  Print this message or the help of the given subcommand(s)")
        lines += ["", "Options:"]
        for a in cmd.args:
            short = f"-{a.short}, " if a.short else "    "
            value = f" <{a.value_name}>" if a.takes_value else ""
            default = f" [default: {a.default}]" if a.default is not None and a.takes_value else ""
            lines.append(f"  {short}--{a.long}{value}{default}")
        lines.append("  -h, --help  Print help")
        return "\n".join(lines) + "\n"

    def parse(self, cmd: Command, argv: Sequence[str], usage_name: str) -> Matches:
        matches = Matches(cmd)
        given: list[Arg] = []
        by_long = {a.long: a for a in cmd.args}
        by_short = {a.short: a for a in cmd.args if a.short}
        i = 0
        trailing = False

        def take(arg: Arg, value: str | None) -> None:
            if arg in given:
                raise self.fail(
                    f"the argument '{arg.display()}' cannot be used multiple times",
                    cmd, usage_name, [arg],
                )
            given.append(arg)
            if not arg.takes_value:
                matches.values[arg.id] = True
                return
            if value is None:
                raise self.fail(
                    f"a value is required for '{arg.display()}' but none was supplied",
                    cmd, usage_name,
                )
            matches.values[arg.id] = _parse_uint(arg, value) if arg.kind in INT_BITS else value

        def next_value() -> str | None:
            nonlocal i
            if i + 1 < len(argv) and not (argv[i + 1].startswith("-") and argv[i + 1] != "-"):
                i += 1
                return argv[i]
            return None

        while i < len(argv):
            tok = argv[i]
            if not trailing and tok == "--":
                trailing = True
            elif not trailing and tok.startswith("--"):
                name, eq, value = tok[2:].partition("=")
                if name == "help":
                    raise ClapError(self.help_text(cmd, usage_name), 0, kind="help")
                found = by_long.get(name)
                if found is None:
                    raise self._unknown_long(cmd, usage_name, name, by_long)
                if eq and not found.takes_value:
                    raise self.fail(
                        f"unexpected value '{value}' for '--{name}' found; no more were expected",
                        cmd, usage_name, [found],
                    )
                take(found, value if eq else (next_value() if found.takes_value else None))
            elif not trailing and tok.startswith("-") and tok != "-":
                cluster = tok[1:]
                while cluster:
                    ch, cluster = cluster[0], cluster[1:]
                    if ch == "h":
                        raise ClapError(self.help_text(cmd, usage_name), 0, kind="help")
                    found = by_short.get(ch)
                    if found is None:
                        raise self.fail(f"unexpected argument '-{ch}' found", cmd, usage_name)
                    if found.takes_value:
                        value = cluster[1:] if cluster.startswith("=") else cluster
                        take(found, value if cluster else next_value())
                        cluster = ""
                    else:
                        take(found, None)
            else:
                sub = cmd.sub(tok) if not trailing else None
                if sub is not None:
                    self._check_required(cmd, usage_name, given)
                    self._defaults(cmd, matches)
                    matches.subcommand = self.parse(sub, argv[i + 1 :], f"{usage_name} {tok}")
                    return matches
                raise self._unexpected_word(cmd, usage_name, tok, trailing)
            i += 1
        if cmd.subcommand_required:
            raise self._no_subcommand(cmd, usage_name, argv)
        self._check_required(cmd, usage_name, given)
        self._defaults(cmd, matches)
        return matches

    def _unknown_long(self, cmd: Command, usage_name: str, name: str,
                      by_long: dict[str, Arg]) -> ClapError:
        tip = _did_you_mean(name, [a.long for a in cmd.args] + ["help"])
        text = f"error: unexpected argument '--{name}' found\n"
        if tip is not None:
            text += f"\n{TAB}tip: a similar argument exists: '--{tip}'\n"
        used = [by_long[tip]] if tip in by_long else []
        return ClapError(
            text + f"\n{self.usage(cmd, usage_name, used)}\n\n"
            "For more information, try '--help'.\n"
        )

    def _unexpected_word(self, cmd: Command, usage_name: str, tok: str,
                         trailing: bool) -> ClapError:
        """A word that is no subcommand: help, a tip towards a similar subcommand, or no."""
        if tok == "help" and cmd.subcommands and not trailing:
            return ClapError(self.help_text(cmd, usage_name), 0, kind="help")
        if cmd.subcommands:
            tip = _did_you_mean(tok, [s.name for s in cmd.subcommands])
            if tip is not None:
                return ClapError(
                    f"error: unrecognized subcommand '{tok}'\n\n"
                    f"{TAB}tip: a similar subcommand exists: '{tip}'\n\n"
                    f"{self.usage(cmd, usage_name)}\n\n"
                    "For more information, try '--help'.\n"
                )
            return self.fail(f"unrecognized subcommand '{tok}'", cmd, usage_name)
        return self.fail(f"unexpected argument '{tok}' found", cmd, usage_name)

    def _no_subcommand(self, cmd: Command, usage_name: str, argv: Sequence[str]) -> ClapError:
        if not argv:
            # clap derive sets arg_required_else_help with a required subcommand.
            return ClapError(self.help_text(cmd, usage_name), USAGE_CODE, kind="help")
        names = ", ".join([s.name for s in cmd.subcommands] + ["help"])
        return ClapError(
            f"error: '{usage_name}' requires a subcommand but one was not provided\n"
            f"{TAB}[subcommands: {names}]\n\n{self.usage(cmd, usage_name)}\n\n"
            "For more information, try '--help'.\n"
        )

    def _check_required(self, cmd: Command, usage_name: str, given: list[Arg]) -> None:
        missing = [a for a in cmd.args if a.required and a not in given]
        if missing:
            listed = "".join(f"\n{TAB}{a.display()}" for a in missing)
            raise ClapError(
                f"error: the following required arguments were not provided:{listed}\n\n"
                f"{self.usage(cmd, usage_name, given)}\n\n"
                "For more information, try '--help'.\n"
            )

    @staticmethod
    def _defaults(cmd: Command, matches: Matches) -> None:
        for a in cmd.args:
            if a.id in matches.values:
                continue
            if a.kind == "flag":
                matches.values[a.id] = a.default == "true"
            elif a.default is not None:
                matches.values[a.id] = int(a.default) if a.kind in INT_BITS else a.default
            else:
                matches.values[a.id] = None


def parse(cmd: Command, argv: Sequence[str]) -> Matches:
    """Parse ``argv`` (``argv[0]`` = the program, whose file name clap uses in its usage line)."""
    bin_name = os.path.basename(argv[0]) if argv else cmd.name
    parser = _Parser(bin_name)
    return parser.parse(cmd, list(argv[1:]), bin_name)


def parse_or_exit(cmd: Command, argv: Sequence[str]) -> Matches:
    """`parse`, printing and exiting as clap does when the command line is refused or help asked."""
    import sys

    try:
        return parse(cmd, argv)
    except ClapError as exc:
        stream = sys.stdout if exc.to_stdout else sys.stderr
        stream.write(exc.text)
        stream.flush()
        raise SystemExit(exc.code) from None
