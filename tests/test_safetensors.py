"""safetensors: the weight format (one file per subcollection), HF export and import (xser/interop/safetensors.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch tests need torch (the test extra installs it)")
import safetensors.torch  # noqa: E402
import safetensors.numpy
from safetensors import safe_open

import xser
import xser.torch as xt
from components import Linear, Model, Norm
from strategies import bit_equal, leaf_of
from xser.interop.safetensors import export_safetensors, import_safetensors, parse_size
from xser.storage.dtypes import DTYPES
from xser.tools.average import average

HERE = os.path.dirname(os.path.abspath(__file__))
ST_TAGS = sorted(t for t, d in DTYPES.items() if d.safetensors)


def sample(tag: str, shape=(3, 4), seed=0) -> np.ndarray:
    dt = np.dtype(getattr(ml_dtypes, tag)) if DTYPES[tag].extension else np.dtype(tag)
    raw = np.random.default_rng(seed).integers(0, 256, size=shape + (dt.itemsize,), dtype=np.uint8)
    if tag == "bool":
        raw &= 1
    return raw.view(dt).reshape(shape)


def torch_model():
    sys.path.insert(0, HERE)
    from test_torch import model, train

    m = model()
    train(m)
    return m


class TestWeightFormat:
    def test_one_file_per_subcollection_read_by_safe_open(self, tmp_path):
        """Every table dtype safetensors knows: one file per subcollection, read by safe_open (numpy and torch)."""
        arrays = {f"t_{tag}": sample(tag) for tag in ST_TAGS}
        leaf = leaf_of(arrays)
        path = str(tmp_path / "m.yaml")
        xser.save(leaf, path, formats={"*": "safetensors"}, durable=False)
        sub = xser.params(leaf).name
        assert sorted(os.listdir(f"{path}.data/{sub}")) == ["params.safetensors"]
        file = f"{path}.data/{sub}/params.safetensors"
        with safe_open(file, "pt") as f:
            assert sorted(f.keys()) == sorted(arrays)
            for k, a in arrays.items():
                t = f.get_tensor(k)
                assert str(t.dtype) == f"torch.{k[2:]}" and t.view(-1).view(torch.uint8).numpy().tobytes() == a.tobytes(), k
        numpy_tags = [t for t in ST_TAGS if not DTYPES[t].extension]
        with safe_open(file, "np") as f:
            for tag in numpy_tags:
                assert bit_equal(f.get_tensor(f"t_{tag}"), arrays[f"t_{tag}"])
        for mmap in (False, True):
            back = xser.params(xser.load(path, mmap=mmap, verify=not mmap))
            for k, a in arrays.items():
                assert bit_equal(back[k], a), (k, mmap)

    @pytest.mark.parametrize("value, message", [
        (np.zeros(2, np.complex128), "safetensors has no dtype for complex128"),
        (np.zeros(2, [("a", "<f4")]), "safetensors has no dtype for [('a', '<f4')]"),
        (np.zeros(2, "<U3"), "safetensors has no dtype for <U3"),
    ])
    def test_dtypes_it_cannot_hold_are_refused(self, tmp_path, value, message):
        path = str(tmp_path / "m.yaml")
        with pytest.raises(xser.DataError) as info:
            xser.save(leaf_of({"w": value}), path, formats={"*": "safetensors"}, durable=False)
        assert message in str(info.value)
        assert not Path(path).exists()

    def test_declared_per_parameter_and_mixed_with_npy(self, tmp_path):
        """add(format="safetensors") puts that parameter in the subcollection's file; the others stay npy."""
        path = str(tmp_path / "m.yaml")
        m = Model(encoder=Linear(5, 3), decoder=Norm(3))
        xser.save(m, path, formats={"*/W": "safetensors"}, durable=False)
        sub = xser.params(m.encoder).name
        assert sorted(os.listdir(f"{path}.data/{sub}")) == ["b.npy", "params.safetensors"]
        back = xser.load(path, verify=True)
        assert np.array_equal(back.encoder.W, m.encoder.W) and np.array_equal(back.encoder.b, m.encoder.b)

    def test_row_ranges_read_only_their_bytes(self, tmp_path, monkeypatch):
        """Packed tensors are read with one pread each, of their own bytes (a row range: of its rows)."""
        path = str(tmp_path / "m.yaml")
        w = np.arange(1000 * 64, dtype=np.float32).reshape(1000, 64)
        leaf = leaf_of({"w": w, "v": np.ones(10, np.float32)})
        xser.save(leaf, path, formats={"*": "safetensors"}, durable=False)
        sub = xser.params(leaf).name
        read = []
        real = os.preadv
        monkeypatch.setattr(os, "preadv", lambda fd, bufs, offset: (read.append(sum(memoryview(b).nbytes for b in bufs)), real(fd, bufs, offset))[1])
        got = xser.read_params(path, rows={f"{sub}/w": (500, 510)})[sub]["w"]
        assert np.array_equal(got, w[500:510])
        assert sorted(read) == [40, 10 * 64 * 4]

    def test_checksum_covers_the_file_and_is_checked_once(self, tmp_path, monkeypatch):
        from xser.storage.disk import dirhandle

        path = str(tmp_path / "m.yaml")
        leaf = leaf_of({f"p{i}": np.full(4, i, np.float32) for i in range(6)})
        xser.save(leaf, path, formats={"*": "safetensors"}, durable=False)
        sub = xser.params(leaf).name
        calls = []
        real = dirhandle.digest_stream
        monkeypatch.setattr(dirhandle, "digest_stream", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
        xser.load(path, verify=True)
        assert len(calls) == 1
        file = Path(f"{path}.data/{sub}/params.safetensors")
        os.chmod(file, 0o644)
        raw = bytearray(file.read_bytes())
        raw[-1] ^= 1
        file.write_bytes(bytes(raw))
        with pytest.raises(xser.DataError, match="checksum mismatch"):
            xser.load(path, verify=True)

    def test_unchanged_file_is_linked_by_the_next_checkpoint(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        m = Model(encoder=Linear(5, 3), decoder=Norm(3))
        with xser.CheckpointSaver(path, durable=False, formats={"*": "safetensors"}) as saver:
            saver.save(m, step=1)
            m.encoder.W[...] += 1
            saver.save(m, step=2)
        enc, dec = xser.params(m.encoder).name, xser.params(m.decoder).name
        ino = lambda slot, sub: os.stat(f"{path}{slot}/{sub}/params.safetensors").st_ino  # noqa: E731
        assert ino(".data", dec) == ino(".data.1", dec) and ino(".data", enc) != ino(".data.1", enc)

    def test_tied_tensors_are_one_key(self, tmp_path):
        sys.path.insert(0, HERE)
        from test_torch import TiedLM

        path = str(tmp_path / "m.yaml")
        m = TiedLM()
        xser.save(m, path, formats={"*": "safetensors"}, durable=False)
        with safe_open(f"{path}.data/{xser.params(m).name}/params.safetensors", "pt") as f:
            assert list(f.keys()) == ["emb.weight"]
        back = xser.load(path)
        assert back.proj.weight is back.emb.weight and torch.equal(back.emb.weight, m.emb.weight)

    BAD = [
        (lambda raw: (1 << 40).to_bytes(8, "little") + raw[8:], "not a safetensors file: header length 1099511627776"),
        (lambda raw: raw[:8] + b"[" + raw[9:], "safetensors header is not JSON"),
        (lambda raw: raw.replace(b'"data_offsets":[0,', b'"data_offsets":[4,'), "safetensors tensor 'w': data_offsets [4, 48] do not hold shape (3, 4) float32 in 48 data bytes"),
        (lambda raw: raw.replace(b'"F32"', b'"F99"'), "safetensors tensor 'w': dtype 'F99' is not one xser reads"),
    ]

    @pytest.mark.parametrize("edit, message", BAD, ids=[m for _, m in BAD])
    def test_bad_files(self, tmp_path, edit, message):
        """A tampered file is a DataError naming it, never a numpy or JSON traceback. (The manifest's offsets are
        dropped, as in a file linked by a tool, so the header is what locates the tensor.)"""
        path = str(tmp_path / "m.yaml")
        leaf = leaf_of({"w": np.ones((3, 4), np.float32)})
        xser.save(leaf, path, formats={"*": "safetensors"}, durable=False)
        file = Path(f"{path}.data/{xser.params(leaf).name}/params.safetensors")
        os.chmod(file, 0o644)
        file.write_bytes(edit(file.read_bytes()))
        m = json.loads(Path(f"{path}.data/manifest.json").read_text())
        import xxhash

        for e in m["subcollections"].values():
            for p in e.values():
                p["blocks"][0]["bytes"] = file.stat().st_size
                p["blocks"][0]["xxh3_64"] = xxhash.xxh3_64_hexdigest(file.read_bytes())
                del p["blocks"][0]["offset"], p["blocks"][0]["length"]
        Path(f"{path}.data/manifest.json").write_text(json.dumps(m))
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert str(info.value).startswith(f"{file}: {message}")


class TestExport:
    def test_single_file_loads_in_safetensors_torch(self, tmp_path):
        m = torch_model()
        path = str(tmp_path / "m.yaml")
        xser.save(m, path, durable=False)
        report = export_safetensors(path, tmp_path / "hf")
        assert sorted(os.listdir(tmp_path / "hf")) == ["model.safetensors"] and report.keys == 9
        loaded = safetensors.torch.load_file(str(tmp_path / "hf" / "model.safetensors"))
        view = xt.state_dict(path)
        assert sorted(loaded) == sorted(view)
        for k in view:
            assert torch.equal(loaded[k], view[k]), k
        with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
            meta = f.metadata()
        assert meta["format"] == "pt" and meta["xser_spec"] == Path(path).read_text()

    def test_sharded_with_index(self, tmp_path):
        m = torch_model()
        path = str(tmp_path / "m.yaml")
        xser.save(m, path, durable=False)
        out = tmp_path / "hf"
        r = subprocess.run([sys.executable, "-m", "xser", "export", "safetensors", path, str(out), "--max-shard-size", "100B"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        index = json.loads((out / "model.safetensors.index.json").read_text())
        shards = sorted(set(index["weight_map"].values()))
        assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)] and len(shards) > 2
        assert sorted(os.listdir(out)) == sorted(shards + ["model.safetensors.index.json"])
        merged = {}
        for s in shards:
            part = safetensors.torch.load_file(str(out / s))
            assert sum(t.numel() * t.element_size() for t in part.values()) <= 100 or len(part) == 1
            merged.update(part)
        assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in merged.values())
        assert r.stdout.splitlines()[-1] == f"wrote {out}/model.safetensors.index.json"
        view = xt.state_dict(path)
        assert all(torch.equal(merged[k], view[k]) for k in view) and sorted(merged) == sorted(view)

    def test_existing_output_needs_force(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        xser.save(leaf_of({"w": np.ones(3, np.float32)}), path, durable=False)
        (tmp_path / "hf").mkdir()
        (tmp_path / "hf" / "keep").write_text("x")
        with pytest.raises(xser.CheckpointError, match="the output exists; remove it or pass --force"):
            export_safetensors(path, tmp_path / "hf")
        assert (tmp_path / "hf" / "keep").exists()
        export_safetensors(path, tmp_path / "hf", force=True)
        assert os.listdir(tmp_path / "hf") == ["model.safetensors"]
        assert sorted(os.listdir(tmp_path)) == ["hf", "m.yaml", "m.yaml.data"]

    def test_complex128_is_refused(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        leaf = leaf_of({"z": np.zeros(2, np.complex128)})
        xser.save(leaf, path, durable=False)
        with pytest.raises(xser.DataError, match="z is complex128: safetensors has no such dtype"):
            export_safetensors(path, tmp_path / "hf")
        assert not (tmp_path / "hf").exists()

    @pytest.mark.parametrize("text, size", [("5GB", 5 * 10**9), ("500MB", 500 * 10**6), ("2GiB", 2 << 30), ("100", 100), (7, 7)])
    def test_sizes(self, text, size):
        assert parse_size(text) == size

    def test_bad_size(self):
        with pytest.raises(xser.DataError, match="shard size must look like 5GB"):
            parse_size("five")


def hf_dir(tmp_path, tensors: dict, shards: int = 2) -> Path:
    """An HF sharded directory written by the safetensors library itself."""
    out = tmp_path / "hf"
    out.mkdir()
    keys = list(tensors)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in keys[i::shards]}
        safetensors.torch.save_file(part, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return out


class TestImport:
    def test_sharded_directory_imported_and_averaged(self, tmp_path):
        """An HF directory (two shards, bf16 and fp32) becomes an xser model; read_params, inspect and avg work on it."""
        g = torch.Generator().manual_seed(0)
        tensors = {
            "model.embed.weight": torch.randn(6, 4, generator=g).to(torch.bfloat16),
            "model.layers.0.weight": torch.randn(4, 4, generator=g),
            "model.layers.0.bias": torch.randn(4, generator=g),
            "model.steps": torch.tensor([3], dtype=torch.int64),
        }
        src = hf_dir(tmp_path, tensors)
        out = str(tmp_path / "imp.yaml")
        r = subprocess.run([sys.executable, "-m", "xser", "import", "safetensors", str(src), out], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        (sub, params), = xser.read_params(out).items()
        assert sorted(params) == sorted(tensors)
        for k, t in tensors.items():
            assert torch.equal(xt.from_numpy(params[k]), t), k
        # two more checkpoints of it, then the mean of the three
        m = xser.load(out)
        arrays = xser.params(m)
        with xser.CheckpointSaver(out, keep=5, durable=False) as saver:
            for step in (1, 2):
                arrays["model.layers.0.weight"][...] += step
                arrays["model.embed.weight"][...] = (arrays["model.embed.weight"].astype(np.float32) * 2).astype(ml_dtypes.bfloat16)
                saver.save(m, step=step)
        report = average(out, tmp_path / "avg.yaml")
        avg = xser.params(xser.load(tmp_path / "avg.yaml"))
        w0 = tensors["model.layers.0.weight"].numpy()
        w1 = w0 + np.float32(1)
        w2 = w1 + np.float32(2)
        mean = (w0.astype(np.float64) + w1.astype(np.float64) + w2.astype(np.float64)) / 3
        assert np.array_equal(avg["model.layers.0.weight"], mean.astype(np.float32))
        e0 = tensors["model.embed.weight"].float().numpy().astype(np.float64)
        from xser.storage.dtypes import round_into

        expect = np.empty(e0.shape, ml_dtypes.bfloat16)
        round_into(expect, (e0 + 2 * e0 + 4 * e0) / 3)
        assert bit_equal(avg["model.embed.weight"], expect)
        assert avg["model.steps"].tolist() == [3] and len(report.copied) == 1

    def test_import_streams_tensors(self, tmp_path):
        """Import copies tensor by tensor, in chunks: peak memory is far below the model's size."""
        tensors = {f"w{i}": torch.full((1024, 1024), float(i)) for i in range(8)}  # 32 MiB
        src = tmp_path / "one.safetensors"
        safetensors.torch.save_file(tensors, str(src))
        tracemalloc.start()
        try:
            import_safetensors(src, tmp_path / "imp.yaml", durable=False)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 12 << 20
        params = next(iter(xser.read_params(tmp_path / "imp.yaml").values()))
        assert all(params[f"w{i}"][0, 0] == i for i in range(8))

    def test_safetensors_output_format_and_export_round_trip(self, tmp_path):
        tensors = {"a.weight": torch.randn(3, 2), "b": torch.arange(4, dtype=torch.int32)}
        safetensors.torch.save_file(tensors, str(tmp_path / "x.safetensors"))
        name = import_safetensors(tmp_path / "x.safetensors", tmp_path / "imp.yaml", format="safetensors", durable=False)
        assert os.listdir(tmp_path / f"imp.yaml.data/{name}") == ["params.safetensors"]
        export_safetensors(tmp_path / "imp.yaml", tmp_path / "hf")
        back = safetensors.torch.load_file(str(tmp_path / "hf" / "model.safetensors"))
        assert sorted(back) == sorted(tensors) and all(torch.equal(back[k], tensors[k]) for k in tensors)

    @pytest.mark.parametrize("make, message", [
        (lambda d: (d / "model.safetensors.index.json").write_text('{"weight_map": {"a": "../x.safetensors"}}'),
         "index names '../x.safetensors', which is not a file of this directory"),
        (lambda d: (d / "model.safetensors.index.json").write_text('{"weights": {}}'), 'not a safetensors index: it must hold {"weight_map": {key: file name}}'),
        (lambda d: None, "not a model directory: neither model.safetensors.index.json nor model.safetensors is in it"),
        (lambda d: safetensors.numpy.save_file({"1bad": np.zeros(1, np.float32)}, str(d / "model.safetensors")),
         "tensor name '1bad' cannot be an xser parameter name"),
    ])
    def test_bad_sources(self, tmp_path, make, message):
        d = tmp_path / "hf"
        d.mkdir()
        make(d)
        with pytest.raises(xser.DataError) as info:
            import_safetensors(d, tmp_path / "imp.yaml")
        assert message in str(info.value)
        assert not (tmp_path / "imp.yaml").exists()


def test_inspect_counts_shared_files_once(tmp_path):
    """inspect: a bundled parameter shows its own bytes and its file; a tied one says with what it is stored;
    totals and --verify count each file once."""
    from xser.tools.inspect import open_model, verify_model

    sys.path.insert(0, HERE)
    from test_torch import model

    m = model()
    path = str(tmp_path / "m.yaml")
    xser.save(m, path, formats={"*": "safetensors"}, durable=False)
    enc, dec = xser.params(m.encoder).name, xser.params(m.decoder).name
    view = open_model(path)
    try:
        text = "\n".join(view.lines())
    finally:
        view.data.close()
    sizes = sum(os.path.getsize(f"{path}.data/{s}/params.safetensors") for s in (enc, dec))
    assert f"subcollections: 2, 9 params, {sizes:,} bytes on disk" in text
    assert f"out.weight  (11, 4)        float32           176 B  (in params.safetensors)  (stored once with {enc}/emb.weight)" in text
    assert verify_model(path) == ["checkpoint 0 (m.yaml.data): 3 files match their checksums; spec and data belong together"]


def test_tools_on_a_safetensors_model(tmp_path):
    """convert links the subcollection files once (keys kept); avg reads by key (its output is npy)."""
    from xser.tools.convert import convert

    path = str(tmp_path / "m.yaml")
    m = Model(encoder=Linear(5, 3), decoder=Norm(3))
    with xser.CheckpointSaver(path, formats={"*": "safetensors"}, durable=False) as saver:
        saver.save(m, step=1)
        w0 = m.encoder.W.copy()
        m.encoder.W[...] += 2
        saver.save(m, step=2)
    report = convert(path, tmp_path / "c.yaml", checkpoint=1)
    conv = xser.read_params(tmp_path / "c.yaml", verify=True)
    old = xser.read_params(path, checkpoint=1)
    assert {report.renamed[s]: {k: v.tolist() for k, v in p.items()} for s, p in old.items()} == {
        s: {k: v.tolist() for k, v in p.items()} for s, p in conv.items()}
    assert sorted(str(f.relative_to(tmp_path / "c.yaml.data")) for f in (tmp_path / "c.yaml.data").rglob("*.safetensors")) == sorted(
        f"{s}/params.safetensors" for s in conv)
    average(path, tmp_path / "avg.yaml")
    avg = xser.load(tmp_path / "avg.yaml", verify=True)
    assert np.array_equal(avg.encoder.W, ((w0.astype(np.float64) + m.encoder.W.astype(np.float64)) / 2).astype(np.float32))


def test_declared_format_in_a_component(tmp_path):
    """add(..., format="safetensors") in a torch component: that tensor goes to the subcollection's file."""
    @xser.serializable(tag="!TStDecl")
    class Declared(torch.nn.Module):
        def __attrs_post_init__(self):
            self.w = xser.params(self).add("w", (2, 3), init="ones", format="safetensors")
            self.v = xser.params(self).add("v", 4, trainable=False)

    m = Declared()
    assert isinstance(m.w, torch.nn.Parameter) and dict(m.named_buffers()) == {"v": m.v}
    path = str(tmp_path / "m.yaml")
    xser.save(m, path, durable=False)
    assert sorted(os.listdir(f"{path}.data/{xser.params(m).name}")) == ["params.safetensors", "v.npy"]
    back = xser.load(path)
    assert torch.equal(back.w, m.w) and torch.equal(back.v, m.v)


def test_export_of_a_checkpoint_saved_by_several_ranks(tmp_path):
    """Saved by 3 ranks (rows of W and the table's runs in blocks): one safetensors file with every row of W and the
    table's parts aligned row by row."""
    from reshard_model import ALL_IDS, save, t_rows, w_rows

    path = save(str(tmp_path / "m.yaml"), 3, steps=2, blocks={"*/emb@*": 5, "*/W": 4})
    report = export_safetensors(path, tmp_path / "hf")
    got = safetensors.numpy.load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert report.keys == 5 and np.array_equal(got["W"], w_rows(2, 0, 23)) and np.array_equal(got["b"], np.arange(3, dtype=np.float32) + 2)
    assert sorted(got["emb@id"].tolist()) == sorted(ALL_IDS.tolist())
    assert np.array_equal(got["emb@embedding"], t_rows(2, got["emb@id"])) and np.array_equal(got["emb@m"], -t_rows(2, got["emb@id"]))
