"""Each setting is declared once: change one default in its declaration and every place that
shows or uses it follows (``serve --help``, the docs table, the running coordinator); no
class elsewhere restates a setting's default."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from vast_manager.agent import config as agent_config
from vast_manager.coordinator import settings as coord_settings

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "vast_manager"

# Run inside a copy of the package whose one declaration was edited: the --help text, the
# docs table, the classes that take defaults from it and a running coordinator (its API).
PROBE = r"""
import asyncio, json, sys, urllib.request
from click.testing import CliRunner
sys.path.insert(0, sys.argv[2])  # tests/, for the fake provider
from support.fakes_provider import FakeProvider
from vast_manager.coordinator.cli.commands import cli
from vast_manager.coordinator.decisions.policy import PolicyLimits
from vast_manager.coordinator.discovery.plan import PlanSettings
from vast_manager.coordinator.settings import Settings, settings_markdown
from vast_manager.coordinator.web.server import start_server

tmp = sys.argv[1]
out = {"help": CliRunner().invoke(cli, ["serve", "--help"], terminal_width=400).output,
       "docs": settings_markdown(), "policy": PolicyLimits().max_usd_per_proof,
       "plan": PlanSettings().max_usd_per_proof}
token = "admin-token-0123456789-abcdef"
env = {"VM_FLEET_SECRET": "11" * 32, "VM_ADMIN_TOKEN": token}

async def served():
    settings = Settings.from_env(env, db_path=tmp + "/c.db", config_dir=tmp, port=0)
    server = await start_server(settings, FakeProvider())
    try:
        request = urllib.request.Request(server.url + "/api/fleet",
                                         headers={"Authorization": "Bearer " + token})
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=30).read())
        return json.loads(body)["max_usd_per_proof"]
    finally:
        await server.stop()

out["served"] = asyncio.run(served())
print(json.dumps(out))
"""


def test_one_default_changed_in_its_declaration_shows_everywhere(tmp_path: Path) -> None:
    source = (SRC / "coordinator" / "settings.py").read_text()
    declaration = re.compile(r"(    max_usd_per_proof: Annotated\[.*?\n    \] = )0\.008\n", re.S)
    assert len(declaration.findall(source)) == 1, "the declaration of max_usd_per_proof moved"
    # The one place: no other module of the package spells this default.
    spelled = [p for p in SRC.rglob("*.py") if re.search(r"\b0\.008\b", p.read_text())]
    assert spelled == [SRC / "coordinator" / "settings.py"], spelled

    copy = tmp_path / "src"
    shutil.copytree(SRC, copy / "vast_manager", ignore=shutil.ignore_patterns("__pycache__"))
    edited = copy / "vast_manager" / "coordinator" / "settings.py"
    edited.write_text(declaration.sub(r"\g<1>0.0123\n", source))
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(copy)}
    env.pop("VM_MAX_USD_PER_PROOF", None)
    done = subprocess.run(
        [sys.executable, str(probe), str(tmp_path), str(ROOT / "tests")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = __import__("json").loads(done.stdout.splitlines()[-1])
    assert "VM_MAX_USD_PER_PROOF: minimum rate = dph_total / this, unless set at deploy " \
           "(greater than 0) [default: 0.0123]" in out["help"]
    assert "| `VM_MAX_USD_PER_PROOF` | `0.0123` | greater than 0 |" in out["docs"]
    assert out["policy"] == out["plan"] == out["served"] == 0.0123


def test_the_serve_flags_show_their_defaults_from_the_declaration() -> None:
    from click.testing import CliRunner

    from vast_manager.coordinator.cli.commands import cli

    text = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=400).output
    defaults = coord_settings.DEFAULTS
    assert f"Listen port [default: {defaults.port}]" in text
    assert f"[default: {defaults.autopilot_max_explore_share}]" in text
    for row in coord_settings.SETTINGS:  # every setting is listed, by its variable
        assert f"{row.env}: " in text


def _restated(path: Path, names: set[str]) -> list[str]:
    """Class fields named like a setting whose default is a literal number of their own."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and stmt.target.id in names and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, int | float)):
                found.append(f"{path.relative_to(SRC)}: {node.name}.{stmt.target.id}")
    return found


def test_no_class_restates_a_settings_default() -> None:
    names = {row.name for row in coord_settings.SETTINGS}
    names |= {row.name for row in agent_config.SETTINGS
              if row.env in agent_config.SETTINGS_BY_NAME and not row.env.startswith("VM_SIM_")}
    declarations = {SRC / "coordinator" / "settings.py", SRC / "agent" / "config.py"}
    found = [hit for path in sorted(SRC.rglob("*.py")) if path not in declarations
             for hit in _restated(path, names)]
    assert found == [], "take these defaults from the declaration: " + ", ".join(found)
