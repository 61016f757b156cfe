"""Crash consistency of exports with --force: a kill immediately before each filesystem-changing call of every exporter
(safetensors, RecIS, Angel, DiSMEC++, XNMT), then the same export again (``export_crash_child.py``).

Every output path holds exactly its old or exactly its new content after every kill (an atomic exchange puts each in
place), and the next export removes what the killed one left beside it (``OUT.tmp-*``, ``OUT.old-*``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from xser.storage.replace import output_leftovers, put_in_place, replaced_output

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "export_crash_child.py")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("exporter", ["safetensors", "recis", "angel", "dismec", "xnmt"])
def test_kill_before_every_call(tmp_path, exporter):
    proc = subprocess.run([sys.executable, CHILD, exporter, str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["problems"] == []
    assert report["kills"] == report["calls"] and report["calls"] >= 6, report


def test_leftovers_of_running_exports_are_left_alone(tmp_path):
    """Only a dead process's temporaries are removed: another export to the same name, still running, keeps its own."""
    out = tmp_path / "hf"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    for name in (f"hf.tmp-{dead}-0a1b2c3d", f"hf.old-{dead}-0a1b2c3d", "hf.tmp-0a1b2c3d", f"hf.tmp-{os.getpid()}-00ff00ff",
                 f"hf.tmp-1-00ff00ff", "hfx.tmp-5-00000000", "hf.tmpfile"):
        (tmp_path / name).mkdir()
    assert output_leftovers(str(out)) == sorted(str(tmp_path / n) for n in (f"hf.old-{dead}-0a1b2c3d", f"hf.tmp-{dead}-0a1b2c3d",
                                                                           "hf.tmp-0a1b2c3d"))
    with replaced_output(str(out)) as staging:
        (tmp_path / os.path.basename(staging) / "model.safetensors").write_bytes(b"new")
    assert sorted(os.listdir(tmp_path)) == sorted(["hf", f"hf.tmp-{os.getpid()}-00ff00ff", "hf.tmp-1-00ff00ff", "hfx.tmp-5-00000000",
                                                   "hf.tmpfile"])


@pytest.mark.parametrize("old_is_dir, new_is_dir", [(True, True), (False, False), (True, False), (False, True)])
def test_put_in_place_replaces_any_kind(tmp_path, old_is_dir, new_is_dir, monkeypatch):
    """With and without an atomic exchange, a file or directory replaces a file or directory, and nothing is left."""
    from xser.storage.disk import commit

    for exchange in (True, False):
        if not exchange:
            monkeypatch.setattr(commit, "exchange", lambda a, b: False)
        d = tmp_path / f"{exchange}"
        d.mkdir()
        out, new = d / "out", d / "new"
        for path, is_dir, text in ((out, old_is_dir, b"old"), (new, new_is_dir, b"new")):
            if is_dir:
                path.mkdir()
                (path / "f").write_bytes(text)
            else:
                path.write_bytes(text)
        put_in_place(str(new), str(out))
        assert sorted(os.listdir(d)) == ["out"]
        assert ((out / "f") if new_is_dir else out).read_bytes() == b"new"


def test_a_failed_export_leaves_the_old_output(tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"old")
    with pytest.raises(RuntimeError), replaced_output(str(out)) as staging:
        (tmp_path / os.path.basename(staging) / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")
    assert os.listdir(tmp_path) == ["hf"] and (out / "model.safetensors").read_bytes() == b"old"
