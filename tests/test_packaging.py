"""One package in a src layout: no links in the tree, the wheel holds only ``vast_manager/...``,
nothing imports from the repository's root, every module imports on its own, no two modules
share a file name, and docs/architecture.md lists every module there is."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "vast_manager"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# One job under one name, once per provider: each backend's Provider implementation.
SAME_JOB_NAMES = {"__init__.py", "__main__.py", "provider.py"}


def source_modules() -> list[str]:
    """Every module of the package, as paths inside it (``coordinator/web/app.py``)."""
    return sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
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
        elif name != "__init__.py":
            out.append(path.removeprefix("src/vast_manager/"))
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


def test_no_links_in_the_tree() -> None:
    """A checkout without symlink support gets the same tree (git's mode 120000 is a link)."""
    out = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert "src/vast_manager/__init__.py" in out  # the listing found the tree
    assert [line for line in out.splitlines() if line.startswith("120000")] == []


def test_nothing_imports_from_the_repository_root() -> None:
    for bare in ("agent", "coordinator", "protocol", "common", "sim", "vast_manager.nope"):
        proc = subprocess.run([sys.executable, "-I", "-c", f"import {bare}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, bare


def test_no_two_modules_share_a_file_name() -> None:
    by_name: dict[str, list[str]] = {}
    for path in source_modules():
        by_name.setdefault(Path(path).name, []).append(path)
    shared = {n: ps for n, ps in by_name.items() if len(ps) > 1 and n not in SAME_JOB_NAMES}
    assert shared == {}
    assert len(by_name["provider.py"]) == 2  # the exception is what it says


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
