"""Converting checkpoints into independent models."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import xser
from components import Linear, Model, Norm
from helpers import edit_spec
from xser.tools.convert import convert, convert_all, numbered


@pytest.fixture
def run(tmp_path):
    path = str(tmp_path / "m.yaml")
    m = Model(encoder=Linear(4, 3), decoder=Norm(3))
    with xser.CheckpointSaver(path, keep=3) as saver:
        for step in (1, 2, 3):
            m.encoder.W[...] = step
            saver.save(m, step=step, metrics={"bleu": float(step)}, training_state={"lr": 0.1 * step, "m": m.encoder.W * 2})
    return path, m


class TestConvert:
    def test_fresh_names_same_arrays(self, tmp_path, run):
        """A converted checkpoint has new subcollection names (spec and files) and the checkpoint's arrays."""
        path, m = run
        report = convert(path, tmp_path / "c.yaml", checkpoint=1)
        old = xser.params(m.encoder).name
        new = report.renamed[old]
        assert new != old and new.startswith("Linear.") and len(new) == len(old)
        text = Path(tmp_path / "c.yaml").read_text()
        assert new in text and old not in text
        loaded = xser.load(tmp_path / "c.yaml")
        assert np.all(loaded.encoder.W == 2) and xser.params(loaded.encoder).name == new
        assert os.path.isdir(tmp_path / "c.yaml.data" / new)

    def test_files_are_hard_linked(self, tmp_path, run):
        """Conversion costs no data I/O: files are hard links of the checkpoint's."""
        path, m = run
        report = convert(path, tmp_path / "c.yaml")
        old = xser.params(m.encoder).name
        a = Path(path + ".data", old, "W.npy").stat()
        b = Path(tmp_path / "c.yaml.data", report.renamed[old], "W.npy").stat()
        assert a.st_ino == b.st_ino

    def test_copy_fallback(self, tmp_path, run, monkeypatch):
        """Where hard links are impossible the files are copied, transparently."""
        path, _ = run

        def no_links(src, dst, **kw):
            raise OSError(18, "Invalid cross-device link")

        monkeypatch.setattr(os, "link", no_links)
        convert(path, tmp_path / "c.yaml")
        monkeypatch.undo()
        assert np.all(xser.load(tmp_path / "c.yaml", verify=True).encoder.W == 3)

    def test_all_and_side_by_side(self, tmp_path, run):
        """--all converts every checkpoint; the results load together without name clashes."""
        path, _ = run
        reports = convert_all(path, tmp_path / "conv" / "model.yaml")
        outs = [r.out for r in reports]
        assert [os.path.basename(o) for o in outs] == ["model.0.yaml", "model.1.yaml", "model.2.yaml"]
        models = [xser.load(o) for o in outs]
        names = {xser.params(mm.encoder).name for mm in models}
        assert len(names) == 3
        assert [float(mm.encoder.W.flat[0]) for mm in models] == [3.0, 2.0, 1.0]
        ens = xser.build({"members": [xser.spec.Tagged("!Ensemble", {"members": []})]})
        assert ens["members"][0].members == []

    def test_training_state_dropped_unless_asked(self, tmp_path, run):
        """Thin: training state is dropped unless keep_training_state."""
        path, _ = run
        convert(path, tmp_path / "thin.yaml")
        with pytest.raises(xser.CheckpointError, match="saved without training_state"):
            xser.load_training_state(tmp_path / "thin.yaml")
        convert(path, tmp_path / "full.yaml", checkpoint=2, keep_training_state=True)
        state = xser.load_training_state(tmp_path / "full.yaml")
        assert state["lr"] == pytest.approx(0.1) and np.all(state["m"] == 2)

    def test_metadata_kept(self, tmp_path, run):
        """Step and metrics of the checkpoint go with it."""
        path, _ = run
        convert(path, tmp_path / "c.yaml", checkpoint=2)
        (c,) = xser.checkpoints(tmp_path / "c.yaml")
        assert c.step == 1 and c.metrics == {"bleu": 1.0} and c.training["converted_from"] == "m.yaml.data.2"

    def test_errors(self, tmp_path, run):
        """Output equal to input, an existing output, a missing checkpoint: clear errors."""
        path, _ = run
        with pytest.raises(xser.CheckpointError, match="the output is the input model"):
            convert(path, path)
        convert(path, tmp_path / "c.yaml")
        with pytest.raises(xser.CheckpointError, match="the output model exists"):
            convert(path, tmp_path / "c.yaml")
        with pytest.raises(xser.CheckpointError, match="no checkpoint 9"):
            convert(path, tmp_path / "d.yaml", checkpoint=9)
        assert not os.path.exists(tmp_path / "d.yaml")

    def test_numbered(self):
        """Output names for --all."""
        assert numbered("a/model.yaml", 2) == "a/model.2.yaml" and numbered("a/model", 0) == "a/model.0.yaml"


