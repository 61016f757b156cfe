"""Type checkers see xser's API: py.typed ships, @serializable classes have typed constructors, the README passes mypy --strict."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
mypy = pytest.importorskip("mypy", reason="mypy is in the test extra")

FLAGS = ["--strict", "--follow-imports=silent", "--untyped-calls-exclude=torch", "--no-incremental", "--cache-dir", os.devnull]


#: each test's program, checked by ONE mypy run (a run costs ~20 s of analysing xser, numpy and torch; five ran it five times)
PROGRAMS: dict[str, str] = {}
#: programs that import torch, left out (and their tests skipped) where torch is not installed
NEEDS_TORCH = {"readme.py", "p.py"}


def program(name: str, text: str) -> str:
    PROGRAMS[name] = text
    return name


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict[str, list[str]]:
    """mypy --strict over every program at once: name -> its output lines (``line: kind: message``)."""
    import importlib.util

    import xser

    names = [n for n in PROGRAMS if n not in NEEDS_TORCH or importlib.util.find_spec("torch") is not None]
    where = tmp_path_factory.mktemp("mypy")
    for name in names:
        (where / name).write_text(PROGRAMS[name])
    env = dict(os.environ)
    root = Path(xser.__file__).resolve().parent.parent
    if root.name != "site-packages":  # a source checkout (editable install): mypy does not follow import hooks
        env["MYPYPATH"] = str(root)
    r = subprocess.run([sys.executable, "-m", "mypy", *FLAGS, *names], capture_output=True, text=True, cwd=where, check=False,
                       env=env)
    assert r.returncode in (0, 1) and not r.stderr, r.stdout + r.stderr
    out: dict[str, list[str]] = {n: [] for n in names}
    for line in r.stdout.splitlines():
        name, sep, rest = line.partition(":")
        if sep and name in out:
            out[name].append(rest)
    return out


def _kind(lines: list[str], kind: str) -> list[str]:
    return [line.split(f": {kind}: ")[1] for line in lines if f": {kind}: " in line]


def test_py_typed_ships():
    import xser

    assert (Path(xser.__file__).parent / "py.typed").exists()
    assert '"xser" = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()


README = program("readme.py", "\n".join(re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)))


def test_readme_examples_pass_mypy_strict(checked):
    pytest.importorskip("torch", reason="the README has a PyTorch section")
    assert checked[README] == []


BAD = program(
    "bad.py",
    "import numpy as np\nimport xser\n\n\n@xser.serializable\nclass Linear:\n    in_dim: int\n    out_dim: int = 2\n\n"
    "    def __attrs_post_init__(self) -> None:\n        self.W = xser.params(self).add('W', (self.out_dim, self.in_dim))\n\n\n"
    "@xser.serializable(tag='!Two')\nclass Two:\n    a: Linear\n\n\n"
    "shape: tuple[int, ...] = Linear(3).W.shape\nLinear('3')\nTwo(a=1)\n",
)


def test_constructors_are_checked(checked):
    """dataclass_transform: mypy knows a component's constructor, so wrong calls are caught before running."""
    errors = _kind(checked[BAD], "error")
    assert errors == [
        'Argument 1 to "Linear" has incompatible type "str"; expected "int"  [arg-type]',
        'Argument "a" to "Two" has incompatible type "int"; expected "Linear"  [arg-type]',
    ], checked[BAD]


CK = program(
    "ck.py",
    "import xser\n\n"
    "c = xser.checkpoints('m.yaml')[0]\n"
    "r = xser.CheckpointSaver('m.yaml').save(object())\n"
    "reveal_type(c.metrics)\nreveal_type(c.training)\nreveal_type(c.custom)\nreveal_type(c.step)\n"
    "reveal_type(r.removed)\nreveal_type(r.removed_steps)\nreveal_type(r.removed_checkpoints)\n"
    "bleu: float = c.metrics['bleu'] + 1\n"
    "first: int = r.removed_steps[0] or 0\n"
    "bad: str = c.metrics['bleu']\n",
)


