"""The package's import structure: no module imports one that (directly or not) imports it
back; importing asapmpi or asapmpi.sync, and building the command line's parser, start
no MPI; test-only code stays in asapmpi.testing, which the package never imports.

The import graph is read from the sources with `ast` (the .pyx files and the .pxi they
include with a pattern: Cython is not Python), every import counted wherever it is,
inside functions too: a cycle that a function-level import hides still makes the two
modules one.  Only the code under `if __name__ == "__main__":` is left out: it runs when
the file is run as a script, as the module __main__, and never when it is imported.
"""
import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: source directory -> the package it is installed as (setup.py's package_dir)
PACKAGES = {"asapmpi": "asapmpi", "bindings/torch": "asapmpi.torch"}
TESTING = "asapmpi.testing"


def _modules() -> Dict[str, Path]:
    """Every module of the package, by dotted name -> its source file."""
    found: Dict[str, Path] = {}
    for directory, package in PACKAGES.items():
        base = ROOT / directory
        for path in sorted(base.rglob("*.py")) + sorted(base.rglob("*.pyx")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _is_main_guard(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _known(name: str) -> str:
    """The deepest module of the package that `name` is or is inside ("" when none: a
    name from outside the package, or an attribute of one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _ancestors(name: str) -> List[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _targets(module: str, path: Path, node: ast.AST) -> Set[str]:
    """The package's modules that one import statement in `module` runs or reads.

    `import a.b.c` and `from a.b import c` run a, a.b (and c, when it is a module); a
    package that encloses the importing module is already being imported when it runs,
    so only a name read from it (`from . import name` of an attribute) counts as using
    it."""
    is_package = path.stem == "__init__"
    here = module if is_package else module.rpartition(".")[0]
    named: Set[str] = set()       # what the statement names (modules, or attributes of one)
    if isinstance(node, ast.Import):
        named = {_known(alias.name) for alias in node.names}
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = here.split(".")
            base = base[:len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        for alias in node.names:
            child = f"{source}.{alias.name}"
            # a submodule, or an attribute of `source` (read from its __init__)
            named.add(child if child in MODULES else _known(source))
    named.discard("")
    run = set(named)
    for target in named:
        run.update(a for a in _ancestors(target) if a in MODULES
                   and a not in _ancestors(module) and a != module)
    run.discard(module)
    return run


_PYX_IMPORT = re.compile(r"^\s*(?:from\s+(\S+)\s+)?import\s+([^#]+?)\s*(?:#.*)?$")
_PYX_INCLUDE = re.compile(r'^\s*include\s+"([^"]+)"', re.M)


def _cython_imports(path: Path) -> List[ast.AST]:
    """The Python imports of a .pyx and the .pxi it includes (not cimports), as ast
    nodes: `from X import a, b` and `import X` at the start of a line."""
    sources = [path] + [path.parent / inc for inc in _PYX_INCLUDE.findall(path.read_text())]
    nodes: List[ast.AST] = []
    for source in sources:
        for line in source.read_text().splitlines():
            match = _PYX_IMPORT.match(line)
            if not match or "cimport" in line or line.rstrip().endswith("("):
                continue
            try:
                nodes.extend(ast.parse(line.strip()).body)
            except SyntaxError:
                continue        # prose in a docstring that happens to start with "from"
    return nodes


def import_graph() -> Dict[str, Set[str]]:
    """module -> the package's modules it imports, anywhere in its code."""
    graph: Dict[str, Set[str]] = {}
    for module, path in MODULES.items():
        if path.suffix == ".pyx":
            nodes = _cython_imports(path)
        else:
            tree = ast.parse(path.read_text(), filename=str(path))
            skipped = {id(n) for top in tree.body if _is_main_guard(top)
                       for n in ast.walk(top)}
            nodes = [n for n in ast.walk(tree) if id(n) not in skipped]
        graph[module] = set()
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module] |= _targets(module, path, node)
    return graph


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle, as a path that ends where it starts, per strongly connected set of
    modules that import each other (Tarjan's algorithm, then a path through each)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[Set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    cycles = []
    for component in components:
        start = min(component)
        # breadth-first from start back to start, inside the component
        paths = {w: [start, w] for w in graph[start] if w in component}
        frontier = list(paths)
        while start not in paths:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in component and w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
            frontier = nxt
        cycles.append(paths[start])
    return cycles


def test_the_graph_sees_the_package():
    graph = import_graph()
    assert "asapmpi.exchange" in graph and "asapmpi.torch.trainer" in graph
    assert "asapmpi._core.slotwin" in graph["asapmpi._core"]
    assert "asapmpi.errors" in graph["asapmpi._core.slotwin"]       # a .pyx's import
    assert "asapmpi.transports" in graph["asapmpi.exchange.choice"]
    # a package's __init__ reads what its submodule defines
    assert "asapmpi.exchange.exchange" in graph["asapmpi.exchange"]
    # a function's import counts
    assert "asapmpi.torch.trainer" in graph["asapmpi.train.cli"]
    # as does reading a name from a package's __init__
    assert "asapmpi.sync" in graph["asapmpi.train.config"]


def test_find_cycles_reports_a_cycle_as_a_path():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "modules that import each other:\n" + "\n".join(
        "  " + " -> ".join(cycle) for cycle in cycles)


def test_only_tests_import_the_testing_package():
    graph = import_graph()
    importers = sorted(f"{m} imports {t}" for m, targets in graph.items()
                       if not (m == TESTING or m.startswith(TESTING + "."))
                       for t in targets if t == TESTING or t.startswith(TESTING + "."))
    assert not importers, importers


def _modules_after(code: str) -> Set[str]:
    """The modules loaded by a fresh interpreter that ran `code`."""
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\n"
                          "print('\\n'.join(sorted(sys.modules)))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


@pytest.mark.parametrize("code", [
    "import asapmpi, asapmpi.sync",
    "import asapmpi.sync; asapmpi.sync.policy('elastic'); asapmpi.sync.policy('allreduce')",
    # `asapmpi --help` (python -m asapmpi)
    "import runpy, sys\nsys.argv = ['asapmpi', '--help']\ntry:\n"
    "    runpy.run_module('asapmpi', run_name='__main__')\nexcept SystemExit:\n    pass",
    "from asapmpi import cli\ncli.build_parser().parse_args(['bench', 'reduce'])",
], ids=["import", "policies", "help", "parser"])
def test_starts_no_mpi(code):
    loaded = _modules_after(code)
    assert "asapmpi" in loaded
    assert "mpi4py.MPI" not in loaded, "initialized MPI"
    assert "asapmpi._core" not in loaded, "loaded the MPI extension"


def test_a_command_line_loads_only_its_own_command():
    # `asapmpi graph ...` parses with graph's options alone: no other command's modules
    # (the model checker, the benchmarks, the training data's scipy: 0.3 s of each start
    # when every command's options were built)
    others = {"asapmpi.modelcheck", "asapmpi.bench.failures", "asapmpi.bench.training",
              "asapmpi.train.cli", "asapmpi.train.data", "scipy.sparse"}
    loaded = _modules_after("from asapmpi import cli\n"
                            "cli.build_parser(['graph']).parse_args(['graph'])")
    assert "asapmpi.cli.graph" in loaded and not loaded & others, loaded & others
    # a training rank's: its own, and scipy only for a sparse dataset
    loaded = _modules_after("from asapmpi import cli\nargv = ['train', 'mlp']\n"
                            "cli.build_parser(argv).parse_args(argv)")
    assert "asapmpi.train.cli" in loaded
    assert not loaded & {"asapmpi.modelcheck", "asapmpi.bench.failures", "scipy.sparse"}
    # and a benchmark's, under `bench`
    loaded = _modules_after("from asapmpi import cli\nargv = ['bench', 'zipline']\n"
                            "cli.build_parser(argv).parse_args(argv)")
    assert "asapmpi.bench.zipline" in loaded and "asapmpi.bench.reduce" not in loaded


def test_a_parser_of_one_command_parses_as_the_whole_parser():
    from asapmpi import cli

    for argv in (["train", "svm", "-n", "2", "--iters", "7"], ["bench", "core"],
                 ["bench", "consistency"], ["demo"], ["graph", "-n", "8"]):
        assert cli.build_parser(argv).parse_args(argv) == \
            cli.build_parser().parse_args(argv), argv


def test_help_prints_every_command():
    out = subprocess.run([sys.executable, "-m", "asapmpi", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    for command in ("demo", "train", "bench", "doctor", "graph"):
        assert command in out.stdout


def test_no_broken_policy_is_offered():
    from asapmpi import cli, sync, testing
    from asapmpi.errors import ConfigError
    from asapmpi.train.config import TRAINABLE

    for name, cls in sync.POLICIES.items():
        assert not cls.__module__.startswith(TESTING), name
        assert not issubclass(cls, testing.NotifyAckIgnoringAcks), name
    broken = testing.NotifyAckIgnoringAcks.name
    assert broken not in sync.POLICIES and broken not in TRAINABLE
    with pytest.raises(ConfigError, match="unknown sync policy"):
        sync.policy(broken)
    # the command line offers none either: asapmpi demo --sync, bench consistency --sync
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--sync", broken])
    assert broken not in parser.format_help()
    # a test passes it directly, as a class or an object
    assert type(sync.policy(testing.NotifyAckIgnoringAcks)) is testing.NotifyAckIgnoringAcks
    made = testing.NotifyAckIgnoringAcks()
    assert sync.policy(made) is made
    with pytest.raises(ConfigError, match="policy object"):
        sync.policy(made, max_gap=2)


def _imports_torch(path: Path) -> bool:
    nodes = _cython_imports(path) if path.suffix == ".pyx" else \
        list(ast.walk(ast.parse(path.read_text(), filename=str(path))))
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name == "torch" or name.startswith("torch.") for name in names):
            return True
    return False


def test_torch_is_imported_only_by_its_bindings():
    # the core, the benchmark harness and every user-facing module outside asapmpi.torch
    # run without torch (setup.py: only the bindings import it); what the harness times
    # with torch (gloo's all_reduce, the device job) is the bindings' (asapmpi.torch.gloo,
    # asapmpi.torch.device_job), and the harness imports it only when torch is there
    importing = sorted(m for m, path in MODULES.items()
                       if _imports_torch(path) and not m.startswith("asapmpi.torch"))
    assert importing == [], importing
    assert _imports_torch(MODULES["asapmpi.torch.optimizer"])     # the check sees imports
    # a function-level import counts: the device job imports torch inside main()
    assert _imports_torch(MODULES["asapmpi.torch.device_job"])


def test_the_bindings_import_no_emulated_host():
    # the user-facing bindings train on any launcher's ranks: the emulated hosts' cgroups
    # (asapmpi.launch.budget) are the benchmark's, handed to the trainer by the CLI
    # (train(clock_budget=...)), never imported by it
    graph = import_graph()
    reach = sorted(m for m, targets in graph.items() if m.startswith("asapmpi.torch")
                   and "asapmpi.launch.budget" in targets)
    assert reach == [], reach
    assert "asapmpi.launch.budget" in graph["asapmpi.train.cli"]     # the check sees it
    # load balancing is a trainer option: it lives with the trainer's options
    assert "asapmpi.train.loadbalance" in graph["asapmpi.torch.trainer"]
    assert "asapmpi.loadbalance" not in MODULES


def test_a_test_module_imports_test_modules_of_its_own_folder_only():
    # pytest imports each tests/<layer>/test_*.py by its file name, with its folder on
    # sys.path: a test module of another folder imports only while that folder happens
    # to be there too (helpers shared across folders live in tests/, beside them)
    tests = ROOT / "tests"
    where = {p.stem: p.parent for p in tests.glob("*/test_*.py")}
    assert len(where) == len(list(tests.glob("*/test_*.py"))), "two test files share a name"
    assert not list(tests.glob("test_*.py")), "a test module outside the layers' folders"
    astray = []
    for name, folder in sorted(where.items()):
        tree = ast.parse((folder / f"{name}.py").read_text())
        for node in ast.walk(tree):
            imported = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            astray += [f"{folder.name}/{name} imports {m}" for m in imported
                       if m in where and where[m] != folder]
    assert not astray, astray
