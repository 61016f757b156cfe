"""xser.CheckpointReader: one lazy reader by exact name for every layout, and `xser inspect` on any of them."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch tests need torch (the test extra installs it)")
import safetensors.numpy
import safetensors.torch

import xser
from components import Linear, Model, Norm
from strategies import bit_equal
from test_tables import filled

LAYOUTS = {
    "npy": {},
    "blocks": {"blocks": {"*/W": 2}},
    "text": {"formats": {"*/b": "dense-text"}},
    "safetensors": {"formats": {"*": "safetensors"}},
    "packed": {"shards": 2},
    "packed-blocks": {"shards": 3, "blocks": {"*/W": 1}},
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_xser_layout(tmp_path, layout):
    m = Model(encoder=Linear(5, 3), decoder=Norm(3))
    path = str(tmp_path / "m.yaml")
    xser.save(m, path, durable=False, **LAYOUTS[layout])
    enc, dec = xser.params(m.encoder).name, xser.params(m.decoder).name
    with xser.CheckpointReader(path) as r:
        assert r.tensor_names() == sorted([f"{enc}/W", f"{enc}/b", f"{dec}/count", f"{dec}/running_mean"])
        assert r.tensor_shape(f"{enc}/W") == (3, 5) and r.tensor_dtype(f"{enc}/W") == "float32"
        assert r.tensor_dtype(f"{dec}/count") == "int64"
        assert bit_equal(r.read_tensor(f"{enc}/W"), m.encoder.W)
        assert bit_equal(r.read_tensor(f"{enc}/W", rows=(1, 3)), m.encoder.W[1:3])


def test_tables_and_exact_names(tmp_path):
    """Table parts by name; a prefix of a name is not a name (RecIS's reader matched prefixes)."""
    m = filled([3, 1, 2])
    path = str(tmp_path / "m.yaml")
    xser.save(m, path, durable=False)
    sub = xser.params(m).name
    with xser.CheckpointReader(path) as r:
        assert r.tensor_names() == [f"{sub}/bias", f"{sub}/emb@embedding", f"{sub}/emb@exp_avg", f"{sub}/emb@id"]
        assert r.read_tensor(f"{sub}/emb@id").tolist() == [1, 2, 3]
        assert np.array_equal(r.read_tensor(f"{sub}/emb@embedding"), m.emb.get([1, 2, 3]))
        with pytest.raises(xser.DataError) as info:
            r.read_tensor(f"{sub}/emb")
        assert "no tensor" in str(info.value) and "did you mean" in str(info.value)


def test_checkpoints_and_lazy(tmp_path, monkeypatch):
    path = str(tmp_path / "m.yaml")
    lin = Linear(2, 2)
    with xser.CheckpointSaver(path, durable=False) as saver:
        for step in (1, 2):
            lin.W[...] = step
            saver.save(lin, step=step)
    from xser.storage import opened

    reads = []
    real = opened.OpenedDir.read
    monkeypatch.setattr(opened.OpenedDir, "read", lambda self, e, **kw: (reads.append(e.name), real(self, e, **kw))[1])
    sub = xser.params(lin).name
    with xser.CheckpointReader(path, checkpoint=1) as r:
        r.tensor_names(), r.tensor_shape(f"{sub}/W")
        assert reads == []
        assert r.read_tensor(f"{sub}/W").tolist() == [[1, 1], [1, 1]]
    assert reads == ["W"]


def test_a_few_arrays_check_only_their_entries(tmp_path):
    """Reading some arrays by name (the reader, ``read_params(names=)``) checks only their manifest entries: a
    damaged entry of another parameter does not stop them, and is reported, located, when it is read itself."""
    import json

    m = Model(encoder=Linear(5, 3), decoder=Norm(3))
    path = str(tmp_path / "m.yaml")
    xser.save(m, path, durable=False)
    enc = xser.params(m.encoder).name
    mpath = tmp_path / "m.yaml.data" / "manifest.json"
    doc = json.loads(mpath.read_text())
    doc["subcollections"][enc]["b"]["blocks"][0]["file"] = "../outside.npy"
    mpath.chmod(0o644)
    mpath.write_text(json.dumps(doc))
    got = xser.read_params(path, names=[f"{enc}/W", f"{enc}/W"], mmap=True)
    assert list(got) == [enc] and list(got[enc]) == ["W"] and bit_equal(got[enc]["W"], m.encoder.W)
    assert xser.read_params(path, names=[f"{enc}/W"], rows={f"{enc}/W": (1, 3)})[enc]["W"].tolist() == m.encoder.W[1:3].tolist()
    message = f"{mpath}: unsafe file name '../outside.npy' (must be a relative path inside the data directory)"
    with xser.CheckpointReader(path) as r:
        assert f"{enc}/b" in r and f"{enc}/c" not in r and r.keys() == r.tensor_names()
        assert bit_equal(r[f"{enc}/W"], m.encoder.W)
        with pytest.raises(xser.DataError) as info:
            r.read_tensor(f"{enc}/b")
    assert str(info.value) == message
    for names, rows, text in [([f"{enc}/b"], None, message),
                              ([f"{enc}/w"], None, f"{tmp_path / 'm.yaml.data'}: no parameter '{enc}/w'; did you mean '{enc}/W'?"),
                              ([f"{enc}/W"], {f"{enc}/b": (0, 1)}, f"{tmp_path / 'm.yaml.data'}: rows= names parameters that names= leaves out: {enc}/b"),
                              (f"{enc}/W", None, f"{path}: names= is a list of \"subcollection/param\" names, got the string '{enc}/W'")]:
        with pytest.raises(xser.DataError) as info:
            xser.read_params(path, names=names, rows=rows)
        assert str(info.value) == text
    with pytest.raises(xser.DataError) as info:
        xser.read_params(path)  # every entry: checked when the checkpoint is opened, as before
    assert str(info.value) == message


def test_hugging_face_file_and_sharded_directory(tmp_path):
    tensors = {"a.weight": torch.randn(4, 3), "b": torch.arange(5, dtype=torch.int32), "c": torch.randn(2, 2).to(torch.bfloat16)}
    safetensors.torch.save_file(tensors, str(tmp_path / "one.safetensors"))
    with xser.CheckpointReader(tmp_path / "one.safetensors") as r:
        assert r.kind == "safetensors" and r.tensor_names() == ["a.weight", "b", "c"]
        assert r.tensor_dtype("c") == "bfloat16" and r.tensor_shape("a.weight") == (4, 3)
        assert np.array_equal(r.read_tensor("a.weight", rows=(1, 3)), tensors["a.weight"][1:3].numpy())
        assert r.read_tensor("c").view(np.uint16).tobytes() == tensors["c"].view(torch.int16).numpy().tobytes()
        assert r.read_tensor("c").dtype == np.dtype(ml_dtypes.bfloat16)
    d = tmp_path / "hf"
    d.mkdir()
    safetensors.numpy.save_file({"x": np.ones(3, np.float32)}, str(d / "model-00001-of-00002.safetensors"))
    safetensors.numpy.save_file({"y": np.zeros((2, 2), np.float64)}, str(d / "model-00002-of-00002.safetensors"))
    (d / "model.safetensors.index.json").write_text(
        '{"metadata": {}, "weight_map": {"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}')
    with xser.CheckpointReader(d) as r:
        assert r.tensor_names() == ["x", "y"] and r.read_tensor("y").tolist() == [[0, 0], [0, 0]]
    out = subprocess.run([sys.executable, "-m", "xser", "inspect", str(d)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"safetensors model {d}: 2 tensors",
        "  x  (3,)             float32                12 B",
        "  y  (2, 2)           float64                32 B",
        "  total 44 B",
    ]


def test_not_a_model_directory(tmp_path):
    with pytest.raises(xser.DataError, match="not a model directory"):
        xser.CheckpointReader(tmp_path)


def test_a_checkpoint_saved_by_several_ranks(tmp_path):
    """Saved by 3 ranks (the table in blocks of 5 rows): the reader gives whole parameters and row ranges across the
    ranks' blocks, and a table's parts row by row aligned (ids sorted within each rank's run)."""
    from reshard_model import ALL_IDS, save, t_rows, w_rows

    path = save(str(tmp_path / "m.yaml"), 3, steps=2, blocks={"*/emb@*": 5})
    with xser.CheckpointReader(path) as r:
        (sub,) = {n.partition("/")[0] for n in r.tensor_names()}
        assert r.tensor_names() == [f"{sub}/{n}" for n in ("W", "b", "emb@embedding", "emb@id", "emb@m")]
        assert np.array_equal(r.read_tensor(f"{sub}/W"), w_rows(2, 0, 23))
        assert np.array_equal(r.read_tensor(f"{sub}/W", rows=(5, 17)), w_rows(2, 5, 17))
        ids = r.read_tensor(f"{sub}/emb@id")
        assert sorted(ids.tolist()) == sorted(ALL_IDS.tolist()) and r.tensor_shape(f"{sub}/emb@embedding") == (ids.size, 4)
        assert np.array_equal(r.read_tensor(f"{sub}/emb@embedding"), t_rows(2, ids))
        assert np.array_equal(r.read_tensor(f"{sub}/emb@m", rows=(3, 40)), -t_rows(2, ids[3:40]))
