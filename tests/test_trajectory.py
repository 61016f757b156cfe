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


def test_each_metric_has_its_own_axis(tmp_path):
    """A loss and an accuracy never share a y axis: one panel per metric, then the distances; the x axis is shared."""
    pytest.importorskip("matplotlib", reason="plots need the plot extra")
    path, kept = _run(tmp_path, steps=4)
    report = tr.trajectory(path)
    fig = tr.figure(report)
    axes = fig.get_axes()
    assert [a.get_ylabel() for a in axes] == ["dev", "loss", "relative L2 distance\nto the newest checkpoint"]
    for ax, values in zip(axes, ([1.0, 1 / 2, 1 / 3, 1 / 4], [1.0, 2.0, 3.0, 4.0])):
        (line,) = ax.get_lines()
        assert list(line.get_xdata()) == [10, 20, 30, 40] and list(line.get_ydata()) == values
    (line,) = axes[2].get_lines()
    assert list(line.get_ydata()) == [r["distance_to_newest"] for r in reversed(report["checkpoints"])]
    assert axes[2].get_xlabel() == "step" and all(axes[0].get_shared_x_axes().joined(axes[0], a) for a in axes)


@pytest.mark.parametrize("metrics", [0, 1, 5])
def test_any_number_of_metrics(tmp_path, metrics):
    """No metric, one, or many: one panel each, plus the distances; the file is written."""
    pytest.importorskip("matplotlib", reason="plots need the plot extra")
    lin = Linear(2, 2)
    with xser.CheckpointSaver(tmp_path / "m.yaml", keep=3) as saver:
        for step in (1, 2):
            lin.W[...] = step
            saver.save(lin, step=step, metrics={f"m{i}": float(step * i) for i in range(metrics)} or None)
    report = tr.trajectory(tmp_path / "m.yaml")
    assert len(tr.figure(report).get_axes()) == metrics + 1
    assert tr.plot(report, tmp_path / "p.svg") == str(tmp_path / "p.svg") and (tmp_path / "p.svg").read_text().startswith("<?xml")


def test_plotting_leaves_pyplot_alone(tmp_path):
    """figure() uses no pyplot: the caller's backend and open figures are untouched."""
    pytest.importorskip("matplotlib", reason="plots need the plot extra")
    import matplotlib
    import matplotlib.pyplot as plt

    backend = matplotlib.get_backend()
    matplotlib.use("svg")  # a caller's own (non-interactive here) backend
    try:
        mine = plt.figure()
        path, _ = _run(tmp_path, steps=2)
        tr.plot(tr.trajectory(path), tmp_path / "p.png")
        assert matplotlib.get_backend() == "svg" and plt.get_fignums() == [mine.number]
        assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        plt.close("all")
        matplotlib.use(backend)
