"""RecIS checkpoints (xser/interop/recis.py, xser/storage/recis_layout.py): the bytes of formats.md §3.4, round trips,
resharding, the reader, bad directories. RecIS itself is not installable here (it needs a GPU build); when `recis`
imports, its CheckpointReader reads what xser wrote."""

from __future__ import annotations

import importlib.util

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from safetensors import safe_open

import xser
from test_tables import TableModel, filled
from xser.interop.recis import export_recis, import_recis, render_files
from xser.storage.recis_layout import gen_slice, slice_string

# formats.md §3.4: one shard, parallel=2, table emb with ids [3, 10] and dim 3, embedding W; dense w = W (F32 [2,3])
W = np.array([[1.5, 0.0, -2.25], [0.1, 1234567.0, 1e-7]], np.float32)
FILE0 = (bytes.fromhex("8800000000000000")
         + b'{"emb.id/part_0_1":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},"w^ ":{"dtype":"F32","shape":[2,3],"data_offsets":[16,40]}}'
         + b" " * 8 + bytes.fromhex("0300000000000000" "0a00000000000000" "0000c03f" "00000000" "000010c0" "cdcccc3d" "38b49649" "95bfd633"))
FILE1 = (bytes.fromhex("5000000000000000") + b'{"emb.embedding/part_0_1":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}' + b"  "
         + bytes.fromhex("0000c03f" "00000000" "000010c0" "cdcccc3d" "38b49649" "95bfd633"))
INDEX = (b'{"block_index":{"emb.embedding/part_0_1":1,"emb.id/part_0_1":0,"w^ ":0},'
         b'"file_index":{"model-000000-of-000002.safetensors":0,"model-000001-of-000002.safetensors":1}}')
TENSORKEY = b'{\n    "emb.embedding/part_0_1": "emb@embedding^00000@65536@65536",\n    "emb.id/part_0_1": "emb@id^00000@65536@65536"\n}'


def flatten(body) -> bytes:
    return body if isinstance(body, bytes) else body[0] + b"".join(np.ascontiguousarray(a).tobytes() for a in body[1:])


