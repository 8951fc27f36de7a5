"""The floors import downward only, and no module imports itself through a circle.

Floors, bottom to top (README, "How it works"):

0. **domain**: ``lazarus.domain`` (and the package root); ``lazarus.rank`` sits
   here too, standard library only, importable inside every training rank;
1. **workflows**: ``workflows``, deterministic policy;
2. **activities**: ``activities``, mechanics;
3. **app**: ``lazarus.app`` (the CLI, the client, settings, the dev server, the
   local stack), ``workers`` and ``infra`` (test rigs, fault injection);
4. **bench**: ``bench``, the benchmarks (the simulator is ``workers.simulate``).
   It may use every floor of the product, and nothing but the tests may use it: a
   product that imported its own benchmark would ship it. It holds no circles either,
   and no file over 900 lines.

Every import counts, including ones inside functions: a lazy upward import is
still an upward dependency. The walk reads source with :mod:`ast`, so it checks
the code as written, not what happened to be imported.
"""

from __future__ import annotations

import ast
import functools
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    name: REPO / name
    for name in ("lazarus", "workflows", "activities", "workers", "infra", "bench")
}
FLOORS = ("domain", "workflows", "activities", "app", "bench")
ALLOWED_CIRCLES: dict[frozenset[str], str] = {}
"""Documented exceptions: none today. A circle added here needs a reason."""


def floor_of(module: str) -> int:
    for prefix, floor in (
        ("lazarus.domain", 0),
        ("lazarus.rank", 0),
        ("workflows", 1),
        ("activities", 2),
        ("lazarus.app", 3),
        ("workers", 3),
        ("infra", 3),
        ("bench", 4),
    ):
        if module == prefix or module.startswith(prefix + "."):
            return floor
    return 0 if module == "lazarus" else 3


@functools.cache
def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(root).with_suffix("").parts
            parts = [package, *relative]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """Every lazarus module ``module`` imports, with the line."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target, node.lineno
            for alias in node.names:  # ``from lazarus.domain import spec`` imports a module
                yield f"{target}.{alias.name}", node.lineno


@functools.cache
def graph() -> dict[str, set[tuple[str, int]]]:
    known = modules()
    edges: dict[str, set[tuple[str, int]]] = {}
    for module, path in known.items():
        edges[module] = {
            (target, line)
            for target, line in imports(module, path)
            if target in known and target != module
        }
    return edges


@pytest.fixture(scope="module", autouse=True)
def walked() -> None:
    """The walk (about a second) once, as the module's set-up: every test reads it."""
    graph()


def test_every_floor_imports_only_floors_below_it() -> None:
    known = modules()
    upward = [
        f"{known[module].relative_to(REPO)}:{line}: {module} ({FLOORS[floor_of(module)]}) "
        f"imports {target} ({FLOORS[floor_of(target)]})"
        for module, targets in graph().items()
        for target, line in sorted(targets)
        if floor_of(target) > floor_of(module)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_circles() -> None:
    edges = {m: {t for t, _ in targets} for m, targets in graph().items()}
    # Importing ``a.b`` runs ``a/__init__``; a package's own re-exports of its
    # children are not circles, so edges from a package into itself are dropped.
    for module, targets in edges.items():
        edges[module] = {t for t in targets if not t.startswith(module + ".")}
    circles = [c for c in strongly_connected(edges) if len(c) > 1]
    unexplained = [sorted(c) for c in circles if frozenset(c) not in ALLOWED_CIRCLES]
    assert not unexplained, f"import circles: {unexplained}"


@functools.cache
def plain_graph() -> dict[str, set[str]]:
    """Every import as Python runs it, a package's edges to its own children kept:
    ``from pkg import sub`` names the module ``sub``, ``from mod import name`` and
    ``import a.b.c`` the longest prefix that is one of ours."""
    known = modules()

    def ours(name: str) -> str | None:
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            if (prefix := ".".join(parts[:end])) in known:
                return prefix
        return None

    edges: dict[str, set[str]] = {module: set() for module in known}
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(parsed(path)):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = module.split(".")
                    parts = parts[: len(parts) - node.level + (1 if is_package else 0)]
                    base = ".".join([*parts, node.module] if node.module else parts)
                names = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                    for alias in node.names
                ]
            edges[module] |= {t for t in map(ours, names) if t is not None and t != module}
    return edges


