"""The shape of the code base, checked with the rest of the suite (house style; issue 19).

Serial and quick: every check reads the source tree, none needs MPI. Each one fails with one
line per violation, ``path:line: [rule] what is wrong``:

- import-cycle: no two modules of the Python package ``fourd`` import each other, directly or
  round a longer loop (every import statement counts, module level or inside a function);
- algorithm-includes: no file of cpp/src/algorithms/ reaches the communicator's private state
  or an MPI, NCCL or CUDA header, directly or through the project's own headers;
- name-table: no Python literal copies a name table that the native module exports;
- function-length: no function over 80 lines (lizard's count) in cpp/, cuda/, python/fourd/,
  python/csrc/;
- ruff-check, ruff-format, clang-format: the formatting settings of pyproject.toml and
  .clang-format hold everywhere.

The tools (lizard, ruff, clang-format) come with the ``test`` extra of pyproject.toml.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "fourd"
PACKAGE_NAME = "fourd"
CXX_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu", ".cuh")


def _rel(path: Path) -> str:
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:  # a file outside the tree (the checks' own tests)
        return path.as_posix()


def _fail(rule: str, violations: list[str]) -> None:
    if violations:
        head = f"{len(violations)} violation(s) of [{rule}]:\n"
        pytest.fail(head + "\n".join(violations), pytrace=False)


# --- import-cycle ----------------------------------------------------------------------------
#
# Nodes are the package's Python modules (a package's __init__ is the package's node). An import
# is an edge to the module it executes: `import fourd.grid` and `from fourd.grid import x` to
# fourd.grid; `from . import sibling` to the sibling, unless __init__ itself defines that name
# (then Python takes the attribute and runs only __init__). A native extension (fourd._C) is a
# leaf. `importlib.import_module("...")` calls, such as the lazy __getattr__ of
# fourd/__init__.py, are not import statements: the imported module is loaded when first used,
# so they close no loop at import time.


@dataclass(frozen=True)
class ImportEdge:
    source: str
    target: str
    path: Path
    line: int


def python_modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of `package` (its parent on sys.path)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _declared_native_modules() -> set[str]:
    """Extension modules CMakeLists.txt builds into the package (a fresh clone has no .so)."""
    cmake = (ROOT / "CMakeLists.txt").read_text()
    return {f"fourd.{name}" for name in re.findall(r"pybind11_add_module\(\s*(\w+)", cmake)}


def _native_submodule(modules: dict[str, Path], dotted: str) -> bool:
    if dotted in _declared_native_modules():
        return True
    parent, _, name = dotted.rpartition(".")
    init = modules.get(parent)
    if init is None or init.name != "__init__.py":
        return False
    return any(init.parent.glob(f"{name}.*.so")) or any(init.parent.glob(f"{name}.*.pyd"))


def _is_package(modules: dict[str, Path], dotted: str) -> bool:
    return modules[dotted].name == "__init__.py"


def _from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str | None:
    """The absolute module named by `from <base> import ...` inside `module`."""
    if node.level == 0:
        return node.module
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 > len(parts) - 1:
        return None
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _module_level(body: Iterable[ast.stmt]) -> Iterable[ast.stmt]:
    """Statements run at import time: the body and the branches of if/try/with, not defs."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, DEFINITIONS):
            continue
        for block in ("body", "orelse", "finalbody"):
            yield from _module_level(getattr(stmt, block, []))
        for handler in getattr(stmt, "handlers", []):
            yield from _module_level(handler.body)


def _submodule(modules: dict[str, Path], dotted: str) -> bool:
    return dotted in modules or _native_submodule(modules, dotted)


