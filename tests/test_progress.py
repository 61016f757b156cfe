"""Progress bars: shown for long operations on a terminal (XSER_PROGRESS=1 here), never imported by `import xser`."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

import xser
from components import Linear
from xser.cli import main
from xser.storage import progress


def test_import_xser_does_not_import_tqdm():
    code = "import sys, xser; print('tqdm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def _bars(err: str) -> set[str]:
    return {line.split(":")[0].strip() for line in err.replace("\r", "\n").splitlines() if "B/s" in line or "|" in line}


def test_bars_for_save_load_avg_convert_export(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XSER_PROGRESS", "1")
    lin = Linear(300, 200)
    with xser.CheckpointSaver(tmp_path / "m.yaml") as saver:
        for step in (1, 2):
            lin.W[...] = step
            saver.save(lin, step=step)
    assert "saving" in _bars(capsys.readouterr().err)
    xser.load(tmp_path / "m.yaml")
    assert "loading" in _bars(capsys.readouterr().err)
    assert main(["avg", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "a.yaml")]) == 0
    assert _bars(capsys.readouterr().err) == {"averaging"}  # one bar: the write inside reports to it
    assert main(["convert", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "c.yaml")]) == 0
    assert "saving" in _bars(capsys.readouterr().err)
    assert main(["export", "safetensors", str(tmp_path / "m.yaml"), str(tmp_path / "hf")]) == 0
    assert "exporting" in _bars(capsys.readouterr().err)


def test_no_bar_off_a_terminal_or_when_small(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("XSER_PROGRESS", raising=False)
    xser.save(Linear(300, 200), tmp_path / "m.yaml")  # stderr is captured: not a terminal
    monkeypatch.setenv("XSER_PROGRESS", "0")
    xser.save(Linear(300, 200), tmp_path / "n.yaml")
    assert _bars(capsys.readouterr().err) == set()
    assert progress.MIN_BYTES == 256 << 20


def test_nested_operations_report_to_the_outer_bar(monkeypatch):
    monkeypatch.setenv("XSER_PROGRESS", "1")
    seen = []
    monkeypatch.setattr(progress, "_current", [])
    with progress.progress(100, "outer"):
        progress._current.append(seen.append)
        with progress.progress(50, "inner"):
            progress.advance(7)
        progress.advance(3)
        progress._current.remove(seen.append)
    assert seen == [7, 3] and np.all(np.array(seen) > 0)


def test_bars_for_every_export(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XSER_PROGRESS", "1")
    lin = Linear(300, 200)
    xser.save(lin, tmp_path / "m.yaml")
    sub = xser.params(lin).name
    capsys.readouterr()
    for args in (["angel", str(tmp_path / "m.yaml"), f"{sub}/W", str(tmp_path / "ang")],
                 ["dismec", str(tmp_path / "m.yaml"), f"{sub}/W", str(tmp_path / "d" / "meta.json")],
                 ["recis", str(tmp_path / "m.yaml"), str(tmp_path / "recis")]):
        assert main(["export", *args]) == 0
        assert "exporting" in _bars(capsys.readouterr().err), args[0]


def test_a_failed_operation_leaves_no_bar_state(tmp_path, monkeypatch):
    monkeypatch.setenv("XSER_PROGRESS", "1")
    try:
        with progress.progress(10, "x"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert progress._depth == 0 and progress._current == []
