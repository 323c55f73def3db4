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
ONE_OFF_TASKS = {COORDINATOR / "operations" / "model_keeper.py",
                 # The fake vast.ai tears a destroyed instance down after answering, as
                 # vast.ai does; ``FakeVast.settle`` awaits each teardown.
                 COORDINATOR / "providers" / "fakevast.py"}
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


def test_no_import_inside_a_function_dodges_a_cycle() -> None:
    graph, inner = _import_graph()
    assert inner, "the scan sees the CLI's deferred imports"
    dodging = [f"{m}:{line} imports {t}" for m, line, t in inner
               if m.startswith("vast_manager.coordinator.") and _reaches(graph, t, m)]
    assert dodging == []


# --- floors: every import goes down (docs/architecture.md, "The rooms and their floors") ---

#: The package's rooms, lowest floor first. A module imports only from its own room or
#: from a room on a lower floor: never up, never sideways. ``sim/`` is on top: it drives
#: the agent from outside (``vm-sim-agent``), and nothing in the package imports it; so
#: is ``docs.py``, the contributor's command that renders the docs from both sides.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("protocol",),
    ("common",),
    ("agent",),
    ("coordinator/offers", "coordinator/rows", "coordinator/textsafe",
     "coordinator/settings"),
    ("coordinator/decisions",),
    ("coordinator/discovery", "coordinator/providers", "coordinator/curio_db"),
    ("coordinator/store", "coordinator/exceptions"),
    ("coordinator/operations",),
    ("coordinator/runtime",),
    ("coordinator/web",),
    ("coordinator/cli",),
    ("sim", "docs"),
)
#: Packages that only hold rooms: their ``__init__`` imports nothing of the package.
DOORS = frozenset({"vast_manager", "vast_manager.coordinator"})


def floor_of(rooms: tuple[tuple[str, ...], ...] = FLOORS) -> dict[str, tuple[int, str]]:
    """Room (as a dotted prefix) -> (its floor, its name)."""
    return {"vast_manager." + room.replace("/", "."): (level, room)
            for level, names in enumerate(rooms) for room in names}


def room_of(module: str, floors: dict[str, tuple[int, str]]) -> tuple[int, str] | None:
    """The floor and room of ``module``: the longest room prefix that holds it."""
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        found = floors.get(".".join(parts[:n]))
        if found is not None:
            return found
    return None


def _every_import() -> dict[str, set[str]]:
    """Module -> every package module it imports anywhere: at its top, inside a function,
    under ``TYPE_CHECKING`` (an arrow is an arrow, however late it is followed)."""
    graph, inner = _import_graph()
    every = {m: set(ts) for m, ts in graph.items()}
    for module, _, target in inner:
        every[module].add(target)
    for name, path in {_module_name(p): p for p in
                       (PACKAGE_ROOT / "vast_manager").rglob("*.py")}.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                for sub in ast.walk(node):
                    if isinstance(sub, ast.ImportFrom) and sub.module:
                        every[name] |= {f"{sub.module}.{a.name}" if f"{sub.module}.{a.name}"
                                        in every else sub.module for a in sub.names} & every.keys()
    return every


def climbing(graph: dict[str, set[str]],
             rooms: tuple[tuple[str, ...], ...] = FLOORS) -> list[str]:
    """Every import from a room to one on its own floor or higher, and every module in no
    room, each named."""
    floors = floor_of(rooms)
    found = []
    for module in sorted(graph):
        here = room_of(module, floors)
        if here is None:
            if module not in DOORS:
                found.append(f"{module} is in no room of FLOORS")
            continue
        for target in sorted(graph[module]):
            there = room_of(target, floors)
            if there is None or there[1] == here[1]:
                continue
            if there[0] >= here[0]:
                way = "up" if there[0] > here[0] else "sideways"
                found.append(f"{module} ({here[1]}, floor {here[0]}) imports {target} "
                             f"({there[1]}, floor {there[0]}): {way}")
    return found


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import (module, target) whose target leads back to the module."""
    return [(m, t) for m in sorted(graph) for t in sorted(graph[m]) if _reaches(graph, t, m)]


def test_the_floor_check_fails_on_an_arrow_that_climbs_and_on_a_cycle() -> None:
    # The checks themselves can fail: the arrows the house once had are refused.
    planted = {
        "vast_manager.agent.sampler": {"vast_manager.sim.fake_nvml"},
        "vast_manager.coordinator.decisions.belief": {
            "vast_manager.coordinator.discovery.features"},
        "vast_manager.coordinator.discovery.features": {"vast_manager.coordinator.offers"},
        "vast_manager.coordinator.store.reads": {"vast_manager.coordinator.exceptions"},
        "vast_manager.sim.fake_nvml": set(),
        "vast_manager.coordinator.offers": set(),
        "vast_manager.coordinator.exceptions": set(),
        "vast_manager.elsewhere": set(),
    }
    found = climbing(planted)
    assert any("agent.sampler" in f and ": up" in f for f in found)
    assert any("decisions.belief" in f and ": up" in f for f in found)
    assert any("store.reads" in f and ": sideways" in f for f in found)
    assert any("vast_manager.elsewhere is in no room" in f for f in found)
    assert not any(f.startswith("vast_manager.coordinator.discovery.features") for f in found)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ("a", "b"), ("b", "c"), ("c", "a")]


def test_every_import_goes_down_a_floor() -> None:
    graph = _every_import()
    assert sum(len(ts) for ts in graph.values()) > 300, "the scan sees the package's arrows"
    assert climbing(graph) == []


def test_no_import_cycle_in_the_package() -> None:
    assert cycles(_every_import()) == []


def test_the_doors_import_nothing_of_the_package() -> None:
    graph = _every_import()
    assert {door: graph[door] for door in DOORS} == {door: set() for door in DOORS}


def test_the_web_builds_no_write_job() -> None:
    # It decodes, authenticates, calls one operation and encodes: the store's handle
    # (``Store``, to run an operation's job) is all it takes of the write path, and no
    # function of its takes a transaction.
    found = []
    for path, tree in modules(WEB):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "vast_manager.coordinator.store.writ"):
                found += [f"{where(path, node)} imports {a.name}" for a in node.names
                          if a.name != "Store"]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                found += [f"{where(path, node)} takes a transaction ({a.arg})"
                          for a in node.args.args if a.arg == "tx"
                          or (a.annotation is not None and "Tx" in ast.unparse(a.annotation))]
    assert found == []
