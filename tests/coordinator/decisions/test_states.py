"""One definition of the instance states (``coordinator/decisions/states.py``): the wire
phases are states, the named sets hold what the code relies on, SQL and the dashboard get
them from there, one operation sends an instance to ``terminating``, and no other file of
the tree lists states (Python, SQL in strings, JavaScript, HTML, CSS)."""

from __future__ import annotations

import ast
import json
import os
import re
import sqlite3
import subprocess
from pathlib import Path
from typing import Any, get_args

import pytest

from vast_manager.coordinator.decisions import reconcile, states
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.store.migrations import ACTIVE_SQL
from vast_manager.coordinator.store.writer import Store, Tx
from vast_manager.protocol import messages

from support.coord_support import start
from support.paths import REPO_ROOT
from support.tools import require_tool

ROOT = REPO_ROOT
PACKAGE = ROOT / "src" / "vast_manager"


def _rel(path: Path) -> str:
    """A module's path inside the package (``coordinator/store/writer.py``), else the repo's."""
    return str(path.relative_to(PACKAGE if path.is_relative_to(PACKAGE) else ROOT))
NAMES = frozenset(s.value for s in State)
MEMBERS = frozenset(s.name for s in State)

# --- the definition ------------------------------------------------------------------------


def names(members: Any) -> set[str]:
    return {str(m) for m in members}


def test_every_wire_phase_is_a_state_and_the_protocol_lists_them_once() -> None:
    assert get_args(messages.Phase) == messages.PHASES
    assert names(states.PHASES) == set(messages.PHASES)
    # What only the coordinator sees: no hello yet, silence, and the two ends.
    assert NAMES - set(messages.PHASES) == {"deploying", "lost", "destroyed", "vanished"}
    assert [s.value for s in states.ordered(messages.PHASES)] == list(messages.PHASES)


def test_the_named_sets() -> None:
    assert names(states.GONE) == {"destroyed", "vanished"}
    assert names(states.BILLING) == NAMES - {"destroyed", "vanished"}
    assert names(states.ENDING) == {"terminating", "failed", "destroyed", "vanished"}
    assert names(states.ENDING_PHASES) == {"terminating", "failed"}
    assert names(states.ACTIVE_PHASES) == {"booting", "fetching_params", "warming",
                                           "benchmarking", "proving"}
    assert names(states.FIRST_BENCHMARK) == names(states.ACTIVE_PHASES) - {"proving"}
    assert names(states.UNHEARD) == {"deploying", "lost"}
    assert names(states.QUICK_PACE) == {"warming", "benchmarking"}
    assert states.QUICK_PACE <= states.ACTIVE_PHASES
    # A failed instance is still on its machine, billing, until the monitor destroys it.
    assert State.FAILED in states.BILLING and State.FAILED in states.ENDING
    # Every set of the module reaches the dashboard under its own name.
    module_sets = {name: value for name, value in vars(states).items()
                   if isinstance(value, frozenset)}
    assert module_sets == dict(states.NAMED_SETS)


