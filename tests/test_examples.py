"""The scripts in examples/ run as the README shows them (on the CPU, with torchrun)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import xser
from helpers import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def test_distributed_example_runs_under_torchrun(tmp_path):
    pytest.importorskip("torch")
    path = str(tmp_path / "dist" / "model.yaml")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           os.path.join(ROOT, "examples", "distributed.py"), path]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"step 3 saved by 2 ranks in {path}.data; loaded back on every rank" in r.stdout
    assert [c.step for c in xser.checkpoints(path)] == [3, 2]
    (arrays,) = xser.read_params(path).values()  # one process reads every rank's rows and ids, no classes needed
    assert arrays["W"].shape == (1000, 16) and arrays["b"].shape == (16,)
    assert arrays["emb@id"].size > 0 and arrays["emb@embedding"].shape == (arrays["emb@id"].size, 16)
