"""Untrusted model files: loading one reads only its own files, runs no code, and fails cleanly.

The threat model is in docs/security.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import xser
from components import Linear, Model
from helpers import edit_spec


@pytest.fixture
def saved(tmp_path):
    path = str(tmp_path / "m.yaml")
    lin = Linear(2, 3)
    xser.save(Model(encoder=lin), path)
    return path, lin


class TestNoOtherFiles:
    def test_load_serialized_in_a_saved_spec_is_refused(self, saved, tmp_path):
        """A downloaded model cannot make load read another model: !LoadSerialized in a saved spec is a SpecError with its line."""
        path, _ = saved
        victim = str(tmp_path / "victim.yaml")
        xser.save(Linear(5, 5), victim)
        spec = edit_spec(path, lambda t: t.replace("decoder: null", f"decoder: !LoadSerialized {{filename: {victim}}}"))
        with pytest.raises(xser.SpecError) as info:
            xser.load(path)
        assert str(info.value).startswith(f"{spec}:6:12: ")
        assert str(info.value).endswith(
            "!LoadSerialized is not allowed in a saved model: a saved spec holds only components and values, "
            "and loading it never reads another file"
        )

    def test_load_serialized_inside_a_loaded_model_is_refused(self, saved, tmp_path):
        """A config may load a saved model; that saved model may not pull in a third one."""
        path, _ = saved
        edit_spec(path, lambda t: t.replace("decoder: null", "decoder: !LoadSerialized {filename: /dev/zero}"))
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"e:\n  model: !LoadSerialized {{filename: {path}}}\n")
        with pytest.raises(xser.SpecError, match="!LoadSerialized is not allowed in a saved model"):
            xser.build(xser.load_config(cfg)["e"])

    def test_placeholders_are_values_in_saved_specs(self, saved):
        """A saved spec is never substituted: '{EXP_DIR}' there is the string it says."""
        path, _ = saved
        edit_spec(path, lambda t: t.replace("name: null", "name: '{EXP_DIR}'", 1) if "name: null" in t else t)
        xser.load(path)  # nothing is expanded, nothing read

    def test_opened_files_stay_in_the_directory(self, saved, monkeypatch):
        """Loading opens nothing outside the model's own files (its spec and its data directory)."""
        path, _ = saved
        opened = []
        real = os.open

        def record(p, *a, **kw):
            if kw.get("dir_fd") is None:
                opened.append(os.path.abspath(p))
            return real(p, *a, **kw)

        monkeypatch.setattr(os, "open", record)
        xser.load(path)
        here = os.path.dirname(os.path.abspath(path))
        assert opened and all(p.startswith(here + os.sep + "m.yaml") or p.startswith("/proc/") for p in opened), opened


class TestSpecialFiles:
    def test_fifo_is_refused_not_waited_for(self, saved):
        """A FIFO in place of a data file is refused at once (opening it must not wait for a writer)."""
        path, lin = saved
        f = Path(path + ".data") / xser.params(lin).name / "W.npy"
        f.unlink()
        os.mkfifo(f)
        with pytest.raises(xser.DataError, match="is not a regular file"):
            xser.load(path)

    def test_manifest_link_to_dev_zero(self, saved):
        """manifest.json linked to /dev/zero is refused (no link is followed, and a size cap applies)."""
        path, _ = saved
        m = Path(path + ".data") / "manifest.json"
        m.unlink()
        m.symlink_to("/dev/zero")
        with pytest.raises(xser.DataError, match="manifest.json is a symbolic link"):
            xser.load(path)

    def test_spec_file_that_is_a_device(self, tmp_path):
        """A spec path naming a device or FIFO is refused without reading it."""
        with pytest.raises(xser.SpecError, match="not a regular file"):
            xser.load_config("/dev/zero")
        fifo = tmp_path / "c.yaml"
        os.mkfifo(fifo)
        with pytest.raises(xser.SpecError, match="not a regular file"):
            xser.load_config(fifo)


class TestForgedSizes:
    def test_deep_nesting(self, tmp_path):
        """330 levels of nesting are a SpecError, not a RecursionError."""
        p = tmp_path / "c.yaml"
        p.write_text("e:\n  a: " + "[" * 330 + "]" * 330 + "\n")
        with pytest.raises(xser.SpecError, match="nested more than 200 levels deep"):
            xser.load_config(p)

    def test_shape_whose_byte_count_wraps_int64(self, saved):
        """A shape whose bytes overflow 64 bits is caught by the size checks (no allocation, no wrap)."""
        path, lin = saved
        name = xser.params(lin).name
        mp = Path(path + ".data") / "manifest.json"
        m = json.loads(mp.read_text())
        m["subcollections"][name]["W"]["shape"] = [2**40, 2**40]
        mp.write_text(json.dumps(m))
        with pytest.raises(xser.DataError, match="shape|header"):
            xser.read_params(path)
        with pytest.raises(xser.DataError):
            xser.load(path, mmap=True)

    def test_partial_finalize_keeps_the_experiment_name(self, tmp_path):
        """PartialSaver.finalize saves the experiment under its own name, not a parameter's."""
        cfg = tmp_path / "c.yaml"
        cfg.write_text("exp1:\n  model: !TLinear {in_dim: 2, out_dim: 4}\n")
        exp = xser.build(xser.load_config(cfg)["exp1"])
        path = str(tmp_path / "m.yaml")
        ps = xser.PartialSaver(path, exp)
        name = xser.params(exp["model"]).name
        ps.write_rows(f"{name}/W", 0, np.ones((4, 2), np.float32))
        ps.finalize()
        assert list(xser.load_config(path)) == ["exp1"]


def test_dismec_metadata_with_an_infinite_count(tmp_path):
    """Found by the long fuzz run: a count of 1e3082 (infinity in JSON) is a DataError, not an OverflowError."""
    import shutil

    from xser.interop.dismec import import_dismec

    src = tmp_path / "in"
    shutil.copytree(Path(__file__).parent / "data" / "dismec" / "DenseTXT", src)
    meta = src / "model.json"
    meta.write_text(meta.read_text().replace('"count": 2', '"count": 1e3082'))
    with pytest.raises(xser.DataError, match="files.0: 'count' must be an int, got inf"):
        import_dismec(meta, tmp_path / "out.yaml")
