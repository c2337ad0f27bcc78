"""No import cycle anywhere in nmt, module by module, nothing excluded.

`lint-imports` (the contracts in pyproject.toml) checks the layers, and its acyclic_siblings contract the
cycles between the modules and subpackages of each package; this also catches a cycle through a package's
own __init__ (a submodule importing its package while the package imports it), which that contract does not
look at. The graph is grimp's, the one import-linter builds: every import statement, in functions too."""

from __future__ import annotations

import grimp


def find_cycle(graph: grimp.ImportGraph) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None: a depth-first search
    that keeps the path it is on."""
    done: set[str] = set()  # modules from which no cycle is reachable
    for start in sorted(graph.modules):
        if start in done:
            continue
        path = [start]
        branches = [iter(sorted(graph.find_modules_directly_imported_by(start)))]
        while path:
            module = next(branches[-1], None)
            if module is None:  # every import of path[-1] explored
                done.add(path.pop())
                branches.pop()
            elif module in path:
                return path[path.index(module) :] + [module]
            elif module not in done:
                path.append(module)
                branches.append(iter(sorted(graph.find_modules_directly_imported_by(module))))
    return None


def test_nmt_has_no_import_cycle():
    cycle = find_cycle(grimp.build_graph("nmt"))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_cycle_is_found():
    """The search itself: a three-module cycle behind an acyclic branch, and a package importing its child."""
    graph = grimp.ImportGraph()
    for importer, imported in [("p.a", "p.b"), ("p.a", "p.d"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.d", "p.e")]:
        graph.add_import(importer=importer, imported=imported)
    assert find_cycle(graph) == ["p.a", "p.b", "p.c", "p.a"]
    package = grimp.ImportGraph()
    package.add_import(importer="q", imported="q.x")
    package.add_import(importer="q.x", imported="q")
    assert find_cycle(package) == ["q", "q.x", "q"]