def test_sql_in_renders_states_in_lifecycle_order_and_nothing_else() -> None:
    assert states.sql_in("state", states.GONE, negate=True) == \
        "state not in ('destroyed', 'vanished')"
    assert states.sql_in("state", [State.PROVING, State.BOOTING]) == \
        "state in ('booting', 'proving')"
    assert ACTIVE_SQL == "state not in ('destroyed', 'vanished')"
    with pytest.raises(ValueError, match="not a column name"):
        states.sql_in("state) or (1", states.GONE)
    with pytest.raises(ValueError):
        states.sql_in("state", ["proving') or ('1"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="empty"):
        states.sql_in("state", [])


def test_active_sql_selects_the_billing_states() -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("create table instances (state text not null)")
    conn.executemany("insert into instances values (?)", [(s,) for s in State])
    selected = {row[0] for row in conn.execute(f"select state from instances where {ACTIVE_SQL}")}
    assert selected == {s.value for s in states.BILLING}


def test_the_dashboard_gets_the_same_states() -> None:
    node = require_tool("node", "the dashboard's script runs in it: apt-get install nodejs; "
                                ".ci/run does it")
    script = states.dashboard_script() + (
        "\nprocess.stdout.write(JSON.stringify({states: STATES, sets: Object.fromEntries("
        "Object.entries(STATE_SETS).map(([k, v]) => [k, [...v]]))}));\n")
    out = json.loads(subprocess.run([node, "-e", script], capture_output=True, text=True,
                                    timeout=60, check=True).stdout)
    assert out["states"] == {s.name: s.value for s in State}
    assert out["sets"] == {name: [s.value for s in states.ordered(members)]
                           for name, members in states.NAMED_SETS.items()}


async def test_the_page_loads_the_states_before_its_script(aiohttp_client: Any,
                                                          tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path)
    resp = await h.client.get("/static/states.js")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/javascript")
    assert await resp.text() == states.dashboard_script()
    index = await (await h.client.get("/")).text()
    assert index.index("/static/states.js") < index.index("/static/app.js")
    app_js = await (await h.client.get("/static/app.js")).text()
    assert "STATE_SETS.GONE.has(s)" in app_js  # the page reads the sets, not a list


def test_a_failed_instance_is_left_to_its_scheduled_destroy() -> None:
    """``failed`` is not gone: reconciliation calls a listed failed instance no leak (its
    destroy is already due, the monitor's to carry out), and marks one missing from the
    list vanished, as it does any instance still on its machine."""
    listed = [{"id": 7, "label": "vm:fleet:ag_1", "actual_status": "running",
               "start_date": 0.0}]
    ours = [{"instance_id": 7, "agent_id": "ag_1", "state": State.FAILED, "created_at": 0.0}]
    assert reconcile.plan(listed, ours, "fleet", {"ag_1"}, 10_000.0, 60.0) == []
    ours[0]["state"] = State.DESTROYED
    [action] = reconcile.plan(listed, ours, "fleet", {"ag_1"}, 10_000.0, 60.0)
    assert action.kind == "destroy_leaked" and "recorded as destroyed" in action.reason
    # Missing from the list: a failed one vanished, a destroyed one is no news.
    for state, kinds in ((State.FAILED, ["mark_vanished"]), (State.DESTROYED, [])):
        ours[0]["state"] = state
        assert [a.kind for a in reconcile.plan([], ours, "fleet", {"ag_1"}, 10_000.0, 60.0)] \
            == kinds


# --- the one way to terminating --------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = Store(tmp_path / "coord.db")
    yield s
    s.close()


def _instance(store: Store, state: State, **cols: Any) -> int:
    def job(tx: Tx) -> int:
        return tx.instances.add({"agent_id": f"ag_{state.value}", "label": "rig",
                                "kind": "deployed", "machine_id": "m1", "state": state,
                                "state_since": 1.0, "created_at": 1.0, **cols})
    return store.write_blocking(job)


def test_begin_terminating_sends_an_instance_to_terminating_with_its_event(store: Store) -> None:
    iid = _instance(store, State.PROVING)
    assert store.write_blocking(lambda tx: (
        tx.hot_instance("ag_proving"),  # cached: the operation must keep it current
        tx.instances.begin_terminating(iid, "too slow", kind="verdict", note="terminate: too slow",
                                       now=50.0, destroy_due_at=60.0, bad_host_source="benchmark",
                                       rate_per_hour=3.0),
    )[1]) is True
    inst = store.get_instance(iid)
    assert inst is not None
    assert (inst["state"], inst["state_since"], inst["terminate_reason"],
            inst["destroy_due_at"], inst["updated_at"], inst["rate_per_hour"]) == \
        ("terminating", 50.0, "too slow", 60.0, 50.0, 3.0)
    hot = store.write_blocking(lambda tx: tx.hot_instance("ag_proving"))
    assert hot is not None and hot["state"] == "terminating"
    events = [(e["kind"], e["reason"], e["machine_id"]) for e in store.events(iid)]
    assert events == [("verdict", "terminate: too slow", "m1"),
                      ("bad_host", "m1: blocked for 168 h: too slow", "m1")]
    assert [(b["machine_id"], b["source"]) for b in store.bad_hosts()] == [("m1", "benchmark")]


def test_an_ending_instance_keeps_its_state_and_first_reason(store: Store) -> None:
    iid = _instance(store, State.FAILED, terminate_reason="the agent reported failed",
                    destroy_due_at=30.0)
    assert store.write_blocking(lambda tx: tx.instances.begin_terminating(
        iid, "revoked by the operator", kind="revoke", now=20.0, destroy_due_at=20.0)) is True
    inst = store.get_instance(iid)
    assert inst is not None
    assert (inst["state"], inst["state_since"], inst["terminate_reason"],
            inst["destroy_due_at"]) == ("failed", 1.0, "the agent reported failed", 20.0)
    assert [(e["kind"], e["reason"]) for e in store.events(iid)] == \
        [("revoke", "revoked by the operator")]


def test_a_gone_instance_is_not_terminated(store: Store) -> None:
    iid = _instance(store, State.DESTROYED)
    assert store.write_blocking(lambda tx: tx.instances.begin_terminating(
        iid, "late", kind="timeout", now=5.0, destroy_due_at=5.0)) is False
    assert store.write_blocking(lambda tx: tx.instances.begin_terminating(
        iid + 1, "unknown", kind="timeout", now=5.0, destroy_due_at=5.0)) is False
    inst = store.get_instance(iid)
    assert inst is not None and inst["state"] == "destroyed" and inst["destroy_due_at"] is None
    assert store.events() == []


def test_no_other_code_writes_terminating() -> None:
    """Only ``Tx.instances.begin_terminating`` moves an instance to ``terminating``."""
    writers = []
    for path in _tree(".py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "state" \
                    and _names_state(node.value, State.TERMINATING):
                writers.append(f"{_rel(path)}:{node.value.lineno}")
            if isinstance(node, ast.Dict):
                writers += [f"{_rel(path)}:{v.lineno}"
                            for k, v in zip(node.keys, node.values, strict=True)
                            if isinstance(k, ast.Constant) and k.value == "state"
                            and _names_state(v, State.TERMINATING)]
    assert [w.split(":")[0] for w in writers] == ["coordinator/store/writes/instances.py"], writers


def _names_state(node: ast.AST, state: State) -> bool:
    return (isinstance(node, ast.Constant) and node.value == state.value) or (
        isinstance(node, ast.Attribute) and node.attr == state.name)


# --- no second list of states in the tree ------------------------------------------------------

#: The one definition, and the wire contract it derives from.
DEFINITIONS = {"coordinator/decisions/states.py", "protocol/messages.py"}
SKIPPED_DIRS = {".git", ".venv", "venv", "build", "dist", "node_modules", "tests",
                "__pycache__"}
SUFFIXES = (".py", ".js", ".html", ".css", ".sql", ".sh")
#: A past migration builds the same schema for ever, so it keeps the literal text it was
#: released with (store/migrations.py's ``_m<N>_...`` functions).
MIGRATION = re.compile(r"_m\d+_")

_ALT = "|".join(sorted(NAMES, key=len, reverse=True))
_QUOTED = re.compile(rf"""(["'`])({_ALT})\1""")
_CLASS = re.compile(rf"\bstate-({_ALT})\b")
_SQL_QUOTED = re.compile(rf"'({_ALT})'")
_JS_CASE = re.compile(rf"""\bcase\s+["'`]({_ALT})["'`]""")


def _tree(*suffixes: str) -> list[Path]:
    """The repository's own files with these suffixes (not tests or build output)."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")
                         and not d.endswith(".egg-info"))
        out += [here / f for f in sorted(files) if f.endswith(suffixes)]
    return out


def _state_ref(node: ast.AST) -> bool:
    """A state written out: its name as a string, or ``State.X``."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    return isinstance(node, ast.Attribute) and node.attr in MEMBERS and (
        (isinstance(node.value, ast.Name) and node.value.id == "State")
        or (isinstance(node.value, ast.Attribute) and node.value.attr == "State"))


def python_lists(text: str, name: str = "<snippet>") -> list[str]:
    """Where Python source writes out two or more states together: a list, tuple or set
    of them (a collection that also holds other strings, such as event kinds, is not a
    list of states), ``a == "x" or a == "y"``, ``case "x" | "y"``, or SQL in a string
    with two quoted states. A dict maps each state to its own value: not a list."""
    found: list[str] = []
    tree = ast.parse(text)
    exempt: set[int] = set()
    if name.endswith("store/migrations.py"):
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and MIGRATION.match(node.name):
                exempt.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in exempt:
            continue
        hits = 0
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            others = [e for e in node.elts if isinstance(e, ast.Constant)
                      and isinstance(e.value, str) and e.value not in NAMES]
            hits = 0 if others else sum(_state_ref(e) for e in node.elts)
        elif isinstance(node, ast.BoolOp):
            hits = sum(_state_ref(c) for v in node.values if isinstance(v, ast.Compare)
                       for c in [v.left, *v.comparators])
        elif isinstance(node, ast.MatchOr):
            hits = sum(isinstance(p, ast.MatchValue) and _state_ref(p.value)
                       for p in node.patterns)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            hits = len(_SQL_QUOTED.findall(node.value))
        if hits >= 2:
            found.append(f"{name}:{getattr(node, 'lineno', '?')}")
    return found


def text_lists(text: str, name: str = "<snippet>") -> list[str]:
    """Where JavaScript, HTML, CSS, SQL or shell text names two or more states together:
    in one line, one ``[...]`` or ``(...)`` (however many lines it spans), or one file's
    ``case`` labels; HTML and CSS have no business naming two states anywhere in a file
    (the page styles a state by its tone, from ``STATE_SETS``)."""
    def count(chunk: str) -> int:
        return len(_QUOTED.findall(chunk)) + len(_CLASS.findall(chunk))

    found = [f"{name}:{i}" for i, line in enumerate(text.splitlines(), 1) if count(line) >= 2]
    for group in re.finditer(r"\[[^\[\]]*\]|\([^()]*\)", text):
        if count(group.group()) >= 2:
            found.append(f"{name}:{text.count(chr(10), 0, group.start()) + 1}")
    whole = len(_JS_CASE.findall(text))
    if name.endswith((".html", ".css")):
        whole = max(whole, count(text))
    if whole >= 2:
        found.append(f"{name}: the file")
    return sorted(set(found))


def test_no_second_list_of_states_in_the_tree() -> None:
    files = _tree(*SUFFIXES)
    assert any(p.name == "app.js" for p in files) and any(p.name == "heartbeat.py" for p in files)
    found: list[str] = []
    for path in files:
        rel = _rel(path)
        if rel in DEFINITIONS:
            continue
        text = path.read_text(errors="replace")
        found += python_lists(text, rel) if path.suffix == ".py" else text_lists(text, rel)
    assert found == [], (
        "states listed outside coordinator/decisions/states.py: use its State and named sets "
        "(SQL: states.sql_in; the dashboard: STATES and STATE_SETS of /static/states.js)")


@pytest.mark.parametrize(("snippet", "listed"), [
    ('GONE = ("destroyed", "vanished")', True),
    ("x = frozenset({State.LOST, State.FAILED})", True),
    ("x = [states.State.LOST, states.State.DEPLOYING]", True),
    ('if s == "lost" or s == "failed": pass', True),
    ('match s:\n    case "lost" | "failed":\n        pass', True),
    ("SQL = \"select * from instances where state in ('proving', 'warming')\"", True),
    ("SQL = f\"... where {col} not in ('destroyed', 'vanished')\"", True),
    ('x = {"timeout", "lost", "failed"}', False),  # event kinds
    ('T = {"deploying": 1.0, "lost": 2.0}', False),  # a table, one value a state
    ("FINAL = states.ENDING | {State.LOST}", False),
    ('if s in states.ENDING and s != State.FAILED: pass', False),
    ('x = ("proving",)', False),
])
def test_the_python_check_finds_each_kind_of_list(snippet: str, listed: bool) -> None:
    assert bool(python_lists(snippet)) is listed


def test_a_past_migration_may_keep_its_literal_text() -> None:
    migration = "def _m9_index(db):\n    db.execute(\"... where state in ('lost', 'failed')\")\n"
    assert python_lists(migration, "coordinator/store/migrations.py") == []
    assert python_lists(migration, "coordinator/store/reads.py") != []
    assert python_lists("def live(db):\n    return ['lost', 'failed']\n",
                        "coordinator/store/migrations.py") != []


@pytest.mark.parametrize(("name", "snippet", "listed"), [
    ("app.js", 'const gone = ["destroyed", "vanished"].includes(s);', True),
    ("app.js", 'const gone = [\n  "destroyed",\n  "vanished",\n];', True),
    ("app.js", 'if (s === "lost" || s === "failed") {}', True),
    ("app.js", 'switch (s) {\ncase "lost":\n  break;\ncase "failed":\n  break;\n}', True),
    ("app.js", 'const gone = STATE_SETS.GONE.has(s);\ntile("proving", n);', False),
    ("style.css", ".state-lost { color: red; }\n.state-failed { color: red; }", True),
    ("style.css", ".state-bad { color: red; }", False),
    ("index.html", '<option value="lost">\n<option value="failed">', True),
    ("q.sql", "select 1 where state in (\n 'proving',\n 'warming')", True),
])
def test_the_text_check_finds_each_kind_of_list(name: str, snippet: str, listed: bool) -> None:
    assert bool(text_lists(snippet, name)) is listed
