"""The package's layers: imports point one way along the table in docs/design.md, and nothing forms a cycle.

Every module is parsed (imports inside functions included); no third-party tool is needed.
"""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "xser")

#: (layer, rank, module prefixes), bottom to top; the same table is in docs/design.md.
LAYERS = [
    ("errors", 0, ("xser.errors", "xser._version")),
    ("dist", 0.5, ("xser.dist",)),
    ("storage", 1, ("xser.storage",)),
    ("spec", 2, ("xser.spec",)),
    ("model", 3, ("xser.model",)),
    ("checkpoints", 4, ("xser.checkpoints",)),
    ("api", 5, ("xser.api",)),
    ("tools", 6, ("xser.tools",)),
    ("interop", 6, ("xser.interop",)),
    ("torch", 6, ("xser.torch",)),
    ("lightning", 6.2, ("xser.lightning",)),  # builds on xser.torch: above it, below the package
    ("cli", 7, ("xser.cli", "xser._cli_options", "xser.demo", "xser.__main__")),
]


def source(file: str) -> str:
    with open(file, encoding="utf-8") as f:
        return f.read()


def modules() -> dict[str, str]:
    """Module name -> file, for every .py under xser/."""
    out = {}
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(d, f)
    return out


MODULES = modules()


def layer_of(name: str) -> tuple[str, int]:
    if name == "xser":
        return "package", 6.5  # xser/__init__.py, the public face: above tools and interop, below the CLI
    for layer, rank, prefixes in LAYERS:
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return layer, rank
    raise AssertionError(f"module {name} is in no layer of the table")


def imports_of(name: str) -> set[str]:
    """The xser modules ``name`` imports, anywhere in its body."""
    file = MODULES[name]
    package = name if file.endswith("__init__.py") else name.rpartition(".")[0]
    tree = ast.parse(source(file), file)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "xser"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "xser":
                continue
            for a in node.names:  # `from . import typecheck` imports a module, `from . import x` an attribute
                out.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod)
    return {m for m in out if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name):
    """A module imports only from its own layer or the layers below it (tools and interop not from each other)."""
    layer, rank = layer_of(name)
    bad = []
    for target in sorted(GRAPH[name]):
        t_layer, t_rank = layer_of(target)
        if t_rank > rank or (t_rank == rank and t_layer != layer and layer != "package"):
            bad.append(f"{target} ({t_layer})")
    assert not bad, f"{name} ({layer}) imports upward: {', '.join(bad)}"


def test_no_cycles():
    """No import cycle, counting imports inside functions."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(GRAPH[n]):
            if state.get(m) == 1:
                cycles.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(GRAPH):
        if n not in state:
            visit(n)
    assert cycles == []


_LAZY_CHILD = """
import sys, xser
eager = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "ruamel", "fsspec")
               or m.startswith(("xser.interop", "xser.tools", "xser.cli", "xser.api", "xser.model", "xser.storage")))
assert eager == [], f"import xser imported {eager}"
with open(sys.argv[1], "w") as f:
    f.write("exp: !Ensemble\\n  members:\\n  - !AngelMatrix {name: a, rows: 2, cols: 3}\\n"
            "  - !DismecModel {num_labels: 2, num_features: 3}\\n  - !RecisModel {tables: {}, dense: {}}\\n"
            "  - !SafetensorsWeights {tensors: {w: [float32, [2]]}}\\n")
model = xser.build(xser.load_config(sys.argv[1])["exp"])
print(type(model).__name__, [type(m).__name__ for m in model.members], model.members[0].values.shape)
import xser.cli, xser.tools.average, xser.interop
assert "torch" not in sys.modules, "torch imported"
"""


def test_import_xser_is_lazy(tmp_path):
    """``import xser`` imports no submodule (each public name on first use) and never torch, ruamel or fsspec; a spec
    naming the interop components (and ``!Ensemble``) builds in a fresh interpreter all the same (their modules load
    when the spec names their tags); the CLI and the tools never import torch either."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _LAZY_CHILD, str(tmp_path / "c.yaml")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "Ensemble ['AngelMatrix', 'DismecModel', 'RecisModel', 'SafetensorsWeights'] (2, 3)"


def test_modules_are_small():
    """Modules of one job: none is much over 400 lines."""
    big = {n: source(f).count("\n") for n, f in MODULES.items()}
    assert {n: k for n, k in big.items() if k > 450} == {}


def test_every_folder_says_what_it_may_import():
    """Each package's docstring names what it may import."""
    for name, file in MODULES.items():
        if file.endswith("__init__.py") and name not in ("xser", "xser.storage.formats"):
            doc = ast.get_docstring(ast.parse(source(file))) or ""
            assert "import" in doc.lower(), name


#: calls that open, rename, list, stat or remove files (``os.<name>``, ``os.path.<name>``, ``shutil``/``tempfile``, ``open``)
_FILE_OS = {"open", "rename", "replace", "listdir", "scandir", "walk", "unlink", "remove", "mkdir", "makedirs", "rmdir",
            "link", "symlink", "stat", "lstat", "fsync", "chmod", "truncate", "utime"}
_FILE_PATH = {"exists", "lexists", "isfile", "isdir", "getsize", "islink", "samefile"}
#: the exceptions, each with its reason (none: every module above storage reaches files through a store)
_FILE_OPS_ALLOWED: dict[tuple[str, str], str] = {}


def file_calls(name: str, file: str) -> list[str]:
    """``module:line: call`` for every call in ``file`` that touches files directly."""
    found = []
    for node in ast.walk(ast.parse(source(file))):
        if not isinstance(node, ast.Call):
            continue
        fn, call = node.func, None
        if isinstance(fn, ast.Name) and fn.id == "open":
            call = "open"
        elif isinstance(fn, ast.Attribute):
            v = fn.value
            if isinstance(v, ast.Name) and v.id == "os" and fn.attr in _FILE_OS:
                call = f"os.{fn.attr}"
            elif isinstance(v, ast.Name) and v.id in ("shutil", "tempfile"):
                call = f"{v.id}.{fn.attr}"
            elif (isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "os" and v.attr == "path"
                  and fn.attr in _FILE_PATH):
                call = f"os.path.{fn.attr}"
        if call is not None and (name, call) not in _FILE_OPS_ALLOWED:
            found.append(f"{name}:{node.lineno}: {call}")
    return found


def test_only_the_storage_layer_touches_files():
    """Every byte xser reads or writes goes through xser/storage (a store chosen by the path): no module above it
    opens, renames, lists, stats or removes files itself (issue 21; docs/design.md, "The storage layer's shape")."""
    found = [hit for n, f in sorted(MODULES.items()) if not n.startswith("xser.storage") for hit in file_calls(n, f)]
    assert found == []
