"""The house rules of docs/design.md §2, checked on the source: floors, no import rings, a light
runtime.

Every `import` statement counts, the lazy ones inside functions too: a lazy import still ties two
rooms."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
# room -> (folder, floor); a room imports only rooms on lower floors (and itself)
ROOMS = {
    "data": ("data", 1),
    "devices": ("devices", 1),
    "runtime": ("runtime", 2),
    "models": ("models", 3),
    "export": ("export", 4),
    "quantize": ("quantize", 5),
    "engines": ("engines", 4),
    "serve": ("serve", 5),
    "train": ("train", 5),
    "cli": ("cli", 6),
}
RUNTIME_FORBIDDEN = {"torch", "transformers", "argparse", "onnx", "safetensors", "gguf"}


def _module_name(path: Path) -> str:
    for room, (folder, _) in ROOMS.items():
        base = ROOT / folder
        if base in path.parents or path.parent == base:
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            return ".".join(["dflash_edge", room, *parts])
    return "dflash_edge"


def _sources() -> dict[str, Path]:
    files = {ROOT / "__init__.py"}
    for folder, _ in ROOMS.values():
        files |= set((ROOT / folder).rglob("*.py"))
    return {_module_name(p): p for p in sorted(files)}


def _imports(name: str, path: Path) -> set[str]:
    """Absolute names of every module `path` imports (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}  # `from pkg import module`
    return out


MODULES = _sources()
GRAPH = {
    name: {m for m in _imports(name, path) if m in MODULES and m != name}
    for name, path in MODULES.items()
}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else "dflash_edge"


def test_rooms_import_only_lower_floors():
    floor = {room: f for room, (_, f) in ROOMS.items()} | {"dflash_edge": 6}
    bad = sorted(
        f"{a} -> {b}"
        for a, deps in GRAPH.items()
        for b in deps
        if _room(a) != _room(b) and floor[_room(b)] >= floor[_room(a)] and _room(b) != "dflash_edge"
    )
    assert not bad, "imports sideways or upwards:\n" + "\n".join(bad)


def test_no_import_rings():
    """No two modules import each other, directly or through others (Tarjan's strongly connected
    components)."""
    index, low, stack, on, rings = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            ring = []
            while True:
                w = stack.pop()
                on.discard(w)
                ring.append(w)
                if w == v:
                    break
            if len(ring) > 1:
                rings.append(sorted(ring))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not rings, f"modules that import each other: {rings}"


def test_runtime_stays_light():
    heavy = {
        name: sorted(
            m.split(".")[0] for m in _imports(name, path) if m.split(".")[0] in RUNTIME_FORBIDDEN
        )
        for name, path in MODULES.items()
        if _room(name) == "runtime"
    }
    assert not {k: v for k, v in heavy.items() if v}, heavy


def test_command_line_code_lives_in_cli():
    """argparse and `add_arguments` only in cli/; every verb there has its module."""
    from dflash_edge.cli import COMMANDS

    outside = sorted(
        name
        for name, path in MODULES.items()
        if _room(name) != "cli"
        and ("argparse" in _imports(name, path) or "def add_arguments(" in path.read_text())
    )
    assert not outside, f"command-line code outside cli/: {outside}"
    for verb, (module, _) in COMMANDS.items():
        assert f"dflash_edge.cli.{module}" in MODULES, verb


@pytest.mark.parametrize("room", ["data", "devices", "runtime"])
def test_low_floors_import_no_third_party_heavyweights(room):
    """data/ is pure Python; devices/ too, but for a lazy numpy probe and NVML where present;
    runtime/ numpy + onnxruntime + tokenizers + jinja2 (+ TensorRT / CUDA bindings / NVML
    lazily)."""
    allowed = {
        "data": set(),
        "devices": {"numpy", "pynvml"},
        "runtime": {"numpy", "onnxruntime", "tokenizers", "jinja2", "tensorrt", "cuda", "pynvml"},
    }[room]
    third = set()
    for name, path in MODULES.items():
        if _room(name) == room:
            third |= (
                {m.split(".")[0] for m in _imports(name, path)}
                - set(sys.stdlib_module_names)
                - {"dflash_edge", ""}
            )
    assert third <= allowed, sorted(third - allowed)


def test_rooms_import_each_other_relatively():
    """Inside the package every first-party import is relative, so the edges between rooms resolve
    on disk (the repository root is the package) for tools that never ran the editable install."""
    absolute = sorted(
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom)
        and not node.level
        and (node.module or "").split(".")[0] == "dflash_edge"
    )
    assert not absolute, "absolute first-party imports (use `from ..room import x`):\n" + "\n".join(
        absolute
    )


def test_every_subpackage_ships():
    """Each folder of a room that is a package is listed in pyproject's `packages` (a missing one
    works in the editable install and breaks the wheel)."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    present = {_module_name(p) for p in MODULES.values() if p.name == "__init__.py"}
    assert present <= listed, f"add to pyproject.toml packages: {sorted(present - listed)}"
