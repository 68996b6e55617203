"""The floor plan holds as the code grows: no folder of the product with more than 15 modules side by side, no
module over 400 lines, no circle of imports between modules (imports under `TYPE_CHECKING` aside: they are types
only), and no import from a lower package to a higher one (interceptor < agents < trainer)."""

from __future__ import annotations

import ast
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("interceptor", "agents", "trainer")  # lowest first: each may import only those before it
MAX_MODULES_PER_FOLDER = 15
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports when it runs (at its top or inside a function), not for types only."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {id(node) for block in ast.walk(tree)
                   if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                   for node in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
    return {module for module in found if module in modules and module != name}


def test_no_folder_holds_more_than_15_modules_side_by_side():
    counts = Counter(path.parent.relative_to(ROOT) for path in _modules().values() if path.name != "__init__.py")
    assert {str(folder): n for folder, n in counts.items() if n > MAX_MODULES_PER_FOLDER} == {}


def test_no_module_is_over_400_lines():
    lengths = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


def test_no_circle_of_imports_between_modules():
    modules = _modules()
    edges = {name: _imports(name, path, modules) for name, path in modules.items()}
    circles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in modules:
        if name not in index:
            visit(name)
    assert circles == []


def test_no_package_imports_a_higher_one():
    modules = _modules()
    upward = defaultdict(set)
    for name, path in modules.items():
        rank = PACKAGES.index(name.partition(".")[0])
        for target in _imports(name, path, modules):
            if PACKAGES.index(target.partition(".")[0]) > rank:
                upward[name].add(target)
    assert dict(upward) == {}