def test_tools_keep_unknown_tags(tmp_path, run):
    """convert, ensemble and avg work on specs whose classes this process does not know."""
    from xser.tools.average import average
    from xser.tools.ensemble import ensemble

    path, _ = run
    edit_spec(path, lambda t: t.replace("!TModel", "!SomebodyElsesModel"))
    text = Path(path).read_text()
    convert(path, tmp_path / "c.yaml")
    assert "!SomebodyElsesModel" in Path(tmp_path / "c.yaml").read_text()
    ensemble([path, tmp_path / "c.yaml"], tmp_path / "e.yaml")
    assert Path(tmp_path / "e.yaml").read_text().count("!SomebodyElsesModel") == 2
    average(path, tmp_path / "a.yaml")
    assert Path(tmp_path / "a.yaml").read_text() == text


def test_published_files_are_read_only(tmp_path, run):
    """Every file of a checkpoint is mode 0444: a converted model's hard links cannot be written through by accident."""
    path, _ = run
    convert(path, tmp_path / "c.yaml")
    for d in (path + ".data", str(tmp_path / "c.yaml.data")):
        for root, _, files in os.walk(d):
            for f in files:
                assert os.stat(os.path.join(root, f)).st_mode & 0o777 == 0o444, (root, f)
    from xser.tools.inspect import open_model

    view = open_model(tmp_path / "c.yaml")
    try:
        assert any("links: shared with other checkpoints or models" in line for line in view.lines())
    finally:
        view.data.close()


def test_convert_the_best_checkpoint(tmp_path):
    from helpers import scored_model
    from xser.tools.convert import convert

    scored_model(tmp_path / "m.yaml", [20.0, 31.0, 25.0], metric="bleu")
    report = convert(tmp_path / "m.yaml", tmp_path / "best.yaml", checkpoint="best", metric="bleu")
    assert report.source.endswith("m.yaml.data.1") and (xser.load(tmp_path / "best.yaml").W == 2).all()


class TestSavedByRanks:
    def test_each_ranks_training_dict_and_state_are_kept(self, tmp_path):
        """A checkpoint saved by 3 ranks, converted: the new model keeps the world size and each rank's training dict,
        and with keep_training_state each rank's own state (rank 1 saved none); rows and tables load resharded."""
        from reshard_model import problems, save
        from threaded import run

        path = save(str(tmp_path / "m.yaml"), 3, steps=2, state=[0, 2], blocks={"*/emb@*": 5})
        convert(path, tmp_path / "kept.yaml", keep_training_state=True, durable=False)
        states = run(3, lambda c: xser.resume(tmp_path / "kept.yaml", coordinator=c))
        assert [(s.training_state and s.training_state["rng"].tolist(), s.checkpoint.training["rank"], s.checkpoint.world_size)
                for s in states] == [([2] * 3, 0, 3), (None, 1, 3), ([202] * 3, 2, 3)]
        assert states[0].checkpoint.training["converted_from"] == "m.yaml.data"
        with pytest.raises(xser.CheckpointError, match=r"saved by 3 processes \(world size 3\) and is loaded at world size 2"):
            run(2, lambda c: xser.load_training_state(tmp_path / "kept.yaml"))
        assert run(2, lambda c: problems(xser.load(tmp_path / "kept.yaml", coordinator=c), c, 2)) == [[], []]
        convert(path, tmp_path / "plain.yaml", durable=False)
        ck = xser.checkpoints(tmp_path / "plain.yaml")[0]
        assert (ck.world_size, ck.has_training_state, ck.training["epoch"]) == (3, False, 7)
        assert [s.checkpoint.training["rank"] for s in run(3, lambda c: xser.resume(tmp_path / "plain.yaml"))] == [0, 1, 2]
