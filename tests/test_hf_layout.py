"""Reading other systems' safetensors files untrusted (xser/storage/hf_layout.py, recis_layout.py, jsonlimit.py,
formats/safetensors.py): the safetensors library's header limits, special files never waited for, RecIS tables whose
parts disagree, hash tables through a safetensors export and import, and structural fuzzing of every importer here
(safetensors file, HF directory, RecIS directory) until nothing but an XserError comes out."""

from __future__ import annotations

import json
import os
import signal
import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import safetensors
import safetensors.numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xser
from test_fuzz import mutated, within_the_rules
from test_recis import write_worked_example
from test_tables import filled
from xser.interop.recis import import_recis, render_files
from xser.interop.safetensors import export_safetensors, import_safetensors
from xser.storage.jsonlimit import MAX_DEPTH, nesting_depth

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def st_file(path: Path, header: str | bytes, data: bytes = b"\0" * 8) -> Path:
    raw = header.encode() if isinstance(header, str) else header
    raw += b" " * (-(8 + len(raw)) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def nested(depth: int) -> str:
    """A header whose deepest value nests ``depth`` arrays/objects, the header object counted."""
    inner = depth - 2
    return '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":' + "[" * inner + "]" * inner + "}}"


def library(path: Path) -> str:
    """What the safetensors library says of a file: "ok" or its error."""
    try:
        safetensors.numpy.load_file(str(path))
        return "ok"
    except Exception as e:  # noqa: BLE001 (the library raises its own class)
        return type(e).__name__


def refused(call) -> str:
    with pytest.raises(xser.DataError) as info:
        call()
    return info.value.message


#: the header limits: case -> (header, data bytes, the safetensors library's verdict, xser's message)
HEADERS = {
    "depth 127": (nested(127), b"\0" * 8, "ok", None),
    "depth 128": (nested(128), b"\0" * 8, "SafetensorError",
                  "safetensors header nests 128 levels deep; at most 127 are read (the safetensors library's limit)"),
    "duplicate key": ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}',
                      b"\0" * 8, "ok", "safetensors header has the key 'a' twice in one object"),
    "duplicate metadata key": ('{"__metadata__":{"x":"1","x":"2"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
                               b"\0" * 8, "ok", "safetensors header has the key 'x' twice in one object"),
    "gap": ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8, "SafetensorError",
            "safetensors tensor 'a' starts at data byte 4, not 0 where the tensor before it ends (the tensors' bytes must follow "
            "each other without gaps)"),
    "trailing bytes": ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 8, "SafetensorError",
                       "safetensors tensors end at data byte 4 but the file holds 8 data bytes"),
    "brackets in strings": ('{"__metadata__":{"x":"' + "[" * 500 + '\\""},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
                            b"\0" * 8, "ok", None),
}


class TestHeader:
    @pytest.mark.parametrize("case", sorted(HEADERS))
    def test_limits_as_the_safetensors_library(self, tmp_path, case):
        """Each header as the safetensors library judges it; xser reads what it reads, refuses what it refuses, and
        (stricter) a key given twice, where the library silently takes the last."""
        header, data, verdict, message = HEADERS[case]
        f = st_file(tmp_path / "x.safetensors", header, data)
        assert library(f) == verdict
        if message is None:
            import_safetensors(f, tmp_path / "m.yaml", durable=False)
        else:
            assert refused(lambda: import_safetensors(f, tmp_path / "m.yaml", durable=False)) == message
            assert not (tmp_path / "m.yaml").exists()

    @pytest.mark.parametrize("n, verdict", [(100_000_001, "SafetensorError"), (99 << 20, "SafetensorError")])
    def test_header_size_limit_is_checked_before_reading(self, tmp_path, n, verdict):
        """The library's MAX_HEADER_SIZE is 100,000,000 bytes (so a 99 MiB header is over it): refused at once, nothing read."""
        f = tmp_path / "big.safetensors"
        with open(f, "wb") as fh:
            fh.write(struct.pack("<Q", n))
            fh.truncate(8 + n + 8)  # sparse: the bytes are never there
        assert library(f) == verdict
        tracemalloc.start()
        t0 = time.perf_counter()
        try:
            message = refused(lambda: import_safetensors(f, tmp_path / "m.yaml", durable=False))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert message == f"not a safetensors file: header length {n} (file has {8 + n + 8} bytes, limit 100000000)"
        assert time.perf_counter() - t0 < 2 and peak < 1 << 20

    def test_nesting_is_counted_without_recursion(self):
        deep = b"[" * 100_000 + b"]" * 100_000
        assert nesting_depth(deep) == 100_000
        assert nesting_depth(b'{"a": "[[[{{", "b": ["\\"[", [1]]}') == 3
        assert MAX_DEPTH == 127

    def test_deep_index_and_tensorkey(self, tmp_path):
        """HF and RecIS metadata JSON has the same limits: no RecursionError out of json."""
        d = tmp_path / "hf"
        d.mkdir()
        (d / "model.safetensors.index.json").write_text('{"weight_map": ' + "[" * 50_000 + "]" * 50_000 + "}")
        assert refused(lambda: import_safetensors(d, tmp_path / "m.yaml")) == \
            "safetensors index nests 50001 levels deep; at most 127 are read (the safetensors library's limit)"
        r = tmp_path / "ck"
        write_worked_example(r)
        (r / "tensorkey.json").write_text("[" * 50_000 + "]" * 50_000)
        assert refused(lambda: import_recis(r, tmp_path / "r.yaml")) == \
            "tensorkey.json nests 50000 levels deep; at most 127 are read (the safetensors library's limit)"
        (r / "index").write_text('{"block_index": {}, "block_index": {}, "file_index": {}}')
        assert refused(lambda: import_recis(r, tmp_path / "r.yaml")) == "index has the key 'block_index' twice in one object"


