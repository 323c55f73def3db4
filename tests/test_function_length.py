"""No function in src/ is longer than 80 lines (from its ``def`` to its last line,
decorators aside, nested functions counted in their own right and in their parent), and
no module of coordinator/operations/ longer than 500 lines."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "vast_manager"
MAX_LINES = 80



def _functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """(qualified name, lines) of every function under ``node``, nested ones included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + child.name
            yield name, (child.end_lineno or child.lineno) - child.lineno + 1
            yield from _functions(child, name + ".")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, prefix + child.name + ".")
        else:
            yield from _functions(child, prefix)


def lengths() -> dict[tuple[str, str], int]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        for name, lines in _functions(ast.parse(path.read_text())):
            out[(module, name)] = lines
    return out


def test_no_function_is_longer_than_80_lines() -> None:
    found = lengths()
    assert len(found) > 500  # the scan found the package's functions
    too_long = {key: lines for key, lines in found.items() if lines > MAX_LINES}
    assert too_long == {}, f"functions over {MAX_LINES} lines"


def test_the_scan_sees_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    tree = ast.parse(f"class C:\n    def f(self):\n{body.replace('    ', '        ')}\n")
    assert dict(_functions(tree)) == {"C.f": MAX_LINES + 1}


#: A module of ``coordinator/operations/`` does one thing (docs/architecture.md): past
#: this many lines it has begun to do two.
MAX_OPERATIONS_MODULE_LINES = 500


def test_no_operations_module_is_longer_than_500_lines() -> None:
    modules = sorted((SRC / "coordinator" / "operations").glob("*.py"))
    assert len(modules) > 20  # the scan found the operations
    too_long = {p.name: n for p in modules
                if (n := len(p.read_text().splitlines())) > MAX_OPERATIONS_MODULE_LINES}
    assert too_long == {}, f"split these modules by what each thing that happens is: {too_long}"
