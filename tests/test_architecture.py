"""The house rules of ARCHITECTURE.md, checked on the source: imports flow one way between the
package's rooms, no module imports itself back through any chain (function-level imports
included), and the CPU core never imports torch or triton."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1] / "spectune"

# room -> rooms it may import (ARCHITECTURE.md "Imports flow one way")
ALLOWED: dict[str, set[str]] = {
    "specs": set(),
    "planner": {"specs"},
    "kernels": {"specs"},
    "simulator": {"planner", "specs"},
    "validate": {"planner", "specs"},
    "traces": {"planner", "specs"},
    "executor": {"kernels", "planner", "specs", "validate"},
    "dashboards": {"simulator", "validate", "traces", "planner", "specs"},
    "cli": {"dashboards", "executor", "simulator", "validate", "traces", "planner", "specs"},
}
CPU_CORE = ("specs", "planner", "simulator", "validate")
GPU_MODULES = ("torch", "triton")


def _modules() -> dict[str, Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = p.with_suffix("").relative_to(ROOT.parent).parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


def _imports(name: str, path: Path) -> set[str]:
    """Every module name an import statement in the file names (function-level ones too)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else ""


MODS = _modules()
GRAPH = nx.DiGraph()
for _name, _path in MODS.items():
    GRAPH.add_node(_name)
    for _target in _imports(_name, _path):
        if _target in MODS and _target != _name:
            GRAPH.add_edge(_name, _target)


def test_every_room_is_known() -> None:
    rooms = {_room(m) for m in MODS} - {""}
    assert rooms == set(ALLOWED), rooms ^ set(ALLOWED)


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_imports_flow_one_way(room: str) -> None:
    bad = sorted(
        f"{a} -> {b}"
        for a, b in GRAPH.edges
        if _room(a) == room and _room(b) not in ALLOWED[room] | {room, ""}
    )
    assert not bad, "imports against the flow:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    cycles = sorted((" -> ".join(c) for c in nx.simple_cycles(GRAPH)), key=len)
    assert not cycles, "import cycles (function-level imports included):\n" + "\n".join(cycles)


@pytest.mark.parametrize("room", CPU_CORE)
def test_cpu_core_needs_no_torch(room: str) -> None:
    bad = sorted(
        f"{name} imports {t}"
        for name, path in MODS.items()
        if _room(name) == room
        for t in _imports(name, path)
        if t.split(".")[0] in GPU_MODULES
    )
    assert not bad, "\n".join(bad)


def test_every_triton_kernel_lives_in_kernels() -> None:
    bad = sorted(
        str(p.relative_to(ROOT.parent))
        for name, p in MODS.items()
        if "triton.jit" in p.read_text(encoding="utf-8") and _room(name) != "kernels"
    )
    assert not bad, "@triton.jit outside spectune/kernels: " + ", ".join(bad)
