"""The package's layout rules, read from the source with `ast` (nothing is imported):

- no import cycles between modules of recordtool/, counting every import statement wherever it
  is (module level, inside a function, under `try`), relative ones resolved, and
  `importlib.import_module` calls (a name built at run time inside a package counts as importing
  every module of that package);
- a module over MAX_LINES lines says in its docstring why it is not split (a paragraph starting
  "Not split:"). WAITING names the modules that are over it while someone else is changing
  them, each with who and why; an entry fails the test once its module is under the limit or
  gives its reason, so the list cannot outlive its cause;
- the library never imports the tools (recordtool/tools/: only the CLI and other tools do);
- ARCHITECTURE.md names every module (one line each) and no module that is not there;
- the decode stage and the loader (NO_ENVIRONMENT) read no environment variable: a choice a user
  needs is a typed argument, and a measurement's alternative path a keyword of the internal class;
- the loader is the same for every device: it imports nothing of the GPU stage
  (`recordtool.decode.gpu`, its face or its modules) and no GPU library (CuPy); the backend that
  makes its batches comes through decode.device (decode.backend's protocol);
- the decode stage imports nothing of the ops (recordtool.ops sits above it: the Loader hands a
  compiled op in).

An edge goes to each module an import runs: `import a.b.c` → a.b.c and the packages a, a.b
(those above the importing module only when named: the others are already running);
`from P import n` → P.n when that is a module of the tree, else P. A compiled extension
(setup.py's `recordtool._native`, ...) is no module of the tree and draws no edge; from a package
above the importer, `from P import n` is an edge to P only when P defines n (or has a module
`__getattr__`). The last two tests run the checker on made-up packages with known cycles.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "recordtool"
MAX_LINES = 420
GENERATED = ("_pb2.py",)  # protoc's output (scripts/gen_proto.sh)
ARCHITECTURE = ROOT.parent / "ARCHITECTURE.md"
WAITING: dict = {}
NO_ENVIRONMENT = ("decode", "loader")  # packages of ROOT configured by their arguments alone
ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}
GPU_STAGE = "decode.gpu"  # under ROOT: the GPU stage, which the loader imports nothing of
GPU_LIBRARIES = ("cupy",)  # third-party modules that are the GPU's alone


def module_files(root: Path = ROOT) -> dict:
    """{dotted module name: path} of every .py file under root (a package __init__ is the package)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of a relative import's base, as Python resolves it."""
    if not level:
        return name or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 > len(package) - 1:
        raise ImportError(f"{module}: relative import beyond the top-level package")
    base = package[:len(package) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _loads(name: str, importer: str, modules: dict) -> list:
    """The modules of the tree that `import name` runs from `importer`: name and the packages
    above it, less those above the importer (already running when it runs) unless named."""
    parts = name.split(".")
    out = []
    for k in range(1, len(parts) + 1):
        m = ".".join(parts[:k])
        if m in modules and (k == len(parts) or not importer.startswith(m + ".")):
            out.append(m)
    return out


def _import_module_call(node: ast.Call, module: str, is_package: bool, modules: dict) -> list:
    """Edges of an `importlib.import_module(name, package)` call."""
    f = node.func
    called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    if called != "import_module" or not node.args:
        return []
    arg = node.args[0]
    package = module if is_package else module.rsplit(".", 1)[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        name = arg.value
        if name.startswith("."):
            level = len(name) - len(name.lstrip("."))
            name = _resolve(module, is_package, level, name.lstrip(".") or None)
        return _loads(name, module, modules)
    # a name built at run time: any module of the package (relative) or of the tree may load
    prefix = package + "." if isinstance(arg, ast.JoinedStr) and _starts_with_dot(arg) else ""
    return [m for m in modules if m.startswith(prefix) and m != module]


def _starts_with_dot(arg: ast.JoinedStr) -> bool:
    first = arg.values[0] if arg.values else None
    return isinstance(first, ast.Constant) and str(first.value).startswith(".")


def _defines(path: Path, name: str) -> bool:
    """Whether module `path` may give `name` itself: a top-level def, class, assignment or import
    of it, a `*` import, or a module `__getattr__`. Otherwise `from P import name` loads a
    submodule that is not Python source (a compiled extension), no module of the tree."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name in (name, "__getattr__"):
                return True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*" or (a.asname or a.name).split(".")[0] == name:
                    return True
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(t)):
                    return True
    return False


def extensions(setup: Path = ROOT.parent / "setup.py") -> set:
    """The compiled extensions setup.py builds ("recordtool._native", ...): modules that are not
    Python source and import nothing of the tree."""
    return {n.value for n in ast.walk(ast.parse(setup.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and n.value.startswith(ROOT.name + ".") and n.value.isascii()
            and all(part.isidentifier() for part in n.value.split("."))}


def import_graph(root: Path = ROOT, compiled: set | None = None) -> dict:
    """{module: {imported module: first line}} over every import in the tree; `compiled`: the
    extension modules (default: setup.py's)."""
    modules = module_files(root)
    compiled = extensions() if compiled is None else compiled
    graph: dict = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = graph.setdefault(module, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [m for a in node.names for m in _loads(a.name, module, modules)]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, is_package, node.level, node.module)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in modules:
                        targets += _loads(sub, module, modules)
                    elif sub in compiled:
                        targets += [m for m in _loads(base, module, modules) if not module.startswith(m + ".")]
                    elif not module.startswith(base + "."):
                        targets += _loads(base, module, modules)
                    elif base in modules and _defines(modules[base], a.name):  # a name of a package above
                        targets.append(base)
            elif isinstance(node, ast.Call):
                targets = _import_module_call(node, module, is_package, modules)
            for t in targets:
                if t != module:
                    edges[t] = min(edges.get(t, node.lineno), node.lineno)  # its first line
    return graph


def cycles(graph: dict) -> list:
    """Every strongly connected component of more than one module (Tarjan), each as one cycle
    through it: [m0, m1, ..., m0]."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    comps = []

    def enter(v, work):  # iterative Tarjan: the graph may be deeper than Python's recursion limit
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        work.append((v, iter(sorted(graph.get(v, ())))))

    for v in sorted(graph):
        if v in index:
            continue
        work: list = []
        enter(v, work)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    enter(w, work)
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        comps.append(set(comp))
    return [_one_cycle(graph, comp) for comp in comps]


def _one_cycle(graph: dict, comp: set) -> list:
    """A shortest cycle through the component's first module (breadth-first inside it)."""
    start = min(comp)
    prev = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = []
                    while v is not None:
                        path.append(v)
                        v = prev[v]
                    return path[::-1] + [start]
                if w in comp and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(comp)}")


def describe(graph: dict, cycle: list) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_no_import_cycles():
    graph = import_graph()
    found = [describe(graph, c) for c in cycles(graph)]
    assert not found, "import cycles in recordtool/:\n" + "\n".join(found)


def _long_modules() -> dict:
    """{path: lines} of the modules over MAX_LINES whose docstring gives no 'Not split:' reason."""
    out = {}
    for path in module_files().values():
        if path.name.endswith(GENERATED):
            continue
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_LINES and "Not split:" not in (ast.get_docstring(ast.parse(text)) or ""):
            out[path.relative_to(ROOT.parent).as_posix()] = lines
    return out


def test_long_modules_say_why():
    long = _long_modules()
    unexplained = [f"{p} ({n} lines)" for p, n in long.items() if p not in WAITING]
    assert not unexplained, (f"modules over {MAX_LINES} lines: split them, or say why in the docstring "
                             "(a 'Not split:' paragraph): " + ", ".join(unexplained))
    stale = [p for p in WAITING if p not in long]
    assert not stale, f"WAITING lists modules that are now short or explained; remove them: {stale}"


def test_the_library_never_imports_the_tools():
    graph = import_graph()
    tools = ROOT.name + ".tools"
    wrong = [f"{m} (line {line}) imports {t}" for m, edges in sorted(graph.items()) for t, line in edges.items()
             if (t == tools or t.startswith(tools + ".")) and not m.startswith((tools, ROOT.name + ".cli"))]
    assert not wrong, "library modules import the tools:\n" + "\n".join(wrong)


def test_architecture_names_every_module():
    text = ARCHITECTURE.read_text()
    modules = {p.relative_to(ROOT).as_posix() for p in module_files().values() if not p.name.endswith(GENERATED)}
    missing = sorted(m for m in modules if f"`{m}`" not in text)
    assert not missing, "ARCHITECTURE.md has no line for: " + ", ".join(missing)
    rows = re.findall(r"^\| `([\w/]+\.py)` \|", text, re.M)  # the first column of its module tables
    gone = sorted(r for r in rows if r not in modules)
    assert not gone, "ARCHITECTURE.md describes modules that do not exist: " + ", ".join(gone)


def environment_reads(path: Path) -> list:
    """(line, name) of each use of the process environment in a module: any attribute named
    environ / getenv / ... (os.environ.get, os.getenv, `__import__("os").environ`) and those names
    imported from os."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT_NAMES:
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom) and node.module in ("os", "posix"):
            out += [(node.lineno, a.name) for a in node.names if a.name in ENVIRONMENT_NAMES | {"*"}]
    return out


def test_decode_and_loader_read_no_environment_variable():
    wrong = [f"{path.relative_to(ROOT.parent)}:{line} uses {name}"
             for package in NO_ENVIRONMENT for path in sorted((ROOT / package).rglob("*.py"))
             for line, name in environment_reads(path)]
    assert not wrong, "environment reads where configuration is by argument only:\n" + "\n".join(wrong)


def _imports_under(graph: dict, importer: str, imported: str) -> list:
    """'module (line n) imports target' for each edge from a module in package `importer` to one
    in package `imported` (both dotted, under ROOT)."""
    a, b = f"{ROOT.name}.{importer}", f"{ROOT.name}.{imported}"
    return [f"{m} (line {line}) imports {t}" for m, edges in sorted(graph.items()) if m == a or m.startswith(a + ".")
            for t, line in sorted(edges.items()) if t == b or t.startswith(b + ".")]


def library_imports(path: Path, names: tuple) -> list:
    """(line, module) of each import of a module named in `names` (or one of theirs) in a file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found = [node.module or ""]
        else:
            continue
        out += [(node.lineno, n) for n in found if n.split(".")[0] in names]
    return out


def test_the_loader_imports_nothing_of_the_gpu_stage():
    wrong = _imports_under(import_graph(), "loader", GPU_STAGE)
    wrong += [f"{path.relative_to(ROOT.parent)}:{line} imports {name}"
              for path in sorted((ROOT / "loader").rglob("*.py")) for line, name in library_imports(path, GPU_LIBRARIES)]
    assert not wrong, ("the loader is device-agnostic: the GPU's code belongs behind decode.backend's protocol "
                       "(decode.gpu.GPUBackend, made by decode.device):\n" + "\n".join(wrong))


def test_the_decode_stage_imports_nothing_of_the_ops():
    wrong = _imports_under(import_graph(), "decode", "ops")
    assert not wrong, ("recordtool.ops sits above the decode stage (an op is handed in compiled, "
                       "decode.backend.CompiledOp):\n" + "\n".join(wrong))


# ------------------------------------------------------- the checker itself, on made-up packages

def test_environment_checker_finds_each_form(tmp_path):
    forms = {"a.py": "import os\nx = os.environ.get('A')\n", "b.py": "import os\nx = os.getenv('B')\n",
             "c.py": "from os import environ\n", "d.py": "x = __import__('os').environ['D']\n",
             "e.py": "from os import *\n", "f.py": "import os\nx = dict(os.environ)\n"}
    clean = {"g.py": "import os\nx = os.path.join('a', 'environ')\ny = os.sysconf('SC_PAGE_SIZE')\n"}
    root = _tree(tmp_path, {**forms, **clean})
    assert all(environment_reads(root / name) for name in forms)
    assert environment_reads(root / "g.py") == []


def _tree(tmp_path, files: dict) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_checker_finds_lazy_and_relative_cycles(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "VERSION = 1\n",
        "a/__init__.py": "",
        "a/cpu.py": "def f():\n    from .ops import g\n",          # lazy, relative
        "a/ops.py": "from . import cpu\n",                              # module through `from . import`
        "b.py": "import pkg.c\n",
        "c.py": "try:\n    from .b import x\nexcept ImportError:\n    pass\n",
        "d.py": "from .a import cpu\nfrom . import _native\nfrom . import VERSION\n",  # _native: compiled
    })
    graph = import_graph(root, {"pkg._native"})
    assert graph["pkg.a.ops"] == {"pkg.a.cpu": 1} and graph["pkg.d"] == {"pkg.a": 1, "pkg.a.cpu": 1, "pkg": 3}
    found = sorted(tuple(c) for c in cycles(graph))
    assert found == [("pkg.a.cpu", "pkg.a.ops", "pkg.a.cpu"), ("pkg.b", "pkg.c", "pkg.b")]
    assert describe(graph, list(found[0])) == "pkg.a.cpu (line 2) -> pkg.a.ops (line 1) -> pkg.a.cpu"


def test_checker_follows_import_module(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "import importlib\ndef __getattr__(n):\n    return importlib.import_module('.x', __name__)\n",
        "x.py": "from . import y\n",
        "y.py": "import pkg\n",
        "p/__init__.py": "import importlib\ndef f(m):\n    return importlib.import_module(f'.{m}', __name__)\n",
        "p/q.py": "from .. import p\n",
    })
    graph = import_graph(root, set())
    assert set(graph["pkg.p"]) == {"pkg.p.q"}
    found = sorted(tuple(c) for c in cycles(graph))
    assert found == [("pkg", "pkg.x", "pkg.y", "pkg"), ("pkg.p", "pkg.p.q", "pkg.p")]