class _Hang(Exception):
    pass


@pytest.fixture
def no_hang():
    """A blocking open fails the test after 10 s instead of hanging the suite."""
    def alarm(*_):
        raise _Hang("blocked")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


FIFO = "{what} is not a regular file (a FIFO: never read, as it could block forever)"


class TestSpecialFiles:
    @pytest.mark.parametrize("victim, what", [
        ("model.safetensors", "the safetensors file"),
        ("model.safetensors.index.json", "the metadata file"),
        ("model-00001-of-00002.safetensors", "the safetensors file"),
    ])
    def test_hf_directory(self, tmp_path, no_hang, victim, what):
        d = tmp_path / "hf"
        d.mkdir()
        if victim != "model.safetensors":
            safetensors.numpy.save_file({"a": np.ones(2, np.float32)}, str(d / "model-00002-of-00002.safetensors"))
            if victim != "model.safetensors.index.json":
                (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
                    "b": "model-00001-of-00002.safetensors", "a": "model-00002-of-00002.safetensors"}}))
        os.mkfifo(d / victim)
        assert refused(lambda: import_safetensors(d, tmp_path / "m.yaml")) == FIFO.format(what=what)
        with pytest.raises(xser.DataError) as info:
            xser.CheckpointReader(d)
        assert info.value.message == FIFO.format(what=what)

    def test_a_fifo_as_the_file(self, tmp_path, no_hang):
        os.mkfifo(tmp_path / "x.safetensors")
        assert refused(lambda: import_safetensors(tmp_path / "x.safetensors", tmp_path / "m.yaml")) == \
            FIFO.format(what="the safetensors file")

    @pytest.mark.parametrize("victim, what", [
        ("index", "the metadata file"), ("tensorkey.json", "the metadata file"),
        ("model-000000-of-000002.safetensors", "the RecIS data file"), ("model-000001-of-000002.safetensors", "the RecIS data file"),
    ])
    def test_recis(self, tmp_path, no_hang, victim, what):
        d = tmp_path / "ck"
        write_worked_example(d)
        (d / victim).unlink()
        os.mkfifo(d / victim)
        assert refused(lambda: import_recis(d, tmp_path / "m.yaml")) == FIFO.format(what=what)


def recis_dir(d: Path, tables: dict, dense: dict, shards: int = 1, parallel: int = 2, replace: dict | None = None) -> Path:
    """A RecIS directory as xser's export writes it; then the blocks named in ``replace`` get other arrays (their files
    rewritten by the safetensors library: another length, dtype or rank than RecIS would write)."""
    d.mkdir(parents=True, exist_ok=True)
    for name, body in render_files(tables, dense, shards=shards, parallel=parallel).items():
        raw = body if isinstance(body, bytes) else body[0] + b"".join(np.ascontiguousarray(a).tobytes() for a in body[1:])
        (d / name).write_bytes(raw)
    index = json.loads((d / "index").read_text())
    files = {v: k for k, v in index["file_index"].items()}
    for key, arr in (replace or {}).items():
        f = str(d / files[index["block_index"][key]])
        blocks = safetensors.numpy.load_file(f)
        blocks[key] = arr
        safetensors.numpy.save_file(blocks, f)
    return d


