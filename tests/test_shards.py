"""Packed containers: save(shards=N) writes every npy array into at most N safetensors files, one writer each."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

import xser
from components import Linear, Model, Norm
from strategies import bit_equal, leaf_of


def containers(path: str) -> list[str]:
    return sorted(f for f in os.listdir(path + ".data") if f.endswith(".safetensors"))


class TestPacking:
    @pytest.mark.parametrize("shards", [1, 2, 8])
    def test_round_trip_and_safe_open(self, tmp_path, shards):
        """Every array in the containers, each container readable by safe_open; load, mmap and verify give the bits."""
        arrays = {f"p{i}": np.random.default_rng(i).standard_normal((i + 1, 3)).astype(np.float32) for i in range(12)}
        arrays["flags"] = np.array([True, False, True])
        leaf = leaf_of(arrays)
        path = str(tmp_path / "m.yaml")
        xser.save(leaf, path, shards=shards, durable=False)
        files = containers(path)
        assert files == [f"model-{i:06d}-of-{len(files):06d}.safetensors" for i in range(len(files))] and len(files) == shards
        sub = xser.params(leaf).name
        seen = {}
        for f in files:
            with safe_open(f"{path}.data/{f}", "np") as g:
                for k in g.keys():
                    seen[k] = g.get_tensor(k)
        assert sorted(seen) == sorted(f"{sub}/{k}" for k in arrays)
        assert all(bit_equal(seen[f"{sub}/{k}"], a) for k, a in arrays.items())
        assert os.listdir(f"{path}.data/{sub}") == []
        for kw in ({}, {"mmap": True}, {"verify": True}):
            back = xser.params(xser.load(path, **kw))
            assert all(bit_equal(back[k], a) for k, a in arrays.items()), kw

    def test_fewer_arrays_than_writers(self, tmp_path):
        """Three arrays, eight writers: three files, no empty file, no hang."""
        leaf = leaf_of({f"a{i}": np.full(4, i, np.int32) for i in range(3)})
        path = str(tmp_path / "m.yaml")
        xser.save(leaf, path, shards=8, durable=False)
        assert containers(path) == [f"model-{i:06d}-of-000003.safetensors" for i in range(3)]
        empty = leaf_of({})
        xser.save(empty, str(tmp_path / "e.yaml"), shards=8, durable=False)
        assert containers(str(tmp_path / "e.yaml")) == []

    def test_balanced_by_bytes(self, tmp_path):
        sizes = [1000, 10, 10, 10, 990, 5]
        leaf = leaf_of({f"a{i}": np.zeros(n, np.float32) for i, n in enumerate(sizes)})
        path = str(tmp_path / "m.yaml")
        xser.save(leaf, path, shards=2, durable=False)
        datas = [os.path.getsize(f"{path}.data/{f}") for f in containers(path)]
        assert abs(datas[0] - datas[1]) < 200

    def test_manifest_records_offset_and_length(self, tmp_path):
        leaf = leaf_of({"w": np.arange(12, dtype=np.float32).reshape(3, 4), "v": np.ones(2, np.float64)})
        path = str(tmp_path / "m.yaml")
        xser.save(leaf, path, shards=1, durable=False)
        m = json.loads(Path(path + ".data/manifest.json").read_text())
        sub = xser.params(leaf).name
        (w,) = m["subcollections"][sub]["w"]["blocks"]
        raw = Path(path + ".data/" + w["file"]).read_bytes()
        assert w["key"] == f"{sub}/w" and w["length"] == 48 and w["bytes"] == len(raw)
        assert np.frombuffer(raw[w["offset"] : w["offset"] + 48], np.float32).tolist() == list(range(12))

    def test_row_ranges_read_only_their_bytes(self, tmp_path, monkeypatch):
        """Packed tensors are read with one pread each, of their own bytes (a row range: of its rows)."""
        w = np.arange(1000 * 16, dtype=np.float32).reshape(1000, 16)
        leaf = leaf_of({"w": w, "x": np.ones(7, np.float32)})
        path = str(tmp_path / "m.yaml")
        xser.save(leaf, path, shards=2, durable=False)
        sub = xser.params(leaf).name
        read = []
        real = os.preadv
        monkeypatch.setattr(os, "preadv", lambda fd, bufs, offset: (read.append(sum(memoryview(b).nbytes for b in bufs)), real(fd, bufs, offset))[1])
        assert np.array_equal(xser.read_params(path, rows={f"{sub}/w": (10, 12)})[sub]["w"], w[10:12])
        assert sorted(read) == [28, 2 * 16 * 4]

    def test_blocks_ties_and_training_state(self, tmp_path):
        """Blocks are separate tensors in the containers; a tensor under two names is one key; training state stays npy."""
        m = Model(encoder=Linear(5, 3), decoder=Norm(3))
        path = str(tmp_path / "m.yaml")
        with xser.CheckpointSaver(path, shards=3, blocks={"*/W": 2}, durable=False) as saver:
            saver.save(m, step=1, training_state={"m": np.arange(3.0)})
            m.encoder.b[...] += 1
            report = saver.save(m, step=2, training_state={"m": np.arange(3.0)})
        assert report.linked >= 1  # unchanged containers and state are linked, not rewritten
        back = xser.load(path, verify=True)
        assert np.array_equal(back.encoder.W, m.encoder.W) and np.array_equal(back.encoder.b, m.encoder.b)
        assert xser.load_training_state(path)["m"].tolist() == [0.0, 1.0, 2.0]
        assert os.listdir(path + ".data/training_state") == ["0.npy"]

    def test_bad_shards(self, tmp_path):
        with pytest.raises(xser.DataError, match="shards must be an int >= 1, got 0"):
            xser.save(leaf_of({"a": np.ones(2)}), str(tmp_path / "m.yaml"), shards=0)
        assert not (tmp_path / "m.yaml").exists()

    @pytest.mark.parametrize("edit, message", [
        (lambda b: b.update(offset=10**9), "lie outside the file's"),
        (lambda b: b.update(length=-1), "offset and length must be non-negative ints, got"),
        (lambda b: b.pop("length"), "offset and length come together, with a key"),
    ])
    def test_bad_manifest_spans(self, tmp_path, edit, message):
        leaf = leaf_of({"w": np.ones(4, np.float32)})
        path = str(tmp_path / "m.yaml")
        xser.save(leaf, path, shards=1, durable=False)
        mp = Path(path + ".data/manifest.json")
        m = json.loads(mp.read_text())
        edit(m["subcollections"][xser.params(leaf).name]["w"]["blocks"][0])
        mp.write_text(json.dumps(m))
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert message in str(info.value) and str(info.value).startswith(f"{mp}: corrupt manifest")

    def test_a_span_that_lies_about_the_tensor(self, tmp_path):
        """A manifest whose span is inside the file but of the wrong length: refused before reading."""
        leaf = leaf_of({"w": np.ones(4, np.float32), "v": np.ones(8, np.float32)})
        path = str(tmp_path / "m.yaml")
        xser.save(leaf, path, shards=1, durable=False)
        mp = Path(path + ".data/manifest.json")
        m = json.loads(mp.read_text())
        m["subcollections"][xser.params(leaf).name]["w"]["blocks"][0]["length"] = 8
        mp.write_text(json.dumps(m))
        with pytest.raises(xser.DataError, match="the manifest's 8 bytes at .* do not hold"):
            xser.load(path)

    @settings(max_examples=30, deadline=None)
    @given(n=st.integers(0, 20), shards=st.integers(1, 9))
    def test_any_count(self, tmp_path_factory, n, shards):
        arrays = {f"a{i}": np.full((i % 3 + 1, 2), i, np.int64) for i in range(n)}
        leaf = leaf_of(arrays)
        path = str(tmp_path_factory.mktemp("s") / "m.yaml")
        xser.save(leaf, path, shards=shards, durable=False)
        assert len(containers(path)) == min(n, shards)
        back = xser.params(xser.load(path))
        assert all(bit_equal(back[k], a) for k, a in arrays.items())


class TestDefaultPacking:
    """Without shards=, a save packs its small arrays when it has at least PACK_MIN_ARRAYS of them (issue 23)."""

    def arrays(self, n: int) -> dict:
        out = {f"p{i}": np.full((2, 3), i, np.float32) for i in range(n)}
        out["big"] = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: not under PACK_BELOW, its own .npy
        out["fortran"] = np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3))
        out["big_endian"] = np.arange(3, dtype=">i4")
        return out

    @pytest.mark.parametrize("fault", ["eio", "short", "truncated"])
    @pytest.mark.parametrize("verify", [False, True])
    def test_a_failed_container_read_returns_no_array(self, tmp_path, monkeypatch, fault, verify):
        """A read error inside a packed container (an I/O error, a read cut short by a file truncated after it was
        opened, a file cut short before) fails the whole read with a located DataError: no array whose bytes were not
        read is handed out, verified or not."""
        from xser.storage import batched

        arrays = {f"w{i}": np.full((2,), 7.0, np.float32) for i in range(80)}
        leaf = leaf_of(arrays)
        path = str(tmp_path / "m.yaml")
        xser.save(leaf, path, durable=False)
        (name,) = containers(path)
        file = f"{path}.data/{name}"
        sub = xser.params(leaf).name
        if fault == "eio":
            def preadv(*a):
                raise OSError(5, "Input/output error")

            monkeypatch.setattr(batched.os, "preadv", preadv)
            expect = f"{file}: cannot read tensor '{sub}/w0': Input/output error"
        elif fault == "short":
            monkeypatch.setattr(batched.os, "preadv", lambda *a: 0)
            monkeypatch.setattr(batched, "pread_into", lambda *a: 0)
            expect = f"{file}: file ended inside tensor '{sub}/w0'"
        else:
            size = os.path.getsize(file)
            os.chmod(file, 0o644)
            os.truncate(file, size - 4)
            expect = f"{file}: file has {size - 4} bytes, manifest says {size} (truncated or replaced?)"
        with pytest.raises(xser.DataError) as info:
            xser.read_params(path, verify=verify)
        assert str(info.value) == expect

    def test_small_arrays_packed_in_save_order(self, tmp_path, monkeypatch):
        """64 small arrays: in containers cut at CONTAINER_BYTES, in save order; the others keep their .npy; a second
        save links the unchanged containers; load, mmap, verify and rows give the bits."""
        from xser.storage import plan

        monkeypatch.setattr(plan, "CONTAINER_BYTES", 24 * 20)  # 20 arrays of 24 bytes per container
        arrays = self.arrays(64)
        leaf = leaf_of(arrays)
        path = str(tmp_path / "m.yaml")
        xser.save(leaf, path, durable=False)
        sub = xser.params(leaf).name
        assert containers(path) == [f"model-{i:06d}-of-000004.safetensors" for i in range(4)]
        assert sorted(os.listdir(f"{path}.data/{sub}")) == ["big.npy", "big_endian.npy", "fortran.npy"]
        entries = json.loads(Path(path + ".data/manifest.json").read_text())["subcollections"][sub]
        assert [entries[f"p{i}"]["blocks"][0]["file"][:12] for i in (0, 19, 20, 63)] == ["model-000000", "model-000000",
                                                                                       "model-000001", "model-000003"]
        for mmap, verify in [(False, False), (True, False), (False, True)]:
            got = xser.read_params(path, mmap=mmap, verify=verify)[sub]
            assert list(got) == list(arrays) and all(bit_equal(got[k], a) for k, a in arrays.items())
        assert bit_equal(xser.read_params(path, rows={f"{sub}/p5": (1, 2)})[sub]["p5"], arrays["p5"][1:])
        with xser.CheckpointSaver(path, keep=2, durable=False) as saver:
            saver.save(leaf, step=1)
            xser.params(leaf)["p63"][...] = 7
            report = saver.save(leaf, step=2)
        assert (report.written, report.linked) == (1, 6)  # the last container; three containers and three .npy linked

    def test_pack_false_and_few_arrays_keep_one_npy_each(self, tmp_path):
        """pack=False: the layout np.load reads file by file; fewer than 64 small arrays: the same without asking."""
        for n, pack in [(64, False), (63, True)]:
            arrays = self.arrays(n)
            leaf = leaf_of(arrays)
            path = str(tmp_path / f"m{n}.yaml")
            xser.save(leaf, path, durable=False, pack=pack)
            sub = xser.params(leaf).name
            assert containers(path) == []
            assert bit_equal(np.load(f"{path}.data/{sub}/p{n - 1}.npy"), arrays[f"p{n - 1}"])

    def test_pack_threshold_and_bad_pack(self, tmp_path):
        arrays = self.arrays(64)
        leaf = leaf_of(arrays)
        path = str(tmp_path / "m.yaml")
        xser.save(leaf, path, durable=False, pack=2 << 20)  # "big" (1 MiB) is packed too
        assert os.listdir(f"{path}.data/{xser.params(leaf).name}") and "big.npy" not in os.listdir(f"{path}.data/{xser.params(leaf).name}")
        with pytest.raises(xser.DataError, match=r"^pack must be True, False or a byte size >= 0, got -1$"):
            xser.save(leaf, path, durable=False, pack=-1)

    def test_formats_patterns_exact_and_glob_in_order(self):
        """Patterns: the first in order wins, exact keys found without trying each pattern."""
        from xser.storage.plan import Patterns, format_for

        pats = Patterns({"s/a": "dense-text", "s/*": "sparse-text", "s/b": "npy"})
        assert [format_for(pats, k)[0] for k in ("s/a", "s/b", "s/c", "t/a")] == ["dense-text", "sparse-text", "sparse-text", "npy"]
