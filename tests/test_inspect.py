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

    def test_hand_edit_is_reported_and_used(self, tmp_path):
        """An edited top-level file is reported as edited: the view and load use it (tests/test_edited_spec.py)."""
        path = tmp_path / "m.yaml"
        xser.save(Model(encoder=1), path)
        path.write_text(path.read_text().replace("encoder: 1", "encoder: 2"))
        assert any(l.startswith("  top-level spec: edited:") for l in lines_of(path))
        assert xser.load(path).encoder == 2
        xser.save(xser.load(path), path)  # the next save stores the edit in its checkpoint
        assert "encoder: 2" in Path(f"{path}.data/spec.yaml").read_text()
        assert any(l.startswith("  top-level spec: in step:") for l in lines_of(path))

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


def _files_of(data_dir, sub, param):
    """The files on disk that hold one parameter (one file, or one per block)."""
    d = Path(data_dir) / sub
    return sorted(p for p in d.iterdir() if p.name == param or p.name.startswith((param + ".", param + "@")))


class TestJson:
    @pytest.fixture
    def model(self, tmp_path):
        from components import Leaf, Norm

        leaf = Leaf({"h": ["<f2", [4]], "n": ["<i8", []], "m": ["|b1", [2, 3]], "big": ["<f4", [6, 2]]})
        m = Model(encoder=Linear(2, 3), decoder=Model(encoder=leaf, decoder=Norm(5)))
        path = tmp_path / "m.yaml"
        lsub = xser.params(leaf).name
        xser.save(m, path, name="exp", formats={f"{lsub}/h": "dense-text"}, blocks={f"{lsub}/big": 2}, training={"step": 3})
        return m, path

    def test_subcollections_and_params(self, model, capsys):
        """--json: each subcollection (where the spec uses it) with its params' name, shape, dtype, format,
        bytes on disk (what the files weigh), trainable and blocks; the components; totals."""
        import json

        from xser.cli import main

        m, path = model
        assert main(["inspect", str(path), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        enc, leaf, norm = (xser.params(c).name for c in (m.encoder, m.decoder.encoder, m.decoder.decoder))
        assert report["model"] == str(path) and report["experiment"] == "exp"
        assert report["checkpoint"]["directory"] == "m.yaml.data" and len(report["checkpoint"]["id"]) == 32
        assert report["components"] == [
            {"path": "", "tag": "!TModel", "subcollection": None},
            {"path": "encoder", "tag": "!TLinear", "subcollection": enc},
            {"path": "decoder", "tag": "!TModel", "subcollection": None},
            {"path": "decoder.encoder", "tag": "!TLeaf", "subcollection": leaf},
            {"path": "decoder.decoder", "tag": "!TNorm", "subcollection": norm},
        ]
        subs = {s["name"]: s for s in report["subcollections"]}
        assert sorted(subs) == sorted([enc, leaf, norm])
        assert (subs[enc]["component"], subs[leaf]["component"], subs[norm]["component"]) == ("encoder", "decoder.encoder", "decoder.decoder")
        got = {(s["name"], p["name"]): p for s in report["subcollections"] for p in s["params"]}
        want = {
            (enc, "W"): ([3, 2], "float32", "npy", True, 1), (enc, "b"): ([3], "float32", "npy", True, 1),
            (leaf, "h"): ([4], "float16", "dense-text", True, 1), (leaf, "n"): ([], "int64", "npy", True, 1),
            (leaf, "m"): ([2, 3], "bool", "npy", True, 1), (leaf, "big"): ([6, 2], "float32", "npy", True, 3),
            (norm, "running_mean"): ([5], "float32", "npy", False, 1), (norm, "count"): ([], "int64", "npy", False, 1),
        }
        assert {k: (p["shape"], p["dtype"], p["format"], p["trainable"], p["blocks"]) for k, p in got.items()} == want
        data = f"{path}.data"
        for (sub, name), p in got.items():
            files = _files_of(data, sub, name)
            assert len(files) == p["blocks"] and p["bytes"] == sum(f.stat().st_size for f in files), (sub, name)
            assert p["stored_with"] is None
        assert report["bytes_on_disk"] == sum(p["bytes"] for p in got.values())
        assert report["training"] == {"step": 3}
        # the checkpoint list of --json is still there
        assert [c["directory"] for c in report["checkpoints"]] == ["m.yaml.data"]

    def test_json_of_an_older_checkpoint(self, tmp_path, capsys):
        """--checkpoint K with --json describes checkpoint K's contents (the list still covers all)."""
        import json

        from xser.cli import main

        path = tmp_path / "m.yaml"
        lin = Linear(2, 3)
        with xser.CheckpointSaver(path, keep=3) as saver:
            for step in (1, 2):
                saver.save(lin, step=step)
        assert main(["inspect", str(path), "--json", "--checkpoint", "1"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["checkpoint"]["directory"] == "m.yaml.data.1" and report["checkpoint"]["step"] == 1
        assert len(report["checkpoints"]) == 2

    def test_strict_json(self, tmp_path, capsys):
        """Non-finite metrics are null: the output is JSON that strict parsers (jq, JavaScript) read."""
        import json

        from xser.cli import main

        path = tmp_path / "m.yaml"
        with xser.CheckpointSaver(path, keep=3) as saver:
            saver.save(Linear(2, 3), step=1, metrics={"dev": float("nan"), "loss": float("inf"), "acc": 0.5})
        assert main(["inspect", str(path), "--json"]) == 0

        def refuse(name):
            raise ValueError(name)

        report = json.loads(capsys.readouterr().out, parse_constant=refuse)
        assert report["checkpoints"][0]["metrics"] == {"dev": None, "loss": None, "acc": 0.5}

    def test_packed_and_tied_params(self, tmp_path):
        """Params in one safetensors file name it ("file") with their own bytes; a tied one names the param it is
        stored with; the total counts each file once, as the listing does."""
        import os
        import sys

        pytest.importorskip("torch")
        from xser.tools.inspect import open_model

        sys.path.insert(0, os.path.dirname(__file__))
        from test_torch import model

        m = model()
        path = str(tmp_path / "m.yaml")
        xser.save(m, path, formats={"*": "safetensors"}, durable=False)
        enc, dec = xser.params(m.encoder).name, xser.params(m.decoder).name
        view = open_model(path)
        try:
            report = view.as_json()
        finally:
            view.data.close()
        params = {(s["name"], p["name"]): p for s in report["subcollections"] for p in s["params"]}
        out = params[(dec, "out.weight")]
        assert (out["shape"], out["format"], out["bytes"], out["file"]) == ([11, 4], "safetensors", 176, "params.safetensors")
        assert out["stored_with"] == f"{enc}/emb.weight"
        assert report["bytes_on_disk"] == sum(os.path.getsize(f"{path}.data/{s}/params.safetensors") for s in (enc, dec))


class TestDirectory:
    """`xser inspect DIR`: a directory holding saved models, or a checkpoint directory, names the model file."""

    def test_directory_holding_models(self, tmp_path, capsys):
        from xser.cli import main

        xser.save(Linear(2, 3), tmp_path / "a.yaml")
        assert main(["inspect", str(tmp_path)]) == 1
        assert capsys.readouterr().err == (f"error: {tmp_path}: a directory that holds a saved model, not a model; "
                                           f"give its model file instead: {tmp_path / 'a.yaml'}\n")
        xser.save(Linear(2, 3), tmp_path / "b.model")
        assert main(["inspect", str(tmp_path)]) == 1
        assert capsys.readouterr().err == (f"error: {tmp_path}: a directory that holds saved models, not a model; "
                                           f"give one of its model files instead: {tmp_path / 'a.yaml'}, {tmp_path / 'b.model'}\n")

    @pytest.mark.parametrize("slot, flag", [(".data", ""), (".data.2", " with --checkpoint 2")])
    def test_checkpoint_directory(self, tmp_path, capsys, slot, flag):
        from helpers import save_steps
        from xser.cli import main

        save_steps(str(tmp_path / "m.yaml"), Linear(2, 3), [1, 2, 3])
        assert main(["inspect", str(tmp_path / f"m.yaml{slot}")]) == 1
        assert capsys.readouterr().err == (f"error: {tmp_path / f'm.yaml{slot}'}: a checkpoint directory of the model "
                                           f"{tmp_path / 'm.yaml'}; give the model's file instead: {tmp_path / 'm.yaml'}{flag}\n")

    def test_other_directories_keep_their_message(self, tmp_path, capsys):
        """An empty directory, or one with only a spec file: the reader's message, nothing suggested."""
        from xser.cli import main

        (tmp_path / "x.yaml").write_text("a: 1\n")
        assert main(["inspect", str(tmp_path)]) == 1
        assert "not a model directory: neither model.safetensors.index.json nor model.safetensors" in capsys.readouterr().err

    @pytest.mark.parametrize("option", [["--json"], ["--plot", "p.png"], ["--verify"], ["--checkpoint", "1"]])
    def test_options_for_xser_models_only(self, tmp_path, capsys, option):
        """--json, --plot, --verify and --checkpoint on a safetensors file: an error, never silently ignored."""
        import numpy as np
        from safetensors.numpy import save_file

        from xser.cli import main

        save_file({"w": np.zeros((2, 2), np.float32)}, str(tmp_path / "m.safetensors"))
        assert main(["inspect", str(tmp_path / "m.safetensors"), *option]) == 1
        assert capsys.readouterr().err == (f"error: {tmp_path / 'm.safetensors'}: {option[0]} reads saved xser models "
                                           "(MODEL.yaml); this is a safetensors model, whose tensors inspect lists without it\n")
        assert main(["inspect", str(tmp_path / "m.safetensors")]) == 0


def test_a_model_path_value_is_not_listed_as_a_component(tmp_path):
    """A path inside the model's directory is saved as !ModelPath {path: ...}: a value, not a component."""
    (tmp_path / "v.txt").write_text("a\n")
    path = tmp_path / "m.yaml"
    from components import Node

    xser.save(Model(encoder=Linear(2, 2), decoder=Node(value=str(tmp_path / "v.txt"))), path)
    assert "!ModelPath {path: v.txt}" in path.read_text()
    lines = lines_of(path)
    assert [ln.split(":")[0].strip() for ln in lines[lines.index("components:") + 1:] if ": !" in ln] == ["(root)", "encoder", "decoder"]


class TestSavedByRanks:
    def test_world_size_and_each_ranks_state(self, tmp_path, capsys):
        """A checkpoint saved by 3 ranks: the text and --json show the world size, the training entries every rank
        saved alike, and each rank's training dict and training state; --verify checks the ranks' state files."""
        import json

        from reshard_model import save
        from xser.cli import main

        path = save(str(tmp_path / "m.yaml"), 3, steps=2, state=[0, 2])
        assert main(["inspect", path]) == 0
        text = capsys.readouterr().out
        assert "  saved by: 3 ranks (world size 3)\n  training: {'epoch': 7}\n" in text
        assert ("ranks: 3 (each rank's own training dict and training state; a load at another world size refuses them "
                "unless rank_state=\"drop\")\n"
                "  0  training state: 1 array, 152 B  training: {'rank': 0, 'epoch': 7}\n"
                "  1  training state: -  training: {'rank': 1, 'epoch': 7}\n"
                "  2  training state: 1 array, 152 B  training: {'rank': 2, 'epoch': 7}\n") in text
        assert text.splitlines()[-3].split() == ["#", "directory", "step", "created", "training", "state", "ranks"]
        assert text.splitlines()[-2].split()[-2:] == ["yes", "3"]
        assert main(["inspect", path, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert (report["world_size"], report["training"]) == (3, {"epoch": 7})
        assert report["ranks"] == [
            {"rank": 0, "training": {"rank": 0, "epoch": 7}, "training_state": {"arrays": 1, "bytes": 152}},
            {"rank": 1, "training": {"rank": 1, "epoch": 7}, "training_state": None},
            {"rank": 2, "training": {"rank": 2, "epoch": 7}, "training_state": {"arrays": 1, "bytes": 152}},
        ]
        assert [(c["world_size"], c["training_state"]) for c in report["checkpoints"]] == [(3, True), (3, True)]
        lines = verify_model(path)
        # W: a block per rank, b, 3 parts of the table per rank, the 2 ranks' states, the spec
        assert lines[0].startswith("checkpoint 0 (m.yaml.data): 16 files match their checksums")
        with open(os.path.join(path + ".data", "training_state", "rank2-0.npy"), "r+b") as f:
            f.seek(-1, 2)
            f.write(b"\x7f")
        with pytest.raises(xser.DataError, match="checksum"):
            verify_model(path)

    def test_one_process_checkpoints_show_no_ranks(self, tmp_path, capsys):
        import json

        from xser.cli import main

        path = tmp_path / "m.yaml"
        xser.save(Linear(2, 3), path, training={"step": 1})
        assert main(["inspect", str(path), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert (report["world_size"], report["ranks"], report["checkpoints"][0]["world_size"]) == (1, [], 1)
        assert main(["inspect", str(path)]) == 0
        assert "ranks" not in capsys.readouterr().out