def write_worked_example(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, body in render_files({"emb": {"id": np.array([3, 10], np.int64), "embedding": W}}, {"w": W}, shards=1, parallel=2).items():
        (d / name).write_bytes(flatten(body))


class TestWorkedExample:
    def test_bytes(self, tmp_path):
        """The data files, index and tensorkey.json are byte for byte those of formats.md §3.4."""
        write_worked_example(tmp_path / "ck")
        d = tmp_path / "ck"
        assert (d / "model-000000-of-000002.safetensors").read_bytes() == FILE0
        assert (d / "model-000001-of-000002.safetensors").read_bytes() == FILE1
        assert (d / "index").read_bytes() == INDEX
        assert (d / "tensorkey.json").read_bytes() == TENSORKEY
        rank = json.loads((d / "torch_rank_weights_embs_table_multi_shard.json").read_text())
        assert rank["w^ "] == {"dense": True, "dimension": 0, "dtype": "float32", "is_hashmap": False, "name": "w^ ", "shape": [2, 3]}
        assert rank["emb.embedding/part_0_1"]["hashmap_key"] == "emb.id/part_0_1" and rank["emb.embedding/part_0_1"]["dimension"] == 3
        assert rank["emb.id/part_0_1"] == {"data_offsets": [0, 16], "dense": False, "dtype": "I64", "shape": [2]}

    def test_files_open_with_safe_open(self, tmp_path):
        write_worked_example(tmp_path / "ck")
        with safe_open(str(tmp_path / "ck" / "model-000000-of-000002.safetensors"), "np") as f:
            assert f.get_tensor("emb.id/part_0_1").tolist() == [3, 10] and np.array_equal(f.get_tensor("w^ "), W)

    def test_import_and_reader(self, tmp_path):
        write_worked_example(tmp_path / "ck")
        sub = import_recis(tmp_path / "ck", tmp_path / "m.yaml", durable=False)
        m = xser.load(tmp_path / "m.yaml")
        assert m.hash_tables["emb"].ids.tolist() == [3, 10] and np.array_equal(m.hash_tables["emb"].get([3, 10]), W)
        assert np.array_equal(m.tensors["w"], W)
        assert sorted(xser.read_params(tmp_path / "m.yaml")[sub]) == ["emb@embedding", "emb@id", "w"]
        with xser.CheckpointReader(tmp_path / "ck") as r:
            assert r.kind == "recis" and r.tensor_names() == ["emb@embedding", "emb@id", "w"]
            assert r.tensor_shape("emb@embedding") == (2, 3) and r.tensor_dtype("emb@id") == "int64"
            assert np.array_equal(r.read_tensor("w", rows=(1, 2)), W[1:2])
            with pytest.raises(xser.DataError, match="no tensor 'emb'"):
                r.read_tensor("emb")  # RecIS's reader would have matched the prefix


class TestRoundTrip:
    @pytest.mark.parametrize("shards, parallel", [(1, 1), (2, 3), (3, 8)])
    def test_export_import(self, tmp_path, shards, parallel):
        """xser -> RecIS -> xser keeps tables (ids, rows, slots) and dense arrays; files are numbered as RecIS does,
        with gaps where a writer has no block; every file opens with safe_open."""
        m = filled(np.random.default_rng(0).choice(np.arange(-10**6, 10**6), 500, replace=False), seed=3)
        path = str(tmp_path / "m.yaml")
        xser.save(m, path, durable=False)
        written = export_recis(path, tmp_path / "ck", shards=shards, parallel=parallel)
        names = sorted(os.listdir(tmp_path / "ck"))
        data = [n for n in names if n.endswith(".safetensors")]
        assert all(n.endswith(f"-of-{shards * parallel:06d}.safetensors") for n in data) and 1 <= len(data) <= shards * parallel
        need = {"index", "tensorkey.json", "torch_rank_weights_embs_table_multi_shard.json"}
        assert need | ({"model.pt"} if importlib.util.find_spec("torch") else set()) <= set(names)
        assert sorted(os.path.basename(w) for w in written) == names
        for n in data:
            with safe_open(str(tmp_path / "ck" / n), "np") as f:
                assert list(f.keys())
        import_recis(tmp_path / "ck", tmp_path / "back.yaml", durable=False)
        back = xser.load(tmp_path / "back.yaml")
        t = back.hash_tables["emb"]
        assert np.array_equal(t.ids, m.emb.ids) and np.array_equal(t.get(t.ids), m.emb.get(m.emb.ids))
        assert np.array_equal(t.get(t.ids, slot="exp_avg"), m.emb.get(m.emb.ids, slot="exp_avg"))
        assert np.array_equal(back.tensors["bias"], m.bias)

    def test_shards_hold_their_slices(self, tmp_path):
        m = filled(np.arange(0, 70000, 7))
        path = str(tmp_path / "m.yaml")
        xser.save(m, path, durable=False)
        export_recis(path, tmp_path / "ck", shards=3, parallel=2)
        keys = json.loads((tmp_path / "ck" / "tensorkey.json").read_text())
        for k in range(3):
            begin, end, size = gen_slice(k, 3)
            assert keys[f"emb.id/part_{k}_3"] == f"emb@id^{slice_string(begin, end, size)}"
        assert [gen_slice(k, 3)[:2] for k in range(3)] == [(0, 21846), (21846, 43691), (43691, 65536)]
        with xser.CheckpointReader(tmp_path / "ck") as r:
            assert sorted(r.read_tensor("emb@id").tolist()) == m.emb.ids.tolist()

    def test_bool_is_written_as_BOOL_and_read_as_bool_too(self, tmp_path):
        files = render_files({}, {"flag": np.array([True, False])}, parallel=1)
        assert b'"dtype":"BOOL"' in files["model-000000-of-000001.safetensors"][0]
        d = tmp_path / "ck"
        d.mkdir()
        for name, body in files.items():
            raw = flatten(body)
            (d / name).write_bytes(raw.replace(b'"BOOL"', b'"bool"') if name.endswith(".safetensors") else raw)
        with xser.CheckpointReader(d) as r:  # RecIS's own spelling
            assert r.read_tensor("flag").tolist() == [True, False]

    def test_cli(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        xser.save(filled([1, 2, 3]), path, durable=False)
        r = subprocess.run([sys.executable, "-m", "xser", "export", "recis", path, str(tmp_path / "ck"), "--parallel", "2"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([sys.executable, "-m", "xser", "import", "recis", str(tmp_path / "ck"), str(tmp_path / "b.yaml")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert xser.load(tmp_path / "b.yaml").hash_tables["emb"].ids.tolist() == [1, 2, 3]
        r = subprocess.run([sys.executable, "-m", "xser", "inspect", str(tmp_path / "ck")], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.startswith(f"recis model {tmp_path / 'ck'}: 4 tensors")


class TestBad:
    @pytest.mark.parametrize("make, message", [
        (lambda d: (d / "index").write_text("/tmp/x/model-0.safetensors\n/tmp/x/model-1.safetensors\n"), "a RecIS v1 checkpoint"),
        (lambda d: (d / "index").write_text('{"block_index": {}, "file_index": {"../x": 0}}'), "outside the directory"),
        (lambda d: (d / "tensorkey.json").unlink(), "tensorkey.json is missing"),
        (lambda d: (d / "model-000001-of-000002.safetensors").unlink(), "a file the index names is missing"),
        (lambda d: (d / "tensorkey.json").write_text("{}"), "has no internal name in tensorkey.json"),
    ])
    def test_table(self, tmp_path, make, message):
        d = tmp_path / "ck"
        write_worked_example(d)
        make(d)
        with pytest.raises(xser.DataError) as info:
            import_recis(d, tmp_path / "m.yaml")
        assert message in str(info.value)
        assert not (tmp_path / "m.yaml").exists()


def test_recis_itself_reads_our_files(tmp_path):
    recis = pytest.importorskip("recis")
    from recis.serialize.checkpoint_reader import CheckpointReader  # pragma: no cover - needs a RecIS build

    write_worked_example(tmp_path / "ck")  # pragma: no cover
    r = CheckpointReader(str(tmp_path / "ck"))  # pragma: no cover
    assert np.array_equal(r.read_tensor("w").numpy(), W)  # pragma: no cover
    del recis, safetensors


def test_export_of_a_checkpoint_saved_by_several_ranks(tmp_path):
    """Saved by 3 ranks (the table as 3 runs, in blocks): the RecIS directory holds each id in the shard its
    ``id % 65536`` says, in id order, and imports back to the same table and dense tensors."""
    from reshard_model import ALL_IDS, save, t_rows, w_rows

    path = save(str(tmp_path / "m.yaml"), 3, steps=2, blocks={"*/emb@*": 5})
    export_recis(path, tmp_path / "rc", shards=2)
    with xser.CheckpointReader(tmp_path / "rc") as r:
        ids = r.read_tensor("emb@id")  # the shards' slices put together in slice order
    first = (ids.view(np.uint64) % np.uint64(65536)) < np.uint64(gen_slice(0, 2)[1])
    assert ids.tolist() == np.sort(ids[first]).tolist() + np.sort(ids[~first]).tolist() and first[: first.sum()].all()
    import_recis(tmp_path / "rc", tmp_path / "back.yaml", durable=False)
    m = xser.load(tmp_path / "back.yaml")
    t = m.hash_tables["emb"]
    assert t.ids.tolist() == np.sort(ALL_IDS).tolist()
    assert np.array_equal(t.get(t.ids), t_rows(2, t.ids)) and np.array_equal(t.get(t.ids, slot="m"), -t_rows(2, t.ids))
    assert np.array_equal(m.tensors["W"], w_rows(2, 0, 23))
