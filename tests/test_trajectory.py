"""xser inspect --json / --plot: metrics over steps and each checkpoint's distance to the newest, streamed."""

from __future__ import annotations

import json
import math
import tracemalloc

import numpy as np
import pytest

import xser
import xser.tools.trajectory as tr
from components import Linear
from xser.cli import main


def _run(tmp_path, steps=4, size=(2, 3)):
    rng = np.random.default_rng(0)
    lin = Linear(size[1], size[0])
    kept = []
    with xser.CheckpointSaver(tmp_path / "m.yaml", keep=steps) as saver:
        for step in range(1, steps + 1):
            lin.W[...] = rng.standard_normal(lin.W.shape)
            lin.b[...] = step
            kept.append((lin.W.copy(), lin.b.copy()))
            saver.save(lin, step=step * 10, metrics={"dev": 1.0 / step, "loss": float(step)})
    return tmp_path / "m.yaml", kept[::-1]  # newest first


def test_report_matches_a_direct_computation(tmp_path):
    path, kept = _run(tmp_path)
    report = tr.trajectory(path)
    w0 = np.concatenate([a.astype(np.float64).ravel() for a in kept[0]])
    for row, arrays in zip(report["checkpoints"], kept):
        wk = np.concatenate([a.astype(np.float64).ravel() for a in arrays])
        assert math.isclose(row["distance_to_newest"], np.linalg.norm(wk - w0) / np.linalg.norm(w0), rel_tol=1e-12)
    assert [r["step"] for r in report["checkpoints"]] == [40, 30, 20, 10]
    assert report["metrics"] == ["dev", "loss"] and report["checkpoints"][0]["distance_to_newest"] == 0.0


def test_distances_are_streamed(tmp_path, monkeypatch):
    path, _ = _run(tmp_path, steps=2, size=(1000, 1000))  # 4 MB per checkpoint
    monkeypatch.setattr(tr, "CHUNK", 1 << 14)
    tracemalloc.start()
    tr.trajectory(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2 << 20  # pieces of 16k elements, not whole parameters


def test_cli_json(tmp_path, capsys):
    path, _ = _run(tmp_path, steps=2)
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["directory"] for r in report["checkpoints"]] == ["m.yaml.data", "m.yaml.data.1"]
    assert report["checkpoints"][1]["metrics"] == {"dev": 1.0, "loss": 1.0}


def test_cli_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="plots need the plot extra")
    path, _ = _run(tmp_path, steps=3)
    assert main(["inspect", str(path), "--plot", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'p.png'}")
