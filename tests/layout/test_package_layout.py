"""The package's folders follow the data, and imports only point down that path.

The order below is the one docs/contributing.md draws: a module may import its own folder and any
folder before its own, never one after it. Every import counts, those inside functions and under
``TYPE_CHECKING`` too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "reference" / "shardspec"

#: Lowest first. A group is a folder of the package, or a module at its top.
LAYERS: list[set[str]] = [
    {"_version"},
    {"format"},
    {"storage"},
    {"load"},
    {"write"},
    {"reshard"},
    {"reader", "validate"},
    {"__init__", "convert", "distributed"},  # __init__: the public API, `import shardspec`
    {"testing"},
    {"cli"},
    {"integrations"},
]
RANK = {group: index for index, layer in enumerate(LAYERS) for group in layer}

#: About 500 lines: past that a module is split by idea. (The longest, reshard/plan.py, is one:
#: where each target piece's bytes come from.)
MAX_LINES = 550


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def group_of(module: str) -> str:
    return module.split(".")[0]


def imports_of(path: Path) -> set[str]:
    """The shardspec modules ``path`` imports, as dotted names under the package."""
    module = module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    if module == "__init__":
        package = []
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "shardspec":
                target = node.module.partition(".")[2]
            else:
                continue
            if node.module is None or target == "":
                # `from . import x`: each name is a module of that package
                found.update(f"{target}.{alias.name}".strip(".") for alias in node.names)
            else:
                found.add(target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "shardspec":
                    found.add(alias.name.partition(".")[2] or "__init__")
    return {name for name in found if name}


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_is_in_a_known_group() -> None:
    unknown = sorted({group_of(m) for m in all_modules()} - set(RANK))
    assert not unknown, f"add {unknown} to LAYERS (and to the map in docs/contributing.md)"


def test_the_top_of_the_package_holds_few_modules() -> None:
    """New code lands in the folder of its step on the data path, not beside the folders."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "_version", "distributed", "reader", "validate"]


@pytest.mark.parametrize("module", sorted(all_modules()))
def test_imports_only_point_down(module: str) -> None:
    path = all_modules()[module]
    here = RANK[group_of(module)]
    upward = sorted(
        target for target in imports_of(path)
        if group_of(target) in RANK and group_of(target) != group_of(module)
        and RANK[group_of(target)] >= here
    )
    assert not upward, f"{module} imports {upward}, which are not below it"


def test_no_import_circles() -> None:
    modules = all_modules()
    graph = {
        name: {t if t in modules else t.rpartition(".")[0] for t in imports_of(path)} & set(modules)
        for name, path in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node] - {node}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    assert not circles, f"import circles: {circles}"


def test_every_folder_says_what_it_owns() -> None:
    for folder in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"
                         and not p.name.startswith("_")):
        init = folder / "__init__.py"
        assert init.is_file(), f"{folder.name}/ has no __init__.py"
        docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert docstring and len(docstring) > 80, f"{folder.name}/__init__.py: say what it owns"


def test_no_module_is_long() -> None:
    long = {m: n for m, p in all_modules().items()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these by idea: {long}"


def test_the_map_in_the_contributing_guide_names_every_folder() -> None:
    guide = (PACKAGE.parents[1] / "docs" / "contributing.md").read_text(encoding="utf-8")
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"
                     and not p.name.startswith("_"))
    missing = [f for f in folders if f"`{f}/`" not in guide]
    assert not missing, f"docs/contributing.md does not map {missing}"
