"""The class-free model view behind `xser inspect`, and `verify_model`."""

import os
from pathlib import Path

import numpy as np
import pytest

import xser
from components import Linear, Model
from helpers import edit_spec
from xser.tools.inspect import open_model, verify_model


def lines_of(path, checkpoint=0):
    view = open_model(path, checkpoint)
    try:
        return view.lines()
    finally:
        view.data.close()


def test_lines_list_refs_and_missing(tmp_path):
    """Shared components show as references; names in the spec without data are flagged."""
    enc = Linear(2, 3)
    path = tmp_path / "m.yaml"
    xser.save(Model(encoder=enc, decoder=enc), path)
    lines = lines_of(path)
    assert "    decoder -> encoder" in lines
    name = xser.params(enc).name
    edit_spec(path, lambda t: t.replace(name, "Linear.deadbeef"))
    lines = lines_of(path)
    assert f"  {name}  (not used by the spec)" in lines
    assert lines[-1] == "warning: named in the spec but missing on disk: Linear.deadbeef"
    with pytest.raises(xser.DataError) as info:
        verify_model(path)
    assert str(info.value) == (
        f"{path}.data: spec and data do not belong together: the spec names Linear.deadbeef, which the data lacks; "
        f"the data holds {name}, which the spec does not name"
    )


def test_unknown_tags_are_fine(tmp_path):
    """The view needs no component classes: unknown tags are shown as written."""
    path = tmp_path / "m.yaml"
    xser.save(Model(encoder=1), path)
    edit_spec(path, lambda t: t.replace("!TModel", "!SomethingNotRegistered"))
    assert "(root): !SomethingNotRegistered" in "\n".join(lines_of(path))


def test_long_metadata_is_shortened(tmp_path):
    """A huge training mapping (an imported model keeps its original spec there) is cut in the listing."""
    path = tmp_path / "m.yaml"
    xser.save(Model(encoder=1), path, training={"text": "x" * 1000})
    line = next(l for l in lines_of(path) if l.startswith("  training:"))
    assert line.endswith("... (1012 characters in the manifest)") and len(line) < 400


class TestSpecSource:
    def test_in_step(self, tmp_path):
        """After a save the top-level file equals the checkpoint's own spec."""
        path = tmp_path / "m.yaml"
        xser.save(Model(encoder=1), path)
        lines = lines_of(path)
        assert f"  spec: {path}.data/spec.yaml" in lines
        assert "  top-level spec: in step: the top-level spec file equals this checkpoint's spec" in lines

    def test_hand_edit_is_reported_and_not_used(self, tmp_path):
        """An edited top-level file is out of step: the view (and load) use the checkpoint's spec."""
        path = tmp_path / "m.yaml"
        xser.save(Model(encoder=1), path)
        path.write_text(path.read_text().replace("encoder: 1", "encoder: 2"))
        assert any(l.startswith("  top-level spec: out of step:") for l in lines_of(path))
        assert xser.load(path).encoder == 1
        xser.save(xser.load(path), path)  # the next save brings the file in step again
        assert "encoder: 1" in path.read_text()

    def test_missing_top_level_file(self, tmp_path):
        """Without the top-level file (a kill before it was written) the model still loads and says so."""
        path = tmp_path / "m.yaml"
        xser.save(Model(encoder=1), path)
        path.unlink()
        assert xser.load(path).encoder == 1
        assert any(l.startswith("  top-level spec: missing:") for l in lines_of(path))


def test_verify_every_checkpoint(tmp_path):
    """verify_model checks each checkpoint with its own spec; a damaged older one is named."""
    path = str(tmp_path / "m.yaml")
    lin = Linear(2, 3)
    with xser.CheckpointSaver(path, keep=3) as saver:
        for step in (1, 2, 3):
            lin.W[...] = step
            saver.save(lin, step=step)
    got = verify_model(path)
    assert [g.split(":")[0] for g in got] == ["checkpoint 0 (m.yaml.data)", "checkpoint 1 (m.yaml.data.1)", "checkpoint 2 (m.yaml.data.2)"]
    f = Path(path + ".data.2") / xser.params(lin).name / "W.npy"
    data = bytearray(f.read_bytes())
    os.unlink(f)  # files are shared by hard links between checkpoints: replace, never modify in place
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(xser.DataError, match=r"m.yaml.data.2/.*W.npy: checksum mismatch"):
        verify_model(path)


def test_verify_checks_training_state(tmp_path):
    """--verify reads the training-state files too."""
    path = str(tmp_path / "m.yaml")
    with xser.CheckpointSaver(path, keep=2) as saver:
        saver.save(Linear(2, 2), step=1, training_state={"m": np.arange(4.0)})
    f = Path(path + ".data/training_state/0.npy")
    data = bytearray(f.read_bytes())
    os.unlink(f)
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(xser.DataError, match=r"training_state/0.npy: checksum mismatch"):
        verify_model(path)


def test_an_unnamed_experiment_is_shown_as_such(tmp_path):
    """A model saved without an experiment name (name: null) is shown as '(no name)', never as None."""
    path = tmp_path / "m.yaml"
    xser.save(Linear(2, 3), path)
    assert "\nname: null\n" in path.read_text()
    lines = lines_of(path)
    assert lines[1] == "  experiment: (no name)"
    assert not any("None" in line for line in lines)