def _assigned(stmt: ast.Assign | ast.AnnAssign | ast.AugAssign) -> set[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _imported_otherwise(stmt: ast.ImportFrom, package: str, modules: dict[str, Path]) -> set[str]:
    """Names `stmt` binds in the package's __init__, but its own submodules bound as such."""
    base = _from_base(stmt, package, True)
    names = set()
    for a in stmt.names:
        own = base == package and _submodule(modules, f"{base}.{a.name}")
        if not (own and a.asname in (None, a.name)):
            names.add(a.asname or a.name)
    return names


def _defined_names(package: str, tree: ast.Module, modules: dict[str, Path]) -> set[str]:
    """Names a package's __init__ binds at import time to anything but its same-named
    submodule (`from . import grid` binds the submodule; `from .x import grid` does not)."""
    names = set()
    for stmt in _module_level(tree.body):
        if isinstance(stmt, DEFINITIONS):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            names |= _assigned(stmt)
        elif isinstance(stmt, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in stmt.names)
        elif isinstance(stmt, ast.ImportFrom):
            names |= _imported_otherwise(stmt, package, modules)
    return names


def _inside(name: str) -> bool:
    return name == PACKAGE_NAME or name.startswith(PACKAGE_NAME + ".")


def _import_targets(
    node: ast.Import | ast.ImportFrom,
    module: str,
    modules: dict[str, Path],
    defined: dict[str, set[str]],
) -> list[str]:
    """The package modules that the import statement `node` inside `module` executes."""
    if isinstance(node, ast.Import):
        out = []
        for alias in node.names:
            name = alias.name
            while _inside(name) and name not in modules:
                name = name.rpartition(".")[0]
            if _inside(name):
                out.append(name)
        return out
    base = _from_base(node, module, _is_package(modules, module))
    if base is None or not _inside(base) or base not in modules:
        return []
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if alias.name in defined.get(base, ()) or alias.name == "*":
            out.append(base)
        elif sub in modules:
            out.append(sub)
        elif not _native_submodule(modules, sub):  # the native module is a leaf
            out.append(base)
    return out


def import_edges(modules: dict[str, Path]) -> list[ImportEdge]:
    """Every import statement between two modules of the package, in file and line order."""
    trees = {m: ast.parse(p.read_text(), filename=str(p)) for m, p in modules.items()}
    defined = {
        m: _defined_names(m, t, modules) for m, t in trees.items() if _is_package(modules, m)
    }
    edges = set()
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _import_targets(node, module, modules, defined):
                if target != module:
                    edges.add(ImportEdge(module, target, modules[module], node.lineno))
    return sorted(edges, key=lambda e: (str(e.path), e.line, e.target))


def strongly_connected(nodes: Iterable[str], edges: list[ImportEdge]) -> dict[str, int]:
    """Tarjan's components: node -> component id (ids shared by the nodes of one loop)."""
    succ: dict[str, list[str]] = {}
    for e in edges:
        succ.setdefault(e.source, []).append(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    comp: dict[str, int] = {}

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in succ.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w not in comp:  # on the stack: part of the component being built
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            while True:
                w = stack.pop()
                comp[w] = index[v]
                if w == v:
                    break

    for v in sorted(set(nodes)):
        if v not in index:
            visit(v)
    return comp


def _path_back(start: str, goal: str, edges: list[ImportEdge]) -> list[ImportEdge]:
    """The shortest chain of imports from `start` to `goal` over `edges` (breadth first)."""
    came: dict[str, ImportEdge | None] = {start: None}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        if v == goal:
            break
        for e in (e for e in edges if e.source == v):
            if e.target not in came:
                came[e.target] = e
                queue.append(e.target)
    chain = []
    v = goal
    while came.get(v) is not None:
        chain.append(came[v])
        v = came[v].source
    return chain[::-1]


def import_cycles(modules: dict[str, Path]) -> list[str]:
    """One line per import statement that lies on a loop, with the way back to its module."""
    edges = import_edges(modules)
    comp = strongly_connected(modules, edges)
    looped = [e for e in edges if comp[e.source] == comp[e.target]]
    out = []
    for e in looped:
        back = _path_back(e.target, e.source, looped)
        hops = " -> ".join(f"{b.target} ({_rel(b.path)}:{b.line})" for b in back)
        out.append(
            f"{_rel(e.path)}:{e.line}: [import-cycle] {e.source} imports {e.target}, "
            f"which leads back: {e.target} -> {hops}"
        )
    return out


def test_no_import_cycle():
    _fail("import-cycle", import_cycles(python_modules()))


def test_import_cycle_check_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "fourd"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a\nfrom . import c\n")
    (pkg / "sub" / "c.py").write_text("import fourd.sub\n")
    found = import_cycles(python_modules(pkg))
    assert [line.split(": [")[0].rsplit("/", 1)[-1] for line in found] == ["a.py:2", "b.py:1"]
    assert all("fourd.sub.c" not in line for line in found)  # c -> sub (__init__), no loop


# --- algorithm-includes ----------------------------------------------------------------------
#
# Algorithms see a narrow view of their group (house style): its backend, its topology levels,
# scratch. So no algorithm file may include, even through other project headers, the header
# that defines the communicator's state, nor a header of a transport (MPI, NCCL, CUDA runtime):
# those belong below the backend interface.

ALGORITHMS_DIR = ROOT / "cpp" / "src" / "algorithms"
INCLUDE_DIRS = (ROOT / "cpp" / "include", ROOT / "cpp" / "src", ROOT / "cuda")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^">]+)[">]', re.M)
# The transports' own headers: <mpi.h>, <mpi-ext.h>, <nccl.h>, <cuda_runtime.h>, <cuda.h>, ...
TRANSPORT_HEADER = re.compile(r"^(mpi|nccl|cuda)[\w.-]*\.h$")
# The communicator's private state: a header that defines one of these types is off limits.
PRIVATE_STATE_TYPES = ("CommState",)
PRIVATE_STATE_SEARCH = (ROOT / "cpp", ROOT / "cuda")


def private_state_headers(roots: Iterable[Path]) -> dict[Path, str]:
    """Header -> the private type it defines (a definition with a body, not a declaration)."""
    pattern = re.compile(r"\b(?:class|struct)\s+(" + "|".join(PRIVATE_STATE_TYPES) + r")\b[^;{]*\{")
    found = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix in (".h", ".hpp", ".cuh"):
                m = pattern.search(path.read_text(errors="replace"))
                if m:
                    found[path.resolve()] = m.group(1)
    return found


def _resolve_include(name: str, including: Path, dirs: Iterable[Path]) -> Path | None:
    for base in (including.parent, *dirs):
        candidate = base / name
        if candidate.is_file():
            return candidate.resolve()
    return None


def _includes(path: Path) -> Iterable[tuple[int, str, str]]:
    text = path.read_text(errors="replace")
    for m in INCLUDE.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)


