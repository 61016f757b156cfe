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


def _mypy(path: Path) -> subprocess.CompletedProcess:
    import xser

    env = dict(os.environ)
    where = Path(xser.__file__).resolve().parent.parent
    if where.name != "site-packages":  # a source checkout (editable install): mypy does not follow import hooks
        env["MYPYPATH"] = str(where)
    return subprocess.run([sys.executable, "-m", "mypy", *FLAGS, str(path)], capture_output=True, text=True, cwd=path.parent,
                          check=False, env=env)


def test_py_typed_ships():
    import xser

    assert (Path(xser.__file__).parent / "py.typed").exists()
    assert '"xser" = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()


def test_readme_examples_pass_mypy_strict(tmp_path):
    pytest.importorskip("torch", reason="the README has a PyTorch section")
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    (tmp_path / "readme.py").write_text("\n".join(blocks))
    r = _mypy(tmp_path / "readme.py")
    assert r.returncode == 0, r.stdout + r.stderr


def test_constructors_are_checked(tmp_path):
    """dataclass_transform: mypy knows a component's constructor, so wrong calls are caught before running."""
    (tmp_path / "bad.py").write_text(
        "import numpy as np\nimport xser\n\n\n@xser.serializable\nclass Linear:\n    in_dim: int\n    out_dim: int = 2\n\n"
        "    def __attrs_post_init__(self) -> None:\n        self.W = xser.params(self).add('W', (self.out_dim, self.in_dim))\n\n\n"
        "@xser.serializable(tag='!Two')\nclass Two:\n    a: Linear\n\n\n"
        "shape: tuple[int, ...] = Linear(3).W.shape\nLinear('3')\nTwo(a=1)\n"
    )
    r = _mypy(tmp_path / "bad.py")
    assert r.returncode == 1
    errors = [line.split(": error: ")[1] for line in r.stdout.splitlines() if ": error: " in line]
    assert errors == [
        'Argument 1 to "Linear" has incompatible type "str"; expected "int"  [arg-type]',
        'Argument "a" to "Two" has incompatible type "int"; expected "Linear"  [arg-type]',
    ], r.stdout


def test_checkpoint_records_and_save_reports_are_typed(tmp_path):
    """Checkpoint.metrics/training/custom and SaveReport's removed records have precise types under --strict."""
    (tmp_path / "ck.py").write_text(
        "import xser\n\n"
        "c = xser.checkpoints('m.yaml')[0]\n"
        "r = xser.CheckpointSaver('m.yaml').save(object())\n"
        "reveal_type(c.metrics)\nreveal_type(c.training)\nreveal_type(c.custom)\nreveal_type(c.step)\n"
        "reveal_type(r.removed)\nreveal_type(r.removed_steps)\nreveal_type(r.removed_checkpoints)\n"
        "bleu: float = c.metrics['bleu'] + 1\n"
        "first: int = r.removed_steps[0] or 0\n"
        "bad: str = c.metrics['bleu']\n"
    )
    r = _mypy(tmp_path / "ck.py")
    notes = [line.split(": note: ")[1] for line in r.stdout.splitlines() if ": note: " in line]
    errors = [line.split(": error: ")[1] for line in r.stdout.splitlines() if ": error: " in line]
    assert notes == [
        'Revealed type is "dict[str, float]"',
        'Revealed type is "dict[str, Any]"',
        'Revealed type is "dict[str, Any]"',
        'Revealed type is "int | None"',
        'Revealed type is "tuple[str, ...]"',
        'Revealed type is "tuple[int | None, ...]"',
        'Revealed type is "tuple[xser.storage.listing.Checkpoint, ...]"',
    ], r.stdout
    assert errors == ['Incompatible types in assignment (expression has type "float", variable has type "str")  [assignment]'], r.stdout
