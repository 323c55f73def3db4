"""The composition root is the only place that builds the core and starts its loops; the
web only serves it; no import inside a function dodges a cycle (docs/architecture.md,
"Layout": the rule of the rooms). Read from the source with ``ast``: nothing is imported."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import vast_manager.coordinator as coordinator_package

COORDINATOR = Path(coordinator_package.__file__).parent
PACKAGE_ROOT = COORDINATOR.parent.parent  # src/
RUNTIME = COORDINATOR / "runtime.py"
WEB = COORDINATOR / "web"

#: The parts of the core: only the runtime constructs them.
CORE_CLASSES = frozenset({"Monitor", "Deployer", "ModelKeeper", "Autopilot",
                          "HeartbeatTracker", "Runtime"})
#: Calls that start a background task.
TASK_STARTERS = frozenset({"create_task", "ensure_future", "TaskGroup"})
#: A task started outside the runtime, and why it is not a loop: the keeper's one refit
#: at a time, awaited (shielded) by whoever asked for the model.
ONE_OFF_TASKS = {COORDINATOR / "operations" / "model_keeper.py"}
#: aiohttp's lifecycle hooks.
LIFECYCLE_HOOKS = frozenset({"on_startup", "cleanup_ctx", "on_cleanup", "on_shutdown"})


def modules(root: Path) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(root.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(PACKAGE_ROOT)}:{getattr(node, 'lineno', '?')}"


def test_the_scan_sees_the_runtime_do_what_it_forbids_elsewhere() -> None:
    # The scan is live: the runtime itself starts tasks and builds every core class.
    tree = ast.parse(RUNTIME.read_text())
    calls = {called_name(n) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "create_task" in calls
    assert CORE_CLASSES - {"Runtime"} <= calls


def test_no_module_outside_the_runtime_starts_a_task() -> None:
    found = [
        where(path, node)
        for path, tree in modules(COORDINATOR)
        if path != RUNTIME and path not in ONE_OFF_TASKS
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and called_name(node) in TASK_STARTERS
    ]
    assert found == [], "background tasks start in coordinator/runtime.py (Runtime.spawn)"


def test_lifecycle_hooks_only_hand_over_to_the_runtime() -> None:
    # app.on_startup.append(f), app.cleanup_ctx.append(f): f must be runtime.hosted(...).
    found = []
    for path, tree in modules(COORDINATOR):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("append", "insert", "extend")
                    and isinstance(node.func.value, ast.Attribute)
                    and node.func.value.attr in LIFECYCLE_HOOKS):
                continue
            arg = node.args[-1] if node.args else None
            if not (isinstance(arg, ast.Call) and called_name(arg) == "hosted"):
                found.append(where(path, node))
    assert found == [], "a lifecycle hook that is not the runtime's start and stop"


def test_only_the_runtime_builds_the_core() -> None:
    found = [
        f"{where(path, node)} builds {called_name(node)}"
        for path, tree in modules(COORDINATOR)
        if path != RUNTIME
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and called_name(node) in CORE_CLASSES - {"Runtime"}
    ]
    assert found == []


def test_the_web_constructs_no_part_of_the_core() -> None:
    found = [
        f"{where(path, node)} builds {called_name(node)}"
        for path, tree in modules(WEB)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and called_name(node) in CORE_CLASSES | {"Store", "Account", "account_watch"}
        # The tests' and benches' one call (web.app.create_app) hands a store to the
        # composition root; the web builds nothing of its own.
        and not (called_name(node) == "Runtime" and path == WEB / "app.py")
    ]
    assert found == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_graph() -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    """Module -> the package modules it imports at its top; and every import made inside
    a function: (module, line, target)."""
    paths = {_module_name(p): p for p in (PACKAGE_ROOT / "vast_manager").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    inner: list[tuple[str, int, str]] = []

    def targets(node: ast.ImportFrom | ast.Import) -> set[str]:
        if isinstance(node, ast.Import):
            return {a.name for a in node.names if a.name in paths}
        base = node.module or ""
        return {f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base
                for a in node.names} & paths.keys()

    for name, path in paths.items():
        tree = ast.parse(path.read_text())
        graph[name] = set()
        for node in tree.body:  # a module's top (TYPE_CHECKING blocks are not imports)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= targets(node)
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        inner.extend((name, node.lineno, t) for t in targets(node))
    return graph, inner


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen: set[str] = set()
    todo = [start]
    while todo:
        here = todo.pop()
        if here == goal:
            return True
        if here not in seen:
            seen.add(here)
            todo.extend(graph.get(here, ()))
    return False


def test_no_import_cycle_between_coordinator_modules() -> None:
    graph, _ = _import_graph()
    coordinator = {m for m in graph if m.startswith("vast_manager.coordinator.")}
    # A package's __init__ that re-exports its modules is no cycle of theirs.
    packages = {m for m in graph if (PACKAGE_ROOT / m.replace(".", "/") / "__init__.py").exists()}
    modules_only = {m: {t for t in ts if t not in packages} for m, ts in graph.items()}
    cycles = [(m, t) for m in sorted(coordinator - packages) for t in sorted(modules_only[m])
              if _reaches(modules_only, t, m)]
    assert cycles == []


def test_no_import_inside_a_function_dodges_a_cycle() -> None:
    graph, inner = _import_graph()
    assert inner, "the scan sees the CLI's deferred imports"
    dodging = [f"{m}:{line} imports {t}" for m, line, t in inner
               if m.startswith("vast_manager.coordinator.") and _reaches(graph, t, m)]
    assert dodging == []