IDS = np.array([3, 10, 70000], np.int64)
ROWS = np.arange(9, dtype=np.float32).reshape(3, 3)
RECIS_ERRORS = {
    "short embedding": ({"emb.embedding/part_0_1": np.ones((2, 3), np.float32)},
                        "hash table 'emb': block 'emb.embedding/part_0_1' holds 2 rows, its slice's id block 'emb.id/part_0_1' 3 ids"),
    "long slot": ({"emb.m/part_0_1": np.ones((4, 3), np.float32)},
                  "hash table 'emb': block 'emb.m/part_0_1' holds 4 rows, its slice's id block 'emb.id/part_0_1' 3 ids"),
    "0-d embedding": ({"emb.embedding/part_0_1": np.ones((), np.float32)},
                      "hash table 'emb': block 'emb.embedding/part_0_1' holds no rows, its slice's id block 'emb.id/part_0_1' 3 ids"),
    "float ids": ({"emb.id/part_0_1": IDS.astype(np.float64)},
                  "hash table 'emb': id block 'emb.id/part_0_1' is float64 of shape [3]; ids are a 1-D int64 array"),
    "2-d ids": ({"emb.id/part_0_1": IDS.reshape(3, 1)},
                "hash table 'emb': id block 'emb.id/part_0_1' is int64 of shape [3, 1]; ids are a 1-D int64 array"),
    "slot of another row shape": ({"emb.m/part_0_1": np.ones((3, 2), np.float32)},
                                  "hash table 'emb': part 'm' has rows of another shape or dtype than its embedding"),
}


class TestRecisTables:
    @pytest.mark.parametrize("case", sorted(RECIS_ERRORS))
    def test_parts_that_disagree(self, tmp_path, case):
        """Before: IndexError (a short part) or rows silently dropped (a long one)."""
        replace, message = RECIS_ERRORS[case]
        d = recis_dir(tmp_path / "ck", {"emb": {"id": IDS, "embedding": ROWS, "m": ROWS}}, {}, replace=replace)
        assert refused(lambda: import_recis(d, tmp_path / "m.yaml", durable=False)) == message
        assert not (tmp_path / "m.yaml").exists()

    def test_slices_of_another_length_with_the_same_total(self, tmp_path):
        """Two shards hold ids [3, 10] and [40000]; the embedding's slices swapped to 1 and 2 rows (3 in all, as the ids):
        refused per slice, never rows given to the wrong ids."""
        ids = np.array([3, 10, 40000], np.int64)
        d = recis_dir(tmp_path / "ck", {"emb": {"id": ids, "embedding": ROWS}}, {}, shards=2,
                      replace={"emb.embedding/part_0_2": ROWS[:1], "emb.embedding/part_1_2": ROWS[1:]})
        assert refused(lambda: import_recis(d, tmp_path / "m.yaml", durable=False)) == \
            "hash table 'emb': block 'emb.embedding/part_0_2' holds 1 rows, its slice's id block 'emb.id/part_0_2' 2 ids"

    def test_a_part_missing_a_slice(self, tmp_path):
        ids = np.array([3, 10, 40000], np.int64)
        d = recis_dir(tmp_path / "ck", {"emb": {"id": ids, "embedding": ROWS}}, {}, shards=2)
        index = json.loads((d / "index").read_text())
        del index["block_index"]["emb.embedding/part_1_2"]
        (d / "index").write_text(json.dumps(index))
        assert refused(lambda: import_recis(d, tmp_path / "m.yaml", durable=False)) == \
            "hash table 'emb': part 'embedding' has the slices [(0, 32768, 65536)], its ids [(0, 32768, 65536), (32768, 65536, 65536)]"

    def test_a_tensor_both_dense_and_sliced(self, tmp_path):
        d = recis_dir(tmp_path / "ck", {"emb": {"id": IDS, "embedding": ROWS}}, {"emb@embedding": np.ones(2)})
        assert refused(lambda: import_recis(d, tmp_path / "m.yaml", durable=False)) == \
            "tensor 'emb@embedding' is both a dense block and a hash-table slice ('emb@embedding^ ', 'emb.embedding/part_0_1')"


