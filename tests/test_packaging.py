"""One package in a src layout: no links in the tree, the wheel holds only ``vast_manager/...``,
nothing imports from the repository's root, every module imports on its own, no two modules
share a file name, and docs/architecture.md lists every module there is."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
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


#: Run in one fresh interpreter: it imports the third-party libraries the package uses
#: (never a module of ``vast_manager``), then forks a child per module that imports that
#: module alone. Each child starts from the same clean ``sys.modules`` (no ``vast_manager``
#: in it), so an import that only works after another still fails; the interpreter's start
#: and numpy's, scikit-learn's and aiohttp's imports are paid once, not once per module.
_IMPORT_EACH = r"""
import importlib, json, os, sys
for lib in sys.argv[1].split(","):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
assert not [m for m in sys.modules if m.split(".")[0] == "vast_manager"]
failed = []
for module in sys.argv[2:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(module)
        except BaseException as exc:
            os.write(w, repr(exc)[-600:].encode())
            os._exit(1)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode(errors="replace")
    if os.waitpid(pid, 0)[1] != 0:
        failed.append([module, err])
print(json.dumps(failed))
"""
#: Imported before the forks: what the package's modules import from outside it.
_THIRD_PARTY = ("numpy", "sklearn", "aiohttp", "msgspec", "orjson", "psutil", "click",
                "prometheus_client", "sqlite_utils", "tenacity", "threadpoolctl", "pynvml")


def test_every_module_imports_on_its_own() -> None:
    """Each module in a clean interpreter: no import that only works after another."""
    modules = [dotted(p) for p in source_modules() if not p.endswith("__main__.py")]
    proc = subprocess.run([sys.executable, "-c", _IMPORT_EACH, ",".join(_THIRD_PARTY), *modules],
                          capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == []
    assert len(modules) > 60


def test_no_links_in_the_tree() -> None:
    """A checkout without symlink support gets the same tree (git's mode 120000 is a link)."""
    out = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert "src/vast_manager/__init__.py" in out  # the listing found the tree
    assert [line for line in out.splitlines() if line.startswith("120000")] == []


def test_nothing_imports_from_the_repository_root() -> None:
    # Without -I: the current folder (the root) is on sys.path, as for anyone typing this
    # there, so a package folder left at the root would import.
    for bare in ("agent", "coordinator", "protocol", "common", "sim"):
        proc = subprocess.run([sys.executable, "-c", f"import {bare}"], cwd=ROOT,
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