def forbidden_includes(source: Path, dirs: Iterable[Path], private: dict[Path, str]) -> list[str]:
    """What `source` reaches that it must not, each with its shortest chain of includes."""
    dirs = tuple(dirs)
    seen = {source.resolve()}
    queue: deque[tuple[Path, list[str], int]] = deque([(source, [], 0)])
    reported: set[str] = set()
    out = []
    while queue:
        path, chain, first_line = queue.popleft()
        for line, delim, name in _includes(path):
            hop = [*chain, f"{_rel(path)}:{line} {delim}{name}{'>' if delim == '<' else delim}"]
            start = first_line or line
            target = _resolve_include(name, path, dirs) if delim == '"' else None
            bad = None
            if target is not None and target in private:
                bad = f"the communicator's private state ({private[target]}, {_rel(target)})"
            elif target is None and TRANSPORT_HEADER.match(name.rsplit("/", 1)[-1]):
                bad = f"a transport header <{name}>"
            if bad and bad not in reported:
                reported.add(bad)
                out.append(
                    f"{_rel(source)}:{start}: [algorithm-includes] reaches {bad}: "
                    + " -> ".join(hop)
                )
            if target is not None and target not in seen and target not in private:
                seen.add(target)
                queue.append((target, hop, start))
    return out


def algorithm_include_violations(
    algorithms: Path = ALGORITHMS_DIR,
    dirs: Iterable[Path] = INCLUDE_DIRS,
    private_search: Iterable[Path] = PRIVATE_STATE_SEARCH,
) -> list[str]:
    private = private_state_headers(private_search)
    out = []
    for path in sorted(algorithms.iterdir()):
        if path.suffix in CXX_SUFFIXES:
            out += forbidden_includes(path, tuple(dirs), private)
    return out


