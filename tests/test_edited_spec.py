"""A saved model's top-level file edited by hand (the XNMT habit): load builds it, says so, and keeps it."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xser
from components import Leaf, Linear, Model
from xser.errors import did_you_mean
from xser.tools.inspect import open_model

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

#: the warning and the errors, exactly (P: the model's path, S: the spec saved with the checkpoint, D: its data directory)
WARNING = "{P}: edited since checkpoint {D} was saved; the edited file is used, not the checkpoint's own spec.yaml ({DIFF})"
DIFF = "first difference, line {line}: {here!r} in {P}, {there!r} in {S}"
MISMATCH = ("{P}:{at}: {D}/{sub}: {what}; {P} was edited since this checkpoint was saved and no longer matches its data: "
            "undo the edit (the spec saved with the data is {S})")
KEPT = ("{P} was edited by hand since the last save and this save replaces it with the spec of the object saved; the "
        "edited file is kept as {K} (first difference, line {line}: {here!r} in {K}, {there!r} in {S}). To use an edit, "
        "load the edited file and save that object")


def saved(tmp_path, **kw):
    m = Model(encoder=Linear(2, 3), decoder=Linear(3, 2), **kw)
    path = str(tmp_path / "m.yaml")
    xser.save(m, path)
    return m, path


def text_of(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def edit(path, old, new):
    text = text_of(path)
    assert text.count(old) == 1
    with open(path, "w") as f:
        f.write(text.replace(old, new))


def names(path, **extra):
    return {"P": path, "S": path + ".data/spec.yaml", "D": path + ".data", **extra}


class TestLoadBuildsTheEdit:
    def test_a_setting_edited_by_hand_is_used_with_one_warning(self, tmp_path, caplog):
        m, path = saved(tmp_path)
        edit(path, "dropout: 0.1", "dropout: 0.5  # sharper")
        with caplog.at_level("WARNING", logger="xser"):
            again = xser.load(path)
        assert again.dropout == 0.5 and np.array_equal(again.encoder.W, m.encoder.W)
        diff = DIFF.format(line=7, here="  dropout: 0.5  # sharper", there="  dropout: 0.1", **names(path))
        assert caplog.messages == [WARNING.format(DIFF=diff, **names(path))]

    def test_unedited_file_gives_no_warning(self, tmp_path, caplog):
        _, path = saved(tmp_path)
        with caplog.at_level("WARNING", logger="xser"):
            assert xser.load(path).dropout == 0.1
        assert caplog.messages == []

    @pytest.mark.parametrize("api", ["load_config", "resume", "load_into"])
    def test_every_reader_of_the_spec_uses_the_edit(self, tmp_path, api):
        m, path = saved(tmp_path)
        edit(path, "dropout: 0.1", "dropout: 0.25")
        if api == "load_config":
            (exp,) = xser.load_config(path).values()
            assert xser.build(exp).dropout == 0.25
        elif api == "resume":
            assert xser.resume(path).model.dropout == 0.25
        else:  # load_into fills an object by the edited spec's subcollection names
            edit(path, "dropout: 0.25", "dropout: 0.3")
            target = Model(encoder=Linear(2, 3), decoder=Linear(3, 2))
            xser.load_into(target, path)
            assert np.array_equal(target.decoder.W, m.decoder.W)

    def test_lines_lost_at_the_end_are_the_first_difference(self, tmp_path, caplog):
        _, path = saved(tmp_path)
        edit(path, "  name: null\n", "")
        with caplog.at_level("WARNING", logger="xser"):
            xser.load(path)
        diff = DIFF.format(line=10, here=None, there="  name: null", **names(path)).replace("None in", "the end of the file in")
        assert caplog.messages == [WARNING.format(DIFF=diff, **names(path))]


class TestEditThatNoLongerMatches:
    def test_shape(self, tmp_path):
        m, path = saved(tmp_path)
        edit(path, "encoder: !TLinear {in_dim: 2, out_dim: 3", "encoder: !TLinear {in_dim: 2, out_dim: 6")
        with pytest.raises(xser.SpecError) as info:
            xser.load(path)
        sub = xser.params(m.encoder).name
        assert str(info.value) == MISMATCH.format(at="5:12: encoder", sub=sub, what="param 'W': shape (6, 2) in spec, (3, 2) on disk",
                                                  **names(path))

    def test_subcollection_name(self, tmp_path):
        m, path = saved(tmp_path)
        sub = xser.params(m.decoder).name
        edit(path, sub, "Linear.0000beef")
        with pytest.raises(xser.SpecError) as info:
            xser.load(path)
        assert str(info.value) == MISMATCH.format(
            at="6:12: decoder", sub="Linear.0000beef",
            what="subcollection is missing from the data directory" + did_you_mean("Linear.0000beef", os.listdir(path + ".data")),
            **names(path))

    def test_dtype(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        leaf = Leaf({"x": ["<f4", [3]]})
        xser.save(leaf, path)
        edit(path, "<f4", "<f8")
        with pytest.raises(xser.SpecError) as info:
            xser.load(path)
        sub = xser.params(leaf).name
        assert str(info.value) == MISMATCH.format(at="4:13", sub=sub, what="param 'x': dtype float64 in spec, float32 on disk", **names(path))

    def test_component_dropped(self, tmp_path):
        m, path = saved(tmp_path)
        text = text_of(path)
        line = next(ln for ln in text.splitlines() if ln.startswith("  decoder:"))
        edit(path, line, "  decoder: null")
        sub = xser.params(m.decoder).name
        with pytest.raises(xser.SpecError) as info:
            xser.load(path)
        assert str(info.value) == (
            f"{path}: {path}.data: subcollections on disk are not used by the spec: {sub} (load with strict=False to ignore); "
            f"{path} was edited since this checkpoint was saved and no longer matches its data: undo the edit (the spec saved "
            f"with the data is {path}.data/spec.yaml)")
        assert xser.load(path, strict=False).decoder is None

    def test_load_into_with_a_renamed_subcollection(self, tmp_path):
        m, path = saved(tmp_path)
        edit(path, xser.params(m.decoder).name, "Linear.0000beef")
        target = Model(encoder=Linear(2, 3), decoder=Linear(3, 2))
        with pytest.raises(xser.SpecError) as info:
            xser.load_into(target, path)
        assert str(info.value) == (
            f"{path}: the saved model has no parameters for the component at decoder ({xser.params(target.decoder).name}); {path} was edited since "
            f"checkpoint {path}.data was saved and no longer matches its data: undo the edit (the spec saved with the data is "
            f"{path}.data/spec.yaml)")

    @FAST
    @given(dim=st.integers(1, 9).filter(lambda d: d != 3), which=st.sampled_from(["in_dim", "out_dim"]))
    def test_any_shape_edit_is_a_spec_error_at_the_edit(self, tmp_path_factory, dim, which):
        path = str(tmp_path_factory.mktemp("e") / "m.yaml")
        xser.save(Model(encoder=Linear(3, 3)), path)
        edit(path, f"{which}: 3", f"{which}: {dim}")
        with pytest.raises(xser.SpecError) as info:
            xser.load(path)
        assert info.value.location.file == path and info.value.location.line == 5


class TestCheckpoints:
    def test_older_checkpoint_uses_its_own_spec_when_nothing_was_edited(self, tmp_path, caplog):
        """Specs that differ between checkpoints: each loads with its own (the top-level file is the newest's)."""
        path = str(tmp_path / "m.yaml")
        m = Model(encoder=Linear(2, 3))
        with xser.CheckpointSaver(path, keep=2) as saver:
            saver.save(m, step=1)
            m.dropout = 0.4
            saver.save(m, step=2)
        with caplog.at_level("WARNING", logger="xser"):
            assert xser.load(path, checkpoint=1).dropout == 0.1 and xser.load(path).dropout == 0.4
        assert caplog.messages == []

    def test_an_edit_applies_to_the_checkpoint_asked_for(self, tmp_path, caplog):
        path = str(tmp_path / "m.yaml")
        m = Model(encoder=Linear(2, 3))
        with xser.CheckpointSaver(path, keep=2) as saver:
            saver.save(m, step=1)
            m.encoder.W[...] = 7
            saver.save(m, step=2)
        edit(path, "dropout: 0.1", "dropout: 0.9")
        with caplog.at_level("WARNING", logger="xser"):
            old = xser.load(path, checkpoint=1)
        assert old.dropout == 0.9 and not (old.encoder.W == 7).all()
        S = path + ".data.1/spec.yaml"
        diff = DIFF.format(line=7, here="  dropout: 0.9", there="  dropout: 0.1", P=path, S=S)
        assert caplog.messages == [WARNING.format(DIFF=diff, P=path, D=path + ".data.1")]

    def test_an_older_checkpoints_spec_left_by_an_interrupted_save_is_not_an_edit(self, tmp_path, caplog):
        """A top-level file equal to another checkpoint's spec is xser's copy: each checkpoint loads with its own."""
        path = str(tmp_path / "m.yaml")
        m = Model(encoder=Linear(2, 3))
        with xser.CheckpointSaver(path, keep=2) as saver:
            saver.save(m, step=1)
            m.dropout = 0.4
            saver.save(m, step=2)
        with open(path, "w") as out:
            out.write(text_of(path + ".data.1/spec.yaml"))
        with caplog.at_level("WARNING", logger="xser"):
            assert xser.load(path).dropout == 0.4
        assert caplog.messages == []
        view = open_model(path)
        try:
            assert any(ln.startswith("  top-level spec: out of step: the top-level spec file is another checkpoint's") for ln in view.lines())
        finally:
            view.data.close()

    def test_read_params_reads_data_only(self, tmp_path):
        m, path = saved(tmp_path)
        edit(path, "encoder: !TLinear {in_dim: 2, out_dim: 3", "encoder: !TLinear {in_dim: 2, out_dim: 6")
        assert xser.read_params(path)[xser.params(m.encoder).name]["W"].shape == (3, 2)


class TestSaveKeepsTheEdit:
    def test_saving_the_loaded_edit_stores_it(self, tmp_path, caplog):
        _, path = saved(tmp_path)
        edit(path, "dropout: 0.1", "dropout: 0.5  # mine")
        xser.save(xser.load(path), path)
        caplog.clear()
        with caplog.at_level("WARNING", logger="xser"):
            assert xser.load(path).dropout == 0.5
        assert caplog.messages == [] and sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data"]
        assert "dropout: 0.5\n" in text_of(path + ".data/spec.yaml")

    def test_a_save_of_another_object_keeps_the_edit_aside(self, tmp_path, caplog):
        m, path = saved(tmp_path)
        edit(path, "dropout: 0.1", "dropout: 0.7")
        edited = text_of(path)
        for n, kept in enumerate(["m.yaml.edited", "m.yaml.edited.2"]):
            with caplog.at_level("WARNING", logger="xser"):
                xser.save(m, path)
            K = str(tmp_path / kept)
            assert caplog.messages[-1] == KEPT.format(P=path, K=K, S=path + ".data/spec.yaml", line=7, here="  dropout: 0.7",
                                                      there="  dropout: 0.1")
            assert text_of(K) == edited and xser.load(path).dropout == 0.1
            edit(path, "dropout: 0.1", "dropout: 0.7")
        assert sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data", "m.yaml.edited", "m.yaml.edited.2"]

    def test_a_checkpoint_saver_keeps_the_edit_aside(self, tmp_path, caplog):
        path = str(tmp_path / "m.yaml")
        m = Model(encoder=Linear(2, 3))
        with xser.CheckpointSaver(path, keep=2) as saver:
            saver.save(m, step=1)
            edit(path, "dropout: 0.1", "dropout: 0.7")
            with caplog.at_level("WARNING", logger="xser"):
                saver.save(m, step=2)
        assert "dropout: 0.7" in text_of(path + ".edited") and "dropout: 0.1" in text_of(path)
        assert len(caplog.messages) == 1 and caplog.messages[0].startswith(f"{path} was edited by hand since the last save")

    def test_an_edit_of_layout_or_comments_only_is_not_kept(self, tmp_path, caplog):
        m, path = saved(tmp_path)
        edit(path, "dropout: 0.1", "dropout: 0.1   # unchanged value")
        with caplog.at_level("WARNING", logger="xser"):
            xser.save(m, path)
        assert caplog.messages == [] and sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data"]


def test_inspect_shows_the_edit(tmp_path):
    _, path = saved(tmp_path)
    edit(path, "dropout: 0.1", "dropout: 0.5")
    view = open_model(path)
    try:
        lines = view.lines()
    finally:
        view.data.close()
    assert f"  spec: {path}" in lines
    assert ("  top-level spec: edited: the top-level spec file was edited by hand since this checkpoint was saved; load "
            "builds it, checked against this checkpoint's data, and a save of the loaded model stores it") in lines
    assert f"  edit: {DIFF.format(line=7, here='  dropout: 0.5', there='  dropout: 0.1', **names(path))}" in lines


def test_a_torch_module_edited_out_of_its_data(tmp_path):
    """A torch component whose edited arguments change its tensors: a SpecError at the edit, listing them."""
    pytest.importorskip("torch")
    from test_torch import Encoder

    path = str(tmp_path / "m.yaml")
    xser.save(Encoder(vocab=5, dim=4), path, durable=False)
    edit(path, "dim: 4", "dim: 6")
    with pytest.raises(xser.SpecError) as info:
        xser.load(path)
    text = str(info.value)
    assert info.value.location.file == path and info.value.location.line == 4
    assert "tensor(s) of the module differ from the checkpoint" in text
    assert text.endswith(f"{path} was edited since this checkpoint was saved and no longer matches its data: undo the edit "
                         f"(the spec saved with the data is {path}.data/spec.yaml)")


def test_a_tool_replacing_an_edited_model_keeps_the_edit(tmp_path, caplog):
    """convert --force over a model whose file was edited: the edit is kept aside, as by a save."""
    from xser.tools.convert import convert

    _, src = saved(tmp_path)
    out = str(tmp_path / "out.yaml")
    convert(src, out)
    edit(out, "dropout: 0.1", "dropout: 0.3")
    with caplog.at_level("WARNING", logger="xser"):
        convert(src, out, force=True)
    assert "dropout: 0.3" in text_of(out + ".edited") and "dropout: 0.1" in text_of(out)
    assert caplog.messages[-1].startswith(f"{out} was edited by hand since the last save")
