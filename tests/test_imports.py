"""No module of the package imports in a circle.

The graph: one node per module of ``portattn`` (``portattn/**/*.py``; a package is its
``__init__.py``), an edge ``a -> b`` for every ``import`` / ``from ... import`` statement in
``a`` that names module ``b`` of the package, wherever it stands: at the top, inside a function
(a lazy import) or under ``if __name__ == "__main__":``. Only ``if TYPE_CHECKING:`` blocks are
skipped (they never run). ``from pkg import name`` is an edge to ``pkg.name`` when that is a
module, else to ``pkg``. The implicit import of a parent package is not an edge (every
submodule would otherwise close a loop through ``portattn/__init__.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "portattn"


def _modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package under ``root``."""
    mods = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST):
    """Every Import / ImportFrom node, outside ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        children = list(ast.iter_child_nodes(node))
        if isinstance(node, ast.If) and _is_type_checking(node):
            children = node.orelse
        stack.extend(children)


def _owner(name: str, mods: dict[str, Path]) -> str | None:
    """The longest prefix of dotted ``name`` that is a module of the package."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(mods: dict[str, Path] | None = None) -> dict[str, dict[str, int]]:
    """Module -> {imported module of the package: line of the first such import}."""
    mods = _modules() if mods is None else mods
    graph: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from . import x, from ..a import b
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base
                    for alias in node.names
                ]
            for target in targets:
                owner = _owner(target, mods)
                if owner is not None and owner != name:
                    edges.setdefault(owner, node.lineno)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle ``[a, b, ..., a]`` of ``graph``, or None when it is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_package_imports_are_acyclic():
    graph = import_graph()
    cycle = find_cycle(graph)
    if cycle:
        steps = [
            f"{a} -> {b} ({_modules()[a].relative_to(PACKAGE.parent)}:{graph[a][b]})"
            for a, b in zip(cycle, cycle[1:])
        ]
        raise AssertionError("import cycle:\n  " + "\n  ".join(steps))


def test_graph_sees_top_level_lazy_and_relative_imports():
    """The graph is not vacuous: known edges of each kind are in it."""
    graph = import_graph()
    assert len(graph) > 20 and "portattn.tools.golden.run" in graph and "portattn" in graph
    assert "portattn.tools.harness" in graph["portattn.tools.check"]  # top level
    assert "portattn.tools.harness" in graph["portattn.tools.golden.run"]  # top level
    assert "portattn.tools.check" in graph["portattn.tools.cli"]  # inside a function
    assert "portattn" in graph["portattn.distributed"]  # top level: import portattn


def test_find_cycle():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) is None
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {"b": 1}}) == ["b", "b"]


def test_graph_resolves_import_forms(tmp_path):
    """``import x.y``, ``from x import module``, ``from x import name``, relative imports,
    lazy imports and ``__main__`` blocks are edges; ``TYPE_CHECKING`` blocks are not."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg.a import f\n",
        "a.py": "def f():\n    from . import b\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.c\n",
        "c.py": "import pkg.sub.d\nfrom pkg import VALUE\n",
        "sub/__init__.py": "",
        "sub/d.py": "from .. import a\nif __name__ == '__main__':\n    from pkg.sub import e\n",
        "sub/e.py": "",
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    graph = import_graph(_modules(pkg))
    assert graph == {
        "pkg": {"pkg.a": 1},
        "pkg.a": {"pkg.b": 2},
        "pkg.b": {},
        "pkg.c": {"pkg.sub.d": 1, "pkg": 2},
        "pkg.sub": {},
        "pkg.sub.d": {"pkg.a": 1, "pkg.sub.e": 3},
        "pkg.sub.e": {},
    }


def test_product_does_not_import_the_tools():
    """The product's modules (everything outside ``portattn.tools``) read alone: none imports
    the tooling, at top level or inside a function (``python -m portattn`` is the one door:
    ``portattn/__main__.py``)."""
    graph = import_graph()
    tools = "portattn.tools"
    leaks = {
        mod: sorted(dep for dep in deps if dep == tools or dep.startswith(tools + "."))
        for mod, deps in graph.items()
        if not (mod == tools or mod.startswith(tools + ".")) and mod != "portattn.__main__"
    }
    assert not {mod: deps for mod, deps in leaks.items() if deps}
    assert "portattn.tools.cli" in graph["portattn.__main__"]  # the graph sees the door


def test_package_does_not_import_the_benchmarks():
    """``benchmarks/`` (the checkout's benchmarks and distributed demo) is not shipped: no module
    of the package imports it, anywhere (``python -m portattn.distributed --demo`` only says
    where the demo went)."""
    assert not _imports_of("benchmarks")
    assert not list(PACKAGE.rglob("*bench*.py")), "the benchmarks live in benchmarks/"
    assert (PACKAGE.parent / "benchmarks" / "bench.py").is_file()


def test_package_does_not_import_ci():
    """``ci/`` (the golden files' recording and the compile-key check, run from a checkout) is
    not shipped: no module of the package imports it, anywhere."""
    assert not _imports_of("ci")
    assert (PACKAGE.parent / "ci" / "golden_dev" / "keys.py").is_file()


def _imports_of(top: str) -> dict[str, list[str]]:
    """``module:line`` -> the modules of the top-level package ``top`` that a module of
    portattn imports there (absolute imports, anywhere in the module)."""
    imports = {}
    for name, path in _modules().items():
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                targets = [node.module or ""] if not node.level else []
            bad = [t for t in targets if t == top or t.startswith(top + ".")]
            if bad:
                imports[f"{name}:{node.lineno}"] = bad
    return imports


def _private_imports(path: Path) -> list[str]:
    """``from <a module of the package> import _name`` statements of one file (absolute or
    relative), as ``line: module._name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 0 and not (node.module or "").startswith("portattn"):
            continue  # another package's private name is that package's business
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append(f"{node.lineno}: {'.' * node.level}{node.module or ''}.{alias.name}")
    return found


def test_product_imports_no_private_name():
    """No module of the product (outside ``portattn.tools``) imports a private (``_name``)
    name of another: what two modules share is public in the package (issue 38)."""
    bad = {
        str(path.relative_to(PACKAGE.parent)): hits
        for name, path in _modules().items()
        if not name.startswith("portattn.tools") and (hits := _private_imports(path))
    }
    assert bad == {}


def test_private_imports_are_seen(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from portattn.api import _x, y\nfrom .ops import _z\nfrom os import _exit\n")
    assert _private_imports(path) == ["1: portattn.api._x", "2: .ops._z"]