def test_checkpoint_records_and_save_reports_are_typed(checked):
    """Checkpoint.metrics/training/custom and SaveReport's removed records have precise types under --strict."""
    notes, errors = _kind(checked[CK], "note"), _kind(checked[CK], "error")
    assert notes == [
        'Revealed type is "dict[str, float]"',
        'Revealed type is "dict[str, Any]"',
        'Revealed type is "dict[str, Any]"',
        'Revealed type is "int | None"',
        'Revealed type is "tuple[str, ...]"',
        'Revealed type is "tuple[int | None, ...]"',
        'Revealed type is "tuple[xser.storage.scanned.Checkpoint, ...]"',
    ], checked[CK]
    assert errors == ['Incompatible types in assignment (expression has type "float", variable has type "str")  [assignment]'], checked[CK]


P = program(
    "p.py",
    "import numpy as np\nimport numpy.typing as npt\nimport torch\nimport xser\n\n\n"
    "@xser.serializable\nclass Lin:\n    n: int\n\n"
    "    def __attrs_post_init__(self) -> None:\n"
    "        p = xser.params(self)\n"
    "        self.W: npt.NDArray[np.float32] = p.add('W', (self.n, 2))\n"
    "        self.b: npt.NDArray[np.float64] = p.add('b', 2, dtype=np.float64)\n"
    "        self.c: npt.NDArray[np.int64] = p.add('c', [2], dtype='int64', init='zeros', trainable=False)\n"
    "        self.d: npt.NDArray[np.int8] = p.add('d', 2, dtype=np.dtype(np.int8))\n"
    "        self.e: npt.NDArray[np.uint8] = p.add('e', 2, dtype='bfloat16')\n"
    "        self.f: npt.NDArray[np.float64] = p.add('f', 2)\n"
    "        self.g: npt.NDArray[np.float32] = p.add('g', 2, dtype='int32')\n"
    "        self.s: xser.Subcollection = p\n"
    "        p.add('h', 2, trainabel=False)\n\n\n"
    "@xser.serializable\nclass Net(torch.nn.Module):\n    dim: int = 3\n\n"
    "    def __attrs_post_init__(self) -> None:\n"
    "        p = xser.params(self)\n"
    "        self.gate: torch.Tensor = p.add('gate', (self.dim,), init='ones')\n"
    "        self.count: torch.Tensor = p.add('count', (), dtype=torch.int64, trainable=False)\n"
    "        self.again: torch.Tensor = p['gate']\n"
    "        self.wrong: npt.NDArray[np.float32] = p.add('wrong', 2)\n",
)


def test_params_add_is_typed(checked):
    """params().add gives a numpy array whose dtype mypy --strict knows (default float32, dtype= a numpy type, a dtype
    or a name), and a torch.Tensor in a torch component; a wrong use is an error, not Any."""
    pytest.importorskip("torch", reason="the torch half needs torch")
    errors = _kind(checked[P], "error")
    lines = [int(line.split(":")[0]) for line in checked[P] if ": error: " in line]
    # the numpy names of the types differ between numpy versions (floating[_32Bit] or float32): the lines and kinds are exact
    assert lines == [18, 19, 21, 21, 33], checked[P]
    assert errors[0].startswith("Incompatible types in assignment") and "float64" in errors[0].split("variable has type")[1]
    assert errors[1].startswith("Incompatible types in assignment") and "signedinteger" in errors[1].split("variable")[0]
    assert errors[2].startswith('Unexpected keyword argument "trainabel" for overloaded function "add" of "Subcollection"')
    assert errors[3].startswith('No overload variant of "add" of "Subcollection" matches argument types')
    assert errors[4].startswith('Incompatible types in assignment (expression has type "Tensor", variable has type "ndarray')


EXPORTS = program(
    "use.py",
    "import xser\nfrom xser.interop.recis import export_recis\nfrom xser.interop.safetensors import export_safetensors\n\n"
    'export_safetensors("m.yaml", "hf", checkpoint="best", metric="acc", mode="min")\n'
    'export_safetensors("m.yaml", "hf", checkpoint=xser.Best("acc"), path="model.lm")\n'
    'export_recis("m.yaml", "r", checkpoint="last")\nexport_safetensors("m.yaml", "hf", checkpoint=1.5)\n',
)


def test_export_checkpoint_selection_is_typed(checked):
    """export_safetensors/export_recis take checkpoint=int | "last" | "best" | xser.Best, and nothing else."""
    assert _kind(checked[EXPORTS], "error") == [
        'Argument "checkpoint" to "export_safetensors" has incompatible type "float"; expected "int | str | Best"  [arg-type]'
    ], checked[EXPORTS]