def test_no_import_circles_in_the_plain_module_graph() -> None:
    """The circle check above drops a package's edges to its own children (a package
    re-exporting them is no circle); this one keeps them, so a child that imports its
    own package back (``lazarus.rank.memory`` -> ``lazarus.rank`` -> ``resume`` ->
    ``memory``, the last one, gone with the rank facade) is caught too."""
    circles = [sorted(c) for c in strongly_connected(plain_graph()) if len(c) > 1]
    assert not circles, f"import circles (package edges kept): {circles}"


def test_no_module_imports_its_own_package() -> None:
    """Siblings import each other directly (``from lazarus.rank import heartbeats``,
    ``from lazarus.rank.identity import info``), never through the package they sit
    in: a package's ``__init__`` imports its children, not the other way round."""
    found = sorted(
        f"{module} imports {target}"
        for module, targets in plain_graph().items()
        for target in targets
        if module.startswith(target + ".")
    )
    assert not found, "\n".join(found)


def test_the_app_is_a_client_of_the_activities() -> None:
    """``lazarus.app`` imports nothing from ``activities`` (issue 40, part 2), and no
    module is let off: what needs a node, the checkpoint store or the worker's
    environment is a typed call to a worker (``lazarus/domain/worker_calls.py``,
    ``workflows/worker_call.py``); the job's view types and the other pure data live in
    the domain (``job_view``, ``checkpoint_views``, ``run_layout``, ``observation``);
    fault injection is ``infra/chaos.py``. ``lazarus worker`` and ``lazarus simulate``
    run a worker in the CLI's process: they import the worker room (``workers/``) when
    the verb runs, never an activity from an app module."""
    app = "lazarus.app"
    importing = sorted(
        f"{module}:{line} imports {target}"
        for module, targets in graph().items()
        if module == app or module.startswith(app + ".")
        for target, line in targets
        if target == "activities" or target.startswith("activities.")
    )
    assert not importing, "the app imports activities:\n" + "\n".join(importing)


SLURM_OUTSIDE_NODES: dict[str, str] = {
    "bench.slurm_calls": "counts the Slurm commands of the Slurm agent's own poll, shared "
    "answers and preemption check (issue 29): it drives those modules with a fake runner",
}
"""Modules outside ``activities/nodes/`` that still import a Slurm module, and why:
no production module since the first submit became the workflow's first step (issue
27); a bench that measures the Slurm agent itself."""


def test_only_the_nodes_package_knows_slurm() -> None:
    """The transport is chosen once, by the agent factory: everything else asks a
    :class:`NodeAgent` (drain, undrain, preemption notice) or the allocation facade
    (``nodes/allocation.py``), so a second scheduler would touch ``nodes/`` only."""
    nodes = "activities.nodes"
    found = sorted(
        f"{module}:{line} imports {target}"
        for module, targets in graph().items()
        if not module.startswith(nodes) and module not in SLURM_OUTSIDE_NODES
        for target, line in targets
        if target.startswith(f"{nodes}.slurm_")
    )
    assert not found, "\n".join(found)


def test_the_nodes_package_is_below_the_rest_of_the_activities() -> None:
    """``activities/nodes/`` (agents, run directory, processes on a node) is the lower
    room of the activities floor: the activities use it, never the other way round."""
    nodes = "activities.nodes"
    found = sorted(
        f"{module}:{line} imports {target}"
        for module, targets in graph().items()
        if module.startswith(nodes)
        for target, line in targets
        if target.startswith("activities.") and not target.startswith(nodes)
    )
    assert not found, "\n".join(found)