def test_algorithms_include_no_private_state_or_transport():
    _fail("algorithm-includes", algorithm_include_violations())


def test_include_check_follows_project_headers(tmp_path):
    (tmp_path / "algorithms").mkdir()
    (tmp_path / "internal").mkdir()
    (tmp_path / "algorithms" / "a.cpp").write_text('#include <vector>\n#include "internal/x.hpp"\n')
    (tmp_path / "internal" / "x.hpp").write_text('#pragma once\n#include "state.hpp"\n')
    (tmp_path / "internal" / "state.hpp").write_text("#include <mpi.h>\nclass CommState {};\n")
    found = algorithm_include_violations(tmp_path / "algorithms", [tmp_path], [tmp_path])
    assert len(found) == 1 and "algorithms/a.cpp:2: [algorithm-includes]" in found[0]
    assert "(CommState," in found[0] and "internal/x.hpp:2" in found[0]
    (tmp_path / "internal" / "state.hpp").write_text("#include <mpi.h>\nclass CommState;\n")
    found = algorithm_include_violations(tmp_path / "algorithms", [tmp_path], [tmp_path])
    assert len(found) == 1 and "a transport header <mpi.h>" in found[0]


# --- name-table ------------------------------------------------------------------------------
#
# Every name table lives once, in C++, and is exported by fourd._C (house style). A Python
# literal (list, tuple, set, or the keys of a dict) that holds three or more names of one table
# is a copy of it, whether it spells the names or their aliases ('bf16', 'double', 'product':
# whatever fourd._C.parse_* maps to that table). Nested rows count with their container, so
# (("sum", 0), ("prod", 1), ("max", 3)) is one copy. Three, not two: a pair such as
# ("float16", "bfloat16") or ("x", "y") names a case, a third name makes it a list of the
# table's members.
#
# Exempt, with the reason:
# - `__all__`: the public function names all_reduce, all_gather, reduce_scatter and broadcast
#   are the functions' names, which match the collectives' by design; not a table.
# - dict keys, for the axes and the profile fields only: those names are keyword names
#   (fourd.init(x=, y=, z=, data=), MachineProfile(**fields)), so a dict keyed by them is one
#   record, a grid shape or a profile's figures, as `dict(x=2, data=2)` is. Their sequences
#   count, and so do the dict keys of the other tables (a dict keyed by dtypes or ops maps the
#   vocabulary to something else: a copy).

# Assignments whose literals are data keyed by the names, not copies of a table, each with its
# reason:
NAME_TABLE_EXEMPT_ASSIGNMENTS = (
    "__all__",  # the public functions happen to be named as the collectives
    # the bench oracle's numeric limits per dtype (exact sums, powers of two, avg's tolerance):
    # properties of the test data the native core does not hold
    "_SUM_LIMIT",
    "_POW2_LIMIT",
    "_AVG_RTOL",
    # the calibration's plans: which collectives, dtypes and placements it chooses to time
    "_CORRECTION_PLAN",
    "_SPANNING_PLAN",
)
RECORD_KEY_TABLES = ("AXES", "MachineProfile.FIELDS")


@lru_cache(maxsize=1)
def vocabulary() -> dict[str, Callable[[str], str | None]]:
    """Table name -> a function mapping a string to the table's canonical name, or None."""
    from fourd import _C

    def through(parser: Callable, names: Iterable[str]) -> Callable[[str], str | None]:
        canonical = {parser(n, "name"): n for n in names}

        @cache
        def canon(s: str) -> str | None:
            try:
                return canonical.get(parser(s, "name"))
            except ValueError:
                return None

        return canon

    def axis(s: str) -> str | None:
        try:
            mask = _C.parse_axis(s, "axis")
        except ValueError:
            return None
        name = _C.mask_name(mask)
        return name if name in _C.AXES else None

    fields = frozenset(_C.MachineProfile.FIELDS)
    return {
        "DTYPES": through(_C.parse_dtype, _C.DTYPES),
        "OPS": through(_C.parse_op, _C.OPS),
        "ALGORITHMS": through(_C.parse_algorithm, _C.ALGORITHMS),
        "COLLECTIVES": through(_C.parse_collective, _C.COLLECTIVES),
        "AXES": axis,
        "MachineProfile.FIELDS": lambda s: s if s in fields else None,
    }


