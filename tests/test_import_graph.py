"""No two modules of goodput or goodput_services import each other, directly or through others.

A circle makes the import order decide what works (a name read before its module finished
running), and says two modules are one job split badly; hiding one import in a function or
under ``TYPE_CHECKING`` keeps the circle. The graph is grimp's (import-linter's): every import
statement counts, function-local ones and ``TYPE_CHECKING`` ones too.

What counts: every module is a node, a package's ``__init__`` included (as the package's
name). ``from goodput.shim.trainer import X`` is an edge to ``goodput.shim.trainer`` only, not
to ``goodput.shim``: Python runs the package's ``__init__`` first, but to its end before the
submodule, so a package re-exporting its submodules is no circle. A submodule importing its
own package by name (``from goodput.shim import X`` inside ``goodput.shim.trainer``) while
the package imports that submodule is one, and this test fails on it: the submodule would
read the package half run.
"""

from __future__ import annotations

import grimp

PACKAGES = ("goodput", "goodput_services")


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Each set of modules that reach each other through imports (sorted, largest first)."""
    found: set[frozenset[str]] = set()
    for module in graph.modules:
        reached_back = graph.find_upstream_modules(module) & graph.find_downstream_modules(module)
        if reached_back:
            found.add(frozenset(reached_back | {module}))
    return sorted((sorted(circle) for circle in found), key=lambda c: (-len(c), c))


def describe(graph: grimp.ImportGraph, circle: list[str]) -> str:
    """The circle's modules and the import lines that join them."""
    lines = [f"circle of {len(circle)}: {', '.join(circle)}"]
    for importer in circle:
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported in circle:
                for detail in graph.get_import_details(importer=importer, imported=imported):
                    lines.append(f"  {importer}:{detail['line_number']}: {detail['line_contents']}")
    return "\n".join(lines)


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    assert len(graph.modules) > 300, "the graph missed the packages (PYTHONPATH?)"
    found = circles(graph)
    assert not found, "\n".join(describe(graph, circle) for circle in found)


def test_a_circle_is_found_and_named() -> None:
    """The check itself: a circle through three modules is reported with its modules and
    import lines; a package importing a submodule is no circle, unless the submodule
    imports the package back."""
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.e"):
        graph.add_module(module)
    graph.add_import(importer="pkg", imported="pkg.a")
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.c")
    graph.add_import(importer="pkg.c", imported="pkg.a", line_number=9, line_contents="import a")
    graph.add_import(importer="pkg.d", imported="pkg.a")
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert "pkg.c:9: import a" in describe(graph, ["pkg.a", "pkg.b", "pkg.c"])
    graph.add_import(importer="pkg", imported="pkg.e")
    graph.add_import(importer="pkg.e", imported="pkg")
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg", "pkg.e"]]