def rank_distribution() -> set[str]:
    """The modules ``lazarus-rank`` ships (``rank/pyproject.toml``): ``lazarus.rank``
    and the domain modules it lists under ``py-modules``."""
    config = tomllib.loads((REPO / "rank" / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["py-modules"])
    return listed | {m for m in modules() if m == "lazarus.rank" or m.startswith("lazarus.rank.")}


def test_the_rank_helper_needs_only_the_standard_library() -> None:
    """Training scripts import ``lazarus.rank`` into every rank, from ``lazarus-rank``
    alone: every module of that distribution imports only the standard library (and
    torch, in ``lazarus.rank.torch``; a framework, in its ``lazarus.rank.integrations``
    module) and the distribution's own modules, so it pulls
    no controller dependency (temporalio, pydantic) into training, and a module it
    needs is never left out of its wheel."""
    ours = rank_distribution()
    namespaces = {"lazarus", "lazarus.domain"}
    problems = []
    for module in sorted(ours):
        assert module in modules(), f"rank/pyproject.toml lists {module}, which does not exist"
        for target, line in imports(module, modules()[module]):
            top = target.split(".")[0]
            if top == "lazarus":
                # ``from lazarus.rank.marks import mark`` yields the name too: a name
                # from one of ours is ours.
                if not ({target, target.rpartition(".")[0]} & ours or target in namespaces):
                    problems.append(f"{module}:{line} imports {target} (not in lazarus-rank)")
            elif top not in sys.stdlib_module_names and top not in ("__future__", "torch"):
                # An integration imports its own framework (the training image's, like
                # torch); nothing else imports it, so `import lazarus.rank` never does.
                if module == f"lazarus.rank.integrations.{top}":
                    continue
                problems.append(f"{module}:{line} imports {target}")
    assert not problems, "\n".join(problems)


def test_lazarus_and_its_domain_are_namespace_packages() -> None:
    """Shared by lazarus-rank and lazarus-train (PEP 420): an ``__init__.py`` here would
    belong to one distribution and shadow the other's half."""
    present = [
        p for p in ("lazarus/__init__.py", "lazarus/domain/__init__.py") if (REPO / p).exists()
    ]
    assert present == []


MAX_PRODUCT_FILE_LINES = 900
LONG_FILES: dict[str, str] = {}
"""Product files allowed over :data:`MAX_PRODUCT_FILE_LINES`, and why (issue 27). None
since the classifier's rule table moved to ``lazarus/domain/classifier_rules.py``
(issue 40)."""


def test_no_product_file_is_over_the_limit() -> None:
    """A module over 900 lines, in the product or ``bench/`` (issue 40), holds more than
    one concern: split it (the rank helper, the fleet and the spec were). Exceptions are
    listed with their reason."""
    too_long = [
        f"{path.relative_to(REPO)}: {lines} lines"
        for path in modules().values()
        if str(path.relative_to(REPO)) not in LONG_FILES
        and (lines := len(path.read_text().splitlines())) > MAX_PRODUCT_FILE_LINES
    ]
    assert not too_long, (
        f"over {MAX_PRODUCT_FILE_LINES} lines (split by concern, or add to LONG_FILES "
        "with a reason):\n" + "\n".join(too_long)
    )


def test_the_long_file_exceptions_still_exist() -> None:
    """An exception outlives its file only by mistake: drop it with the file."""
    gone = [name for name in LONG_FILES if not (REPO / name).is_file()]
    assert not gone, f"LONG_FILES names files that are gone: {gone}"


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative: the import graph's circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components


@pytest.mark.parametrize("module", ["lazarus.domain.spec", "workflows.job"])
def test_the_walk_sees_real_modules(module: str) -> None:
    """Guards the guard: a walk that found nothing would pass every check above."""
    assert graph()[module]
    assert plain_graph()[module]


def test_every_source_file_has_one_path() -> None:
    """No symlinked source folders: a tool (or a newcomer) that follows an import
    lands on the one file it names."""
    linked = [
        str(path.relative_to(REPO))
        for root in PACKAGES.values()
        for path in [root, *root.rglob("*")]
        if path.is_symlink()
    ]
    assert linked == []