class TestHashTablesThroughSafetensors:
    @pytest.mark.parametrize("slots", [(), ("exp_avg",)])
    def test_export_import_export(self, tmp_path, slots):
        """Before: 't.emb@id' cannot be an xser parameter name. Now the parts make a hash table again."""
        m = filled([5, 1, 9, 70000], slots=list(slots))
        xser.save({"t": m}, tmp_path / "m.yaml", durable=False)
        export_safetensors(tmp_path / "m.yaml", tmp_path / "hf", path="t")
        import_safetensors(tmp_path / "hf", tmp_path / "imp.yaml", durable=False)
        back = xser.load(tmp_path / "imp.yaml", verify=True)
        t = back.hash_tables["emb"]
        assert t.slots == tuple(slots) and t.dim == m.emb.dim and sorted(t.ids.tolist()) == [1, 5, 9, 70000]
        assert np.array_equal(t.get(np.array([9, 1])), m.emb.get(np.array([9, 1])))
        export_safetensors(tmp_path / "imp.yaml", tmp_path / "hf2")
        a = safetensors.numpy.load_file(str(tmp_path / "hf" / "model.safetensors"))
        b = safetensors.numpy.load_file(str(tmp_path / "hf2" / "model.safetensors"))
        assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)

    @pytest.mark.parametrize("tensors, message", [
        ({"t@embedding": np.ones((2, 3), np.float32)},
         "tensors 't@embedding': a name with '@' is a hash table's part, and the table needs t@id and t@embedding"),
        ({"t@id": np.ones(2, np.int32), "t@embedding": np.ones((2, 3), np.float32)},
         "hash table 't': t@id is int32 of shape [2]; ids are a 1-D int64 array"),
        ({"t@id": np.arange(2), "t@embedding": np.ones((3, 3), np.float32)},
         "hash table 't': t@embedding is float32 of shape [3, 3]; its 2 ids need float32 rows of shape [3]"),
        ({"t@id": np.arange(2), "t@embedding": np.ones((2, 3), np.float32), "t@m": np.ones((2, 3), np.float16)},
         "hash table 't': t@m is float16 of shape [2, 3]; its 2 ids need float32 rows of shape [3]"),
        ({"t@id": np.arange(2), "t@embedding": np.ones((), np.float32)}, "hash table 't': t@embedding has no rows (shape [])"),
        ({"resource.x": np.ones(2, np.uint8)},
         "tensor name 'resource.x': names starting with 'resource.' are the model's resource files"),
    ])
    def test_bad_tables(self, tmp_path, tensors, message):
        safetensors.numpy.save_file(tensors, str(tmp_path / "x.safetensors"))
        assert refused(lambda: import_safetensors(tmp_path / "x.safetensors", tmp_path / "m.yaml", durable=False)) == message


# ---------------------------------------------------------------- structural fuzzing

DTYPES = [np.float32, np.float16, np.int64, np.int32, np.uint8, np.bool_, np.float64]
names = st.sampled_from(["a", "b.w", "t@id", "t@embedding", "t@m", "u@id", "u@embedding", "resource.r", "1bad", "x@", "@y", "w^ "])


@st.composite
def arrays(draw):
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    return np.zeros(shape, draw(st.sampled_from(DTYPES)))


