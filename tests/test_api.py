"""save / load / read_params / load_config: round trips, rules, and the pinned format."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xser
from components import Linear, Model, Node, Norm
from helpers import edit_spec
from strategies import as_stored, bit_equal, component_trees, leaf_of, param_sets
from xser.model.serialize import to_tree

HERE = os.path.dirname(__file__)
GOLDEN = os.path.join(HERE, "data", "golden")
GOLDEN_V1 = os.path.join(HERE, "data", "golden-v1")
GOLDEN_V2 = os.path.join(HERE, "data", "golden-v2")
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def arrays_of(obj):
    _, subcols = to_tree(obj)
    return {name: dict(sub.items()) for name, (sub, _) in subcols.items()}


class TestRoundTrip:
    @FAST
    @given(tree=component_trees())
    def test_component_trees(self, tmp_path_factory, tree):
        """save then load gives an equal spec (names, refs, sharing) and bit-equal arrays."""
        path = str(tmp_path_factory.mktemp("rt") / "m.yaml")
        xser.save(tree, path, durable=False)
        again = xser.load(path)
        assert to_tree(again)[0] == to_tree(tree)[0]
        before, after = arrays_of(tree), arrays_of(again)
        assert before.keys() == after.keys()
        for sub in before:
            assert before[sub].keys() == after[sub].keys()
            for k in before[sub]:
                assert bit_equal(before[sub][k], after[sub][k])

    @FAST
    @given(params=param_sets(), mmap=st.booleans())
    def test_param_collections(self, tmp_path_factory, params, mmap):
        """Every dtype numpy stores without pickle round-trips bit-exactly, eagerly and mapped."""
        path = str(tmp_path_factory.mktemp("pc") / "m.yaml")
        leaf = leaf_of(params)
        xser.save(leaf, path, durable=False)
        (sub,) = xser.read_params(path, mmap=mmap).values()
        assert sub.keys() == params.keys()
        for k, a in params.items():
            assert bit_equal(sub[k], a)
        loaded = xser.load(path, mmap=mmap, verify=not mmap)
        for k, a in params.items():
            assert bit_equal(xser.params(loaded)[k], a)

    @FAST
    @given(params=param_sets())
    def test_files_are_plain_npy(self, tmp_path_factory, params):
        """Each array file is readable by numpy.load(allow_pickle=False) alone (bfloat16 and float8 as their bits)."""
        path = str(tmp_path_factory.mktemp("np") / "m.yaml")
        leaf = leaf_of(params)
        xser.save(leaf, path, durable=False)
        name = xser.params(leaf).name
        for k, a in params.items():
            assert bit_equal(np.load(os.path.join(path + ".data", name, k + ".npy"), allow_pickle=False), as_stored(a))

    def test_shared_object_saved_once(self, tmp_path):
        """An object reached twice is saved once; the second place is a !Ref; identity survives."""
        enc = Linear(2, 3)
        m = Model(encoder=enc, decoder=enc)
        path = str(tmp_path / "m.yaml")
        xser.save(m, path)
        text = Path(path).read_text()
        assert "decoder: !Ref {path: encoder}" in text
        assert len(os.listdir(path + ".data")) == 3  # one subcollection, the spec and the manifest
        again = xser.load(path)
        assert again.encoder is again.decoder

    def test_loaded_model_keeps_subcol_names(self, tmp_path):
        """load gives the same classes, the same arrays and the same subcollection names."""
        m = Model(encoder=Linear(2, 3), decoder=Norm(3))
        path = str(tmp_path / "m.yaml")
        xser.save(m, path)
        again = xser.load(path)
        assert type(again.encoder) is Linear and type(again.decoder) is Norm
        assert xser.params(again.encoder).name == xser.params(m.encoder).name
        assert np.array_equal(again.encoder.W, m.encoder.W)

    def test_experiment_name_is_saved(self, tmp_path):
        """A built experiment remembers its name; the saved file holds exactly one experiment."""
        cfg = tmp_path / "c.yaml"
        cfg.write_text("first:\n  a: 1\nsecond:\n  a: !TNode {value: 2}\n")
        exps = xser.load_config(cfg)
        assert list(exps) == ["first", "second"]
        exp = xser.build(exps["second"])
        path = str(tmp_path / "m.yaml")
        xser.save(exp, path)
        assert list(xser.load_config(path)) == ["second"]
        assert xser.load(path).name == "second"

    def test_rebound_parameter_is_saved(self, tmp_path):
        """A parameter attribute rebound to a new array of the same shape is what gets saved."""
        lin = Linear(2, 3)
        lin.W = lin.W + 1.0
        path = str(tmp_path / "m.yaml")
        xser.save(lin, path)
        assert np.array_equal(xser.load(path).W, lin.W)

    def test_rebound_to_other_shape_is_an_error(self, tmp_path):
        """Rebinding a parameter attribute to another shape fails instead of saving stale data."""
        lin = Linear(2, 3)
        lin.W = np.zeros((5, 5), np.float32)
        with pytest.raises(xser.DataError, match=r"attribute \.W was rebound to \(5, 5\) float32, declared \(3, 2\) float32"):
            xser.save(lin, str(tmp_path / "m.yaml"))
        assert not os.path.exists(tmp_path / "m.yaml")

    def test_undeclared_arrays_are_not_saved(self, tmp_path):
        """Caches and gradients on the object are never written (thin saves)."""
        lin = Linear(2, 3)
        lin.grad = np.ones((1000, 1000))
        lin.cache = np.ones(10)
        path = str(tmp_path / "m.yaml")
        xser.save(lin, path)
        sub = xser.read_params(path)[xser.params(lin).name]
        assert set(sub) == {"W", "b"}

    def test_save_creates_parents(self, tmp_path):
        """save creates missing parent directories."""
        path = tmp_path / "a" / "b" / "m.yaml"
        xser.save(Node(1), path)
        assert path.exists() and (tmp_path / "a" / "b" / "m.yaml.data" / "manifest.json").exists()

    def test_resave_replaces(self, tmp_path):
        """Saving again over a model replaces it; no temporary directories are left."""
        path = str(tmp_path / "m.yaml")
        lin = Linear(2, 3)
        xser.save(lin, path)
        lin.W[...] = 5.0
        xser.save(lin, path)
        assert np.all(xser.load(path).W == 5.0)
        assert sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data"]

    def test_durable_fsyncs(self, tmp_path, monkeypatch):
        """durable=True fsyncs each file, the manifest, each directory and the staging directory (never one syncfs of
        the whole filesystem, which waits for every other process's dirty data there); durable=False does not."""
        from xser.storage import fsutil

        calls, syncs = [], []
        real = os.fsync
        monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
        monkeypatch.setattr(fsutil, "_SYNCFS", lambda fd: syncs.append(fd) or 0)
        xser.save(Linear(2, 3), str(tmp_path / "a.yaml"), durable=False)
        assert calls == []
        xser.save(Linear(2, 3), str(tmp_path / "b.yaml"))
        assert syncs == [] and len(calls) >= 6  # 2 files, manifest, 2 directories, parent, spec file
        assert sum(c.endswith(".npy") for c in calls) == 2 and sum(c.endswith("manifest.json") for c in calls) == 1
        staged = [c for c in calls if ".data.tmp-" in c and os.path.basename(c).startswith("b.yaml.data.tmp-")]
        assert len(staged) == 1  # the staging directory itself (before its exchange into place)

    def test_training_and_custom_metadata(self, tmp_path):
        """training and custom mappings are stored in the manifest as given."""
        path = str(tmp_path / "m.yaml")
        xser.save(Node(1), path, training={"epoch": 3}, custom={"who": ["me"]})
        m = json.loads(Path(path + ".data/manifest.json").read_text())
        assert m["training"] == {"epoch": 3} and m["custom"] == {"who": ["me"]}

    def test_metadata_must_be_json(self, tmp_path):
        """Non-JSON metadata is refused before anything is written."""
        with pytest.raises(xser.DataError, match="custom must be JSON data"):
            xser.save(Node(1), str(tmp_path / "m.yaml"), custom={"x": object()})
        assert os.listdir(tmp_path) == []

    def test_subcol_clash_names_both(self, tmp_path):
        """Two components with one subcollection name: an error naming both places."""
        cfg = tmp_path / "c.yaml"
        cfg.write_text("e:\n  a: !TLinear {in_dim: 1, out_dim: 1}\n")
        a = xser.build(xser.load_config(cfg)["e"])["a"]
        b = xser.build(xser.load_config(cfg)["e"])["a"]
        xser.params(b).name = xser.params(a).name
        with pytest.raises(xser.DataError, match=r"used by two components: at encoder and at decoder"):
            xser.save(Model(encoder=a, decoder=b), str(tmp_path / "m.yaml"))

    def test_cycle_in_objects(self, tmp_path):
        """An object graph with a cycle is reported, not followed forever."""
        n = Node(1)
        n.children = [n]
        with pytest.raises(xser.SpecError, match="cycle"):
            xser.save(n, str(tmp_path / "m.yaml"))

    def test_array_argument_refused(self, tmp_path):
        """A numpy array passed as a constructor argument is not silently pickled."""
        with pytest.raises(xser.SpecError, match="value: a numpy array in a constructor argument is not saved"):
            xser.save(Node(np.zeros(3)), str(tmp_path / "m.yaml"))


class TestLoadRules:
    def saved(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        m = Model(encoder=Linear(2, 3), decoder=Linear(3, 2))
        xser.save(m, path)
        return m, path

    def test_mmap_is_copy_on_write(self, tmp_path):
        """mmap=True gives copy-on-write maps: writes change memory, not the file."""
        m, path = self.saved(tmp_path)
        again = xser.load(path, mmap=True)
        assert isinstance(again.encoder.W, np.memmap)
        again.encoder.W[...] = 9.0
        assert np.array_equal(xser.load(path).encoder.W, m.encoder.W)

    def test_missing_subcollection_always_fails(self, tmp_path):
        """A subcollection the spec needs but the data lacks is an error, strict or not."""
        m, path = self.saved(tmp_path)
        name = xser.params(m.decoder).name
        mpath = path + ".data/manifest.json"
        manifest = json.loads(Path(mpath).read_text())
        del manifest["subcollections"][name]
        Path(mpath).write_text(json.dumps(manifest))
        for strict in (True, False):
            with pytest.raises(xser.DataError, match=f"m.yaml.data/{name}: subcollection is missing from the data directory"):
                xser.load(path, strict=strict)

    def test_unused_subcollection_strictness(self, tmp_path):
        """Subcollections on disk that the spec does not use: an error unless strict=False."""
        m, path = self.saved(tmp_path)
        edit_spec(path, lambda t: "\n".join(("  decoder: null" if ln.startswith("  decoder:") else ln) for ln in t.splitlines()) + "\n")
        name = xser.params(m.decoder).name
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert str(info.value) == (
            f"{path}.data: subcollections on disk are not used by the spec: {name} (load with strict=False to ignore)"
        )
        again = xser.load(path, strict=False)
        assert again.decoder is None and np.array_equal(again.encoder.W, m.encoder.W)

    def test_missing_param_on_disk(self, tmp_path):
        """A declared parameter missing from its subcollection names what is on disk."""
        m, path = self.saved(tmp_path)
        name = xser.params(m.encoder).name
        mpath = path + ".data/manifest.json"
        manifest = json.loads(Path(mpath).read_text())
        del manifest["subcollections"][name]["b"]
        Path(mpath).write_text(json.dumps(manifest))
        with pytest.raises(xser.DataError, match=r"param 'b' is missing on disk \(on disk: W\)"):
            xser.load(path)

    def test_shape_mismatch_names_both(self, tmp_path):
        """A spec whose shapes differ from the data: the message gives both, as tuples."""
        m, path = self.saved(tmp_path)
        name = xser.params(m.encoder).name
        edit_spec(path, lambda t: t.replace("encoder: !TLinear {in_dim: 2, out_dim: 3", "encoder: !TLinear {in_dim: 2, out_dim: 6"))
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert str(info.value) == f"{path}.data/{name}: param 'W': shape (6, 2) in spec, (3, 2) on disk"

    def test_dtype_mismatch_names_both(self, tmp_path):
        """A dtype that differs from the data: the message gives both."""
        path = str(tmp_path / "m.yaml")
        leaf = leaf_of({"x": np.zeros(3, np.float32)})
        xser.save(leaf, path)
        edit_spec(path, lambda t: t.replace("<f4", "<f8"))
        with pytest.raises(xser.DataError, match=r"param 'x': dtype float64 in spec, float32 on disk"):
            xser.load(path)

    def test_missing_data_dir(self, tmp_path):
        """A spec without its data directory fails loudly (XNMT loaded random weights and exited 0)."""
        _, path = self.saved(tmp_path)
        shutil.rmtree(path + ".data")
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert str(info.value) == f"{path}.data: data directory not found (was the model saved with xser.save?)"

    def test_spec_without_subcol_name(self, tmp_path):
        """A saved component that registers parameters but lost its xser_subcol_name is an error."""
        m, path = self.saved(tmp_path)
        name = xser.params(m.encoder).name
        edit_spec(path, lambda t: t.replace(f", xser_subcol_name: {name}", ""))
        with pytest.raises(xser.DataError, match="registers parameters, but its saved spec has no xser_subcol_name"):
            xser.load(path)

    def test_load_config_rejects_non_mapping(self, tmp_path):
        """A config file must be a mapping of named experiments."""
        p = tmp_path / "c.yaml"
        p.write_text("- a\n- b\n")
        with pytest.raises(xser.SpecError) as info:
            xser.load_config(p)
        assert str(info.value) == f"{p}:1:1: a config file is a mapping of named experiments, got list"

    def test_load_of_config_file(self, tmp_path):
        """xser.load of a config (not a saved model) says what is wrong."""
        p = tmp_path / "c.yaml"
        p.write_text("e: {a: 1}\n")
        with pytest.raises(xser.SpecError) as info:
            xser.load(p)
        assert str(info.value) == f"{p}:1:1: not a saved xser model (no xser_format key); is this a config file? Build and save it first: a saved model is the MODEL.yaml that xser.save writes beside MODEL.yaml.data/"

    def test_newer_spec_format(self, tmp_path):
        """A spec written by a newer xser is refused with both versions."""
        _, path = self.saved(tmp_path)
        edit_spec(path, lambda t: t.replace("xser_format: 1", "xser_format: 9"))
        with pytest.raises(xser.SpecError, match="xser_format 9 was written by a newer xser"):
            xser.load(path)


class TestGoldenFormat:
    SPEC = (
        "tiny:\n"
        "  model: !TModel\n"
        "    encoder: !TLinear {in_dim: 2, out_dim: 3, init: ones, xser_subcol_name: Linear.0000abcd, xser_id: enc}\n"
        "    decoder: !TNorm {dim: 3, xser_subcol_name: Norm.12345678}\n"
        "    name: tiny model\n"
        "  tied: !Ref {name: enc}\n"
    )

    def test_golden_bytes(self, tmp_path):
        """The bytes of a tiny saved model are pinned (docs/format.md describes them)."""
        cfg = tmp_path / "tiny.yaml"
        cfg.write_text(self.SPEC)
        exp = xser.build(xser.load_config(cfg)["tiny"])
        out = tmp_path / "out" / "model.yaml"
        xser.save(exp, out, training={"step": 10}, custom={"note": "golden"})
        produced = {}
        for dirpath, _, files in os.walk(tmp_path / "out"):
            for f in files:
                full = os.path.join(dirpath, f)
                produced[os.path.relpath(full, tmp_path / "out")] = Path(full).read_bytes()
        manifest = json.loads(produced["model.yaml.data/manifest.json"])
        assert manifest["xser_version"] == xser.__version__
        assert manifest["created"].endswith("Z")
        expected = {}
        for dirpath, _, files in os.walk(GOLDEN):
            for f in files:
                full = os.path.join(dirpath, f)
                expected[os.path.relpath(full, GOLDEN)] = Path(full).read_bytes()
        normal = produced["model.yaml.data/manifest.json"].decode()
        normal = normal.replace(manifest["created"], "CREATED").replace(f'"xser_version": "{xser.__version__}"', '"xser_version": "VERSION"')
        normal = normal.replace(manifest["id"], "ID").replace(manifest["model"], "MODEL")
        produced["model.yaml.data/manifest.json"] = normal.encode()
        assert sorted(produced) == sorted(expected)
        for name in expected:
            assert produced[name] == expected[name], name

    def test_format_version_2_still_loads(self, tmp_path):
        """A model saved by xser 0.2 (format_version 2: numpy dtypes only) loads, and its next save writes version 3."""
        shutil.copytree(GOLDEN_V2, tmp_path / "old")
        path = tmp_path / "old" / "model.yaml"
        exp = xser.load(path)
        assert np.all(exp["model"].encoder.W == 1) and exp["tied"] is exp["model"].encoder
        (ck,) = xser.checkpoints(path)
        assert (ck.id, ck.step, ck.training) == ("ID", None, {"step": 10})
        xser.save(exp, path)
        assert json.loads(Path(str(path) + ".data/manifest.json").read_text())["format_version"] == 3

    def test_format_version_1_still_loads(self, tmp_path):
        """A model saved by xser 0.1 (format_version 1: no spec copy, no ids) loads with its top-level spec."""
        shutil.copytree(GOLDEN_V1, tmp_path / "old")
        path = tmp_path / "old" / "model.yaml"
        exp = xser.load(path)
        assert np.all(exp["model"].encoder.W == 1) and exp["tied"] is exp["model"].encoder
        (ck,) = xser.checkpoints(path)
        assert ck.id is None and ck.step is None


def test_prefetch_stops_when_a_load_fails(tmp_path, monkeypatch):
    """After the first bad parameter, no further prefetched reads start (and none runs after load returns)."""
    import threading
    import time

    from xser.storage.opened import OpenedDir

    path = str(tmp_path / "m.yaml")
    leaf = leaf_of({f"p{i:02d}": np.full(4, i, np.float32) for i in range(40)})
    xser.save(leaf, path, durable=False)
    name = xser.params(leaf).name
    Path(path + f".data/{name}/p00.npy").write_bytes(b"not an npy file at all, but long enough..........")
    started = []
    real = OpenedDir._read_block
    lock = threading.Lock()

    def slow(self, entry, *a, **kw):
        with lock:
            started.append(entry.name)
        time.sleep(0.02)
        return real(self, entry, *a, **kw)

    monkeypatch.setattr(OpenedDir, "_read_block", slow)
    with pytest.raises(xser.DataError, match="p00.npy: file has"):
        xser.load(path)
    done = len(started)
    time.sleep(0.1)
    assert len(started) == done < 10, started


def test_mmap_survives_pruning(tmp_path):
    """Arrays loaded with mmap=True keep the files they mapped, even after the checkpoint is pruned."""
    path = str(tmp_path / "m.yaml")
    lin = Linear(8, 8)
    with xser.CheckpointSaver(path, keep=1) as saver:
        lin.W[...] = 1
        saver.save(lin, step=1)
        lazy = xser.load(path, mmap=True)
        for step in (2, 3):
            lin.W[...] = step
            saver.save(lin, step=step)
    assert [c.step for c in xser.checkpoints(path)] == [3]
    assert np.all(lazy.W == 1)


def test_checkpoint_removed_while_reading(tmp_path, monkeypatch):
    """A checkpoint deleted under a reader makes it start over; if that keeps happening, a clear CheckpointError."""
    from xser.errors import Location
    from xser.storage.opened import CheckpointVanished, OpenedDir

    path = str(tmp_path / "m.yaml")
    lin = Linear(2, 3)
    xser.save(lin, path)
    real = OpenedDir.open_file
    vanish = {"left": 1}

    def open_file(self, rel, **kw):
        if vanish["left"]:
            vanish["left"] -= 1
            raise CheckpointVanished("the checkpoint was removed while it was being read", Location(self.path))
        return real(self, rel, **kw)

    monkeypatch.setattr(OpenedDir, "open_file", open_file)
    monkeypatch.setattr(OpenedDir, "_map_npy", lambda self, e: None)
    assert np.array_equal(xser.load(path).W, lin.W)  # started over once, then read a whole checkpoint
    vanish["left"] = 10**6
    with pytest.raises(xser.CheckpointError) as info:
        xser.read_params(path)
    assert str(info.value) == (
        f"{path}: the checkpoint was removed while it was being read, 5 times in a row (a saver is pruning it); "
        "read an older checkpoint or keep more of them"
    )


def test_removed_tells_pruning_from_rotation(tmp_path):
    """An opened directory renamed to another slot is still there; renamed to a trash name or deleted, it is removed."""
    import shutil

    from xser.storage.opened import OpenedDir

    path = str(tmp_path / "m.yaml")
    xser.save(Linear(2, 3), path)
    with OpenedDir.open(path + ".data") as d:
        os.rename(path + ".data", path + ".data.1")
        assert not d.removed()
        os.rename(path + ".data.1", path + ".data.old-1-abc")
        assert d.removed()
        shutil.rmtree(path + ".data.old-1-abc")
        assert d.removed()


# ---------------------------------------------------------------- resume and best checkpoint


def _train(lin: Linear, state: dict, step: int) -> float:
    """One deterministic 'update': W moves, the optimizer state counts; returns a dev score."""
    lin.W += np.float32(0.5) * state["m"]
    state["m"] = state["m"] * np.float32(0.9) + np.float32(step)
    return float(np.sin(step))


def _run(path: Path, stop_at: int | None, total: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """The README loop: start or resume, train, checkpoint with metrics, maybe stop early."""
    got = xser.resume(path)
    if got is None:
        lin, state, first = Linear(3, 2), {"m": np.ones((2, 3), np.float32)}, 1
        lin.W[...] = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    else:
        lin, state, first = got.model, got.training_state, got.step + 1
    with xser.CheckpointSaver(path, keep=3) as saver:
        for step in range(first, total + 1):
            dev = _train(lin, state, step)
            saver.save(lin, step=step, metrics={"dev": dev}, training_state=state)
            if step == stop_at:
                break
    return lin.W.copy(), state["m"].copy()


@pytest.mark.parametrize("stops", [[3], [1, 5], [2, 3, 7]])
def test_resume_equals_an_uninterrupted_run(tmp_path, stops):
    once = _run(tmp_path / "a" / "m.yaml", None)
    for stop in stops:
        _run(tmp_path / "b" / "m.yaml", stop)
    again = _run(tmp_path / "b" / "m.yaml", None)
    assert bit_equal(once[0], again[0]) and bit_equal(once[1], again[1])
    assert [c.step for c in xser.checkpoints(tmp_path / "b" / "m.yaml")] == [8, 7, 6]


def test_resume_returns_none_only_when_nothing_was_saved(tmp_path):
    assert xser.resume(tmp_path / "m.yaml") is None
    assert xser.resume(tmp_path / "no" / "dir" / "m.yaml") is None
    (tmp_path / "m.yaml").write_text("x: 1\n")
    with pytest.raises(xser.XserError):
        xser.resume(tmp_path / "m.yaml")  # a file there, not a saved model: never a silent fresh start


def test_resume_gives_the_checkpoint_it_read(tmp_path):
    path = tmp_path / "m.yaml"
    lin = Linear(2, 2)
    with xser.CheckpointSaver(path, keep=5) as saver:
        for step, dev in enumerate([0.1, 0.9, 0.3], 1):
            lin.W[...] = step
            saver.save(lin, step=step, metrics={"dev": dev}, training_state={"step": step})
    got = xser.resume(path, checkpoint="best", metric="dev")
    assert (got.step, got.training_state, got.checkpoint.index, got.checkpoint.metrics) == (2, {"step": 2}, 1, {"dev": 0.9})
    assert np.all(got.model.W == 2)
    assert xser.resume(path).step == 3


def _scored(tmp_path, devs):
    from helpers import scored_model

    return scored_model(tmp_path / "m.yaml", devs)


@pytest.mark.parametrize("devs, mode, step", [
    ([0.1, 0.9, 0.3], "max", 2), ([0.1, 0.9, 0.3], "min", 1), ([0.5, float("nan"), 0.2], "max", 1),
    ([None, 0.4, None], "min", 2), ([0.7, 0.7, 0.1], "max", 2),  # ties go to the newer
])
def test_best_checkpoint_everywhere(tmp_path, devs, mode, step):
    path = _scored(tmp_path, devs)
    kw = {"checkpoint": "best", "metric": "dev", "mode": mode}
    assert np.all(xser.load(path, **kw).W == step)
    (sub,) = xser.read_params(path, **kw).values()
    assert np.all(sub["W"] == step)
    assert xser.load_training_state(path, **kw) == {"s": step}
    lin = xser.load(path)
    xser.load_into(lin, path, **kw)
    assert np.all(lin.W == step)
    assert np.all(xser.load(path, checkpoint=xser.Best("dev", mode)).W == step)
    assert np.all(xser.load(path, checkpoint="last").W == len(devs))


BEST_ERRORS = [
    ({"checkpoint": "best"}, 'checkpoint="best" needs metric= (the metric recorded with the checkpoints, e.g. metric="dev_bleu")'),
    ({"checkpoint": 0, "metric": "dev"}, 'metric= only applies to checkpoint="best" (got checkpoint=0)'),
    ({"checkpoint": "newest"}, 'checkpoint must be an int >= 0, "last" or "best" (with metric=), got \'newest\''),
    ({"checkpoint": "best", "metric": "dev", "mode": "up"}, "mode must be 'max' or 'min', got 'up'"),
    ({"checkpoint": "best", "metric": "deev"}, "no checkpoint records a number for metric 'deev' (recorded: dev); did you mean 'dev'?"),
]


@pytest.mark.parametrize("kw, message", BEST_ERRORS)
def test_checkpoint_selection_errors(tmp_path, kw, message):
    path = _scored(tmp_path, [0.1, 0.2])
    with pytest.raises(xser.CheckpointError) as info:
        xser.load(path, **kw)
    assert str(info.value).endswith(message)


def test_load_into_lists_every_shape_and_the_arguments(tmp_path):
    """load_into an object of other sizes: every parameter that differs, and the constructor arguments that made it,
    before anything is read (the object keeps its values)."""
    path = str(tmp_path / "m.yaml")
    saved = Linear(2, 3)
    xser.save(saved, path, durable=False)
    other = Linear(4, 5, init="zeros")
    with pytest.raises(xser.DataError) as info:
        xser.load_into(other, path)
    assert str(info.value) == (
        f"{path}.data/{xser.params(saved).name}: W: (5, 4) float32 in the object, (3, 2) float32 on disk; b: (5,) float32 in "
        "the object, (3,) float32 on disk; constructor argument(s) that differ: in_dim=4 here, 2 saved, out_dim=5 here, 3 saved, "
        "init='zeros' here, 'glorot_uniform' saved (component at the root)"
    )
    assert not other.W.any()


@pytest.mark.parametrize("reader", ["load", "read_params", "load_training_state", "resume", "load_into", "load_config"])
@pytest.mark.parametrize("slot", [0, 1])
def test_a_checkpoint_directory_given_for_the_model_names_the_file(tmp_path, reader, slot):
    """load("m.yaml.data") says which file to give (and which checkpoint), not "m.yaml.data.data"."""
    path = str(tmp_path / "m.yaml")
    lin = Linear(2, 3)
    with xser.CheckpointSaver(path, keep=2) as saver:
        saver.save(lin, step=1, training_state={"x": 1})
        saver.save(lin, step=2, training_state={"x": 2})
    given = path + ".data" + (f".{slot}" if slot else "")
    with pytest.raises(xser.DataError) as info:
        if reader == "load_into":
            xser.load_into(Linear(2, 3), given)
        elif reader == "load_config":
            xser.load_config(given)
        else:
            getattr(xser, reader)(given)
    which = ", with checkpoint=1" if slot else ""
    assert str(info.value) == f"{given}: a checkpoint directory of the model {path}, not a model: give the model's file, {path!r}{which}"


def test_a_model_named_like_a_data_directory_still_loads(tmp_path):
    path = str(tmp_path / "x.data")
    xser.save(Linear(2, 3), path)
    assert xser.load(path).W.shape == (3, 2)