def _items(node: ast.AST) -> list[ast.expr] | None:
    """The elements of a list, tuple or set literal, the keys of a dict literal; else None."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return node.elts
    if isinstance(node, ast.Dict):
        return [k for k in node.keys if k is not None]
    return None


def _strings(nodes: Iterable[ast.expr]) -> list[str]:
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _literal_strings(node: ast.AST) -> tuple[list[str], list[ast.AST]]:
    """The strings of a literal container, with those of the lists, tuples and sets among its
    items (rows); and those rows, counted here and not again on their own."""
    items = _items(node) or []
    if isinstance(node, ast.Dict):
        return _strings(items), []
    rows = [i for i in items if isinstance(i, (ast.List, ast.Tuple, ast.Set))]
    return _strings(items) + [s for row in rows for s in _strings(row.elts)], rows


def _exempt_literals(tree: ast.Module) -> set[int]:
    """The nodes of the values assigned to the exempt names."""
    exempt = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value:
            if _assigned(node) & set(NAME_TABLE_EXEMPT_ASSIGNMENTS):
                exempt.update(id(n) for n in ast.walk(node.value))
    return exempt


def name_table_copies(path: Path, source: str | None = None) -> list[str]:
    source = path.read_text() if source is None else source
    tree = ast.parse(source, filename=str(path))
    exempt = _exempt_literals(tree)
    inner = set()  # containers already counted with the container that holds them
    out = []
    for node in ast.walk(tree):
        if id(node) in exempt or id(node) in inner:
            continue
        if (
            isinstance(node, ast.Dict)
            and node.values
            and not any(isinstance(v, ast.Constant) for v in node.values)
        ):
            # fourd's names mapped onto another library's objects (MPI.FLOAT, a torch op):
            # those cannot come from the native table, and the keys are checked against it
            # when the dict is built (an unknown name fails at its first use).
            continue
        strings, rows = _literal_strings(node)
        inner.update(id(n) for n in rows)
        for table, canon in vocabulary().items():
            if isinstance(node, ast.Dict) and table in RECORD_KEY_TABLES:
                continue
            names = sorted({c for c in map(canon, strings) if c is not None})
            if len(names) >= 3:
                out.append(
                    f"{_rel(path)}:{node.lineno}: [name-table] a literal holds "
                    f"{len(names)} names of fourd._C.{table} ({', '.join(names)}); "
                    f"read the table from fourd._C instead"
                )
    return sorted(out, key=lambda line: int(line.split(":")[1]))


def test_no_name_table_in_python():
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        out += name_table_copies(path)
    _fail("name-table", out)


def test_name_table_check_counts_aliases_and_rows():
    source = (
        "__all__ = ['all_reduce', 'all_gather', 'reduce_scatter']\n"
        "PAIR = ('float16', 'bfloat16')\n"
        "ROWS = (('sum', 0), ('product', 1), ('max', 3))\n"
        "DT = {'float': 4, 'double': 8, 'bf16': 2}\n"
        "SHAPE = {'x': 2, 'y': 1, 'z': 1, 'data': 2}\n"
        "TP = ('x', 'y', 'z')\n"
    )
    found = name_table_copies(PACKAGE / "example.py", source)
    assert [f.split(": ")[0].rsplit(":", 1)[-1] for f in found] == ["3", "4", "6"]
    assert "fourd._C.OPS (max, prod, sum)" in found[0]
    assert "fourd._C.DTYPES (bfloat16, float32, float64)" in found[1]
    assert "fourd._C.AXES (x, y, z)" in found[2]


# --- function-length -------------------------------------------------------------------------
#
# lizard's length: from a function's first line to its last. Generated code or pure table data
# may be exempted here by qualified name, each with its reason; nothing is today.

MAX_FUNCTION_LINES = 80
LONG_FUNCTION_EXEMPT: dict[str, str] = {}
LENGTH_CHECKED = ("cpp", "cuda", "python/fourd", "python/csrc")


def long_functions() -> list[str]:
    import lizard

    out = []
    for top in LENGTH_CHECKED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (*CXX_SUFFIXES, ".py") or "__pycache__" in path.parts:
                continue
            # .cu and .cuh have no reader of their own: lizard falls back to its C/C++ one.
            for f in lizard.analyze_file(str(path)).function_list:
                if f.length > MAX_FUNCTION_LINES and f.long_name not in LONG_FUNCTION_EXEMPT:
                    out.append(
                        f"{_rel(path)}:{f.start_line}: [function-length] {f.name} is "
                        f"{f.length} lines (at most {MAX_FUNCTION_LINES})"
                    )
    return out


def test_no_function_over_80_lines():
    _fail("function-length", long_functions())


# --- formatting ------------------------------------------------------------------------------
#
# Checked, never applied: `ruff format`, `ruff check --fix` and `clang-format -i` fix what these
# report.

RUFF_PATHS = ("python", "tests", "bench", "examples")
CLANG_FORMAT_DIRS = ("cpp", "cuda", "python/csrc", "tests/cpp")


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: install the test extra (pip install '.[test]')")
    return found


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_check():
    r = _run([_tool("ruff"), "check", "--no-fix", "--output-format", "concise", *RUFF_PATHS])
    lines = [line for line in r.stdout.splitlines() if re.match(r"^\S+:\d+:\d+: ", line)]
    out = [re.sub(r"^(\S+:\d+):\d+: (\S+) ", r"\1: [ruff-check \2] ", line) for line in lines]
    assert r.returncode in (0, 1), r.stdout + r.stderr
    _fail("ruff-check", out)


def _diff_hunks(diff: str) -> list[tuple[str, int, int]]:
    """(file, first changed line, hunks) per file of a unified diff."""
    files: dict[str, list[int]] = {}
    current, line_no, found = None, 0, True
    for line in diff.splitlines():
        if line.startswith("--- "):
            current = line[4:].split("\t")[0].strip()
        elif line.startswith("@@") and current is not None:
            line_no, found = int(re.match(r"@@ -(\d+)", line).group(1)), False
            files.setdefault(current, []).append(line_no)
        elif current is not None and not found and line[:1] in ("-", "+"):
            files[current][-1], found = line_no, True
        elif line.startswith(" "):
            line_no += 1
    return [(f, starts[0], len(starts)) for f, starts in files.items()]


def test_ruff_format():
    r = _run([_tool("ruff"), "format", "--diff", *RUFF_PATHS])
    assert r.returncode in (0, 1), r.stderr
    out = [
        f"{f}:{first}: [ruff-format] would be reformatted ({n} hunk(s))"
        for f, first, n in _diff_hunks(r.stdout)
    ]
    _fail("ruff-format", out)


def test_clang_format():
    files = sorted(
        _rel(p)
        for d in CLANG_FORMAT_DIRS
        for p in (ROOT / d).rglob("*")
        if p.suffix in CXX_SUFFIXES
    )
    r = _run([_tool("clang-format"), "--dry-run", "-Werror", "--style=file", *files])
    per_file: dict[str, list[str]] = {}
    for line in r.stderr.splitlines():
        m = re.match(r"^(.+?):(\d+):\d+: error: ", line)
        if m:
            per_file.setdefault(_rel(Path(m.group(1)).resolve()), []).append(m.group(2))
    out = [
        f"{f}:{lines[0]}: [clang-format] would be reformatted ({len(lines)} places)"
        for f, lines in per_file.items()
    ]
    assert per_file or r.returncode == 0, r.stderr[-2000:]
    _fail("clang-format", out)
