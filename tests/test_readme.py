"""The README's tour runs as written (in a fresh interpreter, as a user would run it)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tour_runs(tmp_path):
    """The python blocks of the README, run in order against configs/toy.yaml, work."""
    import pytest

    pytest.importorskip("torch", reason="the tour has a PyTorch section")
    readme = Path(ROOT, "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) >= 4
    yaml_block = re.findall(r"```yaml\n(# configs/toy.yaml.*?)```", readme, re.S)[0]
    toy = Path(ROOT, "configs", "toy.yaml").read_text(encoding="utf-8")
    assert yaml_block.split("\n", 1)[1] in toy  # the README shows the shipped file
    os.makedirs(tmp_path / "configs")
    shutil.copy(os.path.join(ROOT, "configs", "toy.yaml"), tmp_path / "configs")
    from xser import demo

    demo.run(os.path.join(ROOT, "configs", "demo.yaml"), str(tmp_path / "out" / "demo"), say=lambda line: None)
    code = "\n".join(blocks) + (
        "\nassert again['model'].tied is again['model'].hidden"
        "\nnewest = xser.load('out/model.yaml')"
        "\nassert (newest['model'].hidden.W == exp['model'].hidden.W).all()"
        "\nassert [c.step for c in xser.checkpoints('out/model.yaml')] == [10, 9, 8]"
        "\nassert state == {'step': 10, 'lr': 0.1}"
        "\nassert rows.shape == (4, 4) and part.W.shape == (4, 4)"
        "\nassert xser.resume('out/run.yaml', checkpoint='best', metric='bleu').step == 4"
        "\nprint('tour ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "tour ok"
    assert (tmp_path / "out" / "model.yaml.data" / "manifest.json").exists()
