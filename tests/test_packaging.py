"""One namespace: the wheel holds only ``vast_manager/...``, every module imports on its own,
docs/architecture.md lists every module there is, and the package installs beside PyPI's
projects named ``agent``, ``coordinator`` and ``protocol`` with both sides working."""

from __future__ import annotations

import re
import subprocess
import sys
import venv
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("agent", "coordinator", "protocol", "common")
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def source_modules() -> list[str]:
    """Every module of the three parts, as repository paths (``coordinator/web/app.py``)."""
    return sorted(
        str(p.relative_to(ROOT)) for part in PARTS for p in (ROOT / part).rglob("*.py")
        if "__pycache__" not in p.parts and p.name != "__init__.py"
    )


def dotted(path: str) -> str:
    return "vast_manager." + path.removesuffix(".py").replace("/", ".")


def documented_modules() -> list[str]:
    """The modules the layout tree of docs/architecture.md names, as repository paths."""
    text = ARCHITECTURE.read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    stack: list[tuple[int, str]] = []
    out: list[str] = []
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith(("(", "every")):
            continue
        indent = len(line) - len(line.lstrip())
        name = line.split()[0]
        if not (name.endswith("/") or name.endswith(".py")):
            continue  # a wrapped description line
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "".join(s for _, s in stack) + name
        if name.endswith("/"):
            stack.append((indent, name))
        elif "/" in path and not path.startswith("vast_manager/") and name != "__init__.py":
            out.append(path)
    return sorted(out)


def test_architecture_lists_every_module_and_no_other() -> None:
    documented, real = set(documented_modules()), set(source_modules())
    assert real - documented == set(), "modules missing from docs/architecture.md"
    assert documented - real == set(), "docs/architecture.md lists modules that do not exist"


def test_every_module_imports_on_its_own() -> None:
    """Each module in a fresh interpreter: no import that only works after another."""
    modules = [dotted(p) for p in source_modules() if not p.endswith("__main__.py")]

    def imports(module: str) -> tuple[str, int, str]:
        proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                              text=True, timeout=120, cwd="/")
        return module, proc.returncode, proc.stderr[-600:]

    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [(m, err) for m, rc, err in pool.map(imports, modules) if rc != 0]
    assert not failed, failed
    assert len(modules) > 60


def test_no_bare_module_names_in_commands() -> None:
    """A bare module name after ``-m`` would run whatever PyPI project owns that name."""
    bare = re.compile(r"""(-m\s+|["']-m["'],\s*["'])(agent|coordinator|protocol|common)\.""")
    files = [*ROOT.glob("*/**/*.py"), *ROOT.glob("image/*"), *ROOT.glob(".ci/*"),
             *ROOT.glob("docs/*.md"), ROOT / "README.md"]
    hits = [f"{f.relative_to(ROOT)}:{n}" for f in files
            if f.is_file() and ".venv" not in f.parts and "vast_manager" not in f.parts[:1]
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
            if bare.search(line)]
    assert not hits, hits


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                           str(out), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (built,) = out.glob("vast_manager-*.whl")
    return built


def test_the_wheel_holds_only_the_namespace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    outside = [n for n in names if not n.startswith(("vast_manager/", "vast_manager-"))]
    assert outside == []
    for module in source_modules():
        assert f"vast_manager/{module}" in names
    assert "vast_manager/coordinator/web/static/app.js" in names
    assert "vast_manager/coordinator/web/data/openapi.json" in names


@pytest.mark.slow
def test_installs_beside_pypis_agent_coordinator_and_protocol(wheel: Path, tmp_path: Path
                                                              ) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q"]
    theirs = subprocess.run([*pip, "agent", "coordinator", "protocol"], capture_output=True,
                            text=True, timeout=600)
    if theirs.returncode != 0:
        pytest.skip("PyPI's agent/coordinator/protocol could not be installed here: "
                    + (theirs.stderr.strip().splitlines() or ["no output"])[-1][:200])
    ours = subprocess.run([*pip, str(wheel)], capture_output=True, text=True, timeout=600)
    assert ours.returncode == 0, ours.stderr[-2000:]
    check = (
        "import agent, coordinator, protocol, pathlib\n"
        "for m in (agent, coordinator, protocol):\n"
        "    assert 'site-packages' in m.__file__ and 'vast_manager' not in m.__file__, m\n"
        "import vast_manager.coordinator.web.app, vast_manager.agent.lifecycle\n"
        "from vast_manager.protocol.messages import PROTOCOL_VERSION\n"
        "assert PROTOCOL_VERSION == 1\n"
    )
    both = subprocess.run([str(python), "-c", check], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert both.returncode == 0, both.stderr[-2000:]
    for command in ("vast-manager", "vast-agent"):
        help_run = subprocess.run([str(env_dir / "bin" / command), "--help"],
                                  capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert help_run.returncode == 0, help_run.stderr[-2000:]