class TestFuzz:
    @FUZZ
    @given(tensors=st.dictionaries(names, arrays(), max_size=6), side=st.lists(st.sampled_from(
        ["config.json", "vocab.txt", "sp.model", "fifo.json", "dir.json", "README.md"]), unique=True), shard=st.booleans())
    def test_hf_directory(self, tmp_path_factory, tensors, side, shard):
        """Any tensors (table parts that fit or not, odd names, 0-d, empty), side files of every kind, sharded or
        not: an import gives a model whose export gives back the same tensors and files, or an XserError."""
        d = tmp_path_factory.mktemp("hf")
        if shard and tensors:
            wm = {}
            for i, (k, a) in enumerate(tensors.items()):
                safetensors.numpy.save_file({k: a}, str(d / f"s{i}.safetensors"))
                wm[k] = f"s{i}.safetensors"
            (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
        else:
            safetensors.numpy.save_file(tensors, str(d / "model.safetensors"))
        for n in side:
            if n.startswith("fifo"):
                os.mkfifo(d / n)
            elif n.startswith("dir"):
                (d / n).mkdir()
            else:
                (d / n).write_bytes(n.encode() * 3)
        out = d.parent / (d.name + ".yaml")
        try:
            import_safetensors(d, out, durable=False)
        except xser.XserError:
            return
        exp = d.parent / (d.name + ".out")
        export_safetensors(out, exp)
        back = safetensors.numpy.load_file(str(exp / "model.safetensors"))
        assert sorted(back) == sorted(tensors)
        assert all(back[k].dtype == a.dtype and back[k].shape == a.shape for k, a in tensors.items())
        kept = sorted(n for n in side if n.endswith((".json", ".txt", ".model")) and not n.startswith(("fifo", "dir")))
        assert sorted(os.listdir(exp)) == sorted(["model.safetensors", *kept])

    @FUZZ
    @given(n=st.integers(0, 4), slots=st.booleans(), ids=st.lists(st.integers(-2**63, 2**63 - 1), min_size=4, max_size=4, unique=True),
           shards=st.integers(1, 3), parallel=st.integers(1, 3), replace=st.dictionaries(
               st.sampled_from(["emb.id/part_0_{s}", "emb.embedding/part_0_{s}", "emb.m/part_0_{s}", "emb.id/part_1_{s}",
                                "emb.embedding/part_1_{s}", "w^ "]), arrays(), max_size=2))
    def test_recis_directory(self, tmp_path_factory, n, slots, ids, shards, parallel, replace):
        """RecIS directories whose blocks have any length, dtype and rank: a model whose tables hold the ids' rows, or
        an XserError; never an IndexError."""
        parts = {"id": np.array(ids[:n], np.int64), "embedding": np.arange(n * 2, dtype=np.float32).reshape(n, 2)}
        if slots:
            parts["m"] = -parts["embedding"]
        blocks = {k.format(s=shards): a for k, a in replace.items()}
        d = tmp_path_factory.mktemp("r") / "ck"
        recis_dir(d, {"emb": parts}, {"w": np.ones(3, np.float32)}, shards, parallel)
        index = json.loads((d / "index").read_text())
        recis_dir(d, {"emb": parts}, {"w": np.ones(3, np.float32)}, shards, parallel,
                  replace={k: a for k, a in blocks.items() if k in index["block_index"]})
        try:
            import_recis(d, d.parent / "m.yaml", durable=False)
        except xser.XserError:
            return
        back = xser.load(d.parent / "m.yaml", verify=True)
        t = back.hash_tables["emb"]
        got = t.ids
        assert np.array_equal(t.get(got), t.get(got))  # every id has its row
        if not blocks:
            assert sorted(got.tolist()) == sorted(ids[:n])
            assert np.array_equal(t.get(parts["id"]), parts["embedding"])


class TestMutatedBytes:
    """Byte mutations (test_fuzz's rules: an XserError or a result, bounded memory, no file outside) of an HF directory's
    index, shards and side files."""

    @FUZZ
    @given(data=st.data())
    def test_hf_directory_files(self, tmp_path_factory, data):
        root = tmp_path_factory.mktemp("m")
        d = root / "hf"
        d.mkdir()
        safetensors.numpy.save_file({"a.w": np.arange(6, dtype=np.float32).reshape(2, 3), "t@id": np.arange(2)}, str(d / "s1.safetensors"))
        safetensors.numpy.save_file({"t@embedding": np.ones((2, 2), np.float16), "b": np.ones(3, np.int8)}, str(d / "s2.safetensors"))
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 54}, "weight_map": {
            "a.w": "s1.safetensors", "t@id": "s1.safetensors", "t@embedding": "s2.safetensors", "b": "s2.safetensors"}}))
        (d / "config.json").write_text('{"model_type": "bert"}')
        victim = d / data.draw(st.sampled_from(["model.safetensors.index.json", "s1.safetensors", "s2.safetensors", "config.json"]))
        raw = victim.read_bytes()
        victim.write_bytes(data.draw(mutated(raw[:300])) + raw[300:])
        within_the_rules(lambda: import_safetensors(d, root / "out.yaml", durable=False), root)

        def read_all():
            with xser.CheckpointReader(d) as r:
                for n in r.tensor_names():
                    r.read_tensor(n)

        within_the_rules(read_all, root)
        if (root / "out.yaml").exists():
            within_the_rules(lambda: export_safetensors(root / "out.yaml", root / "back"), root)
