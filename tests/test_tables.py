"""Hash-table parameters (xser/model/tables.py): API, round trips, partial loads, averaging by id, tools."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xser
from xser.tools.average import average
from xser.tools.convert import convert
from xser.tools.ensemble import ensemble

I64 = np.iinfo(np.int64)


@xser.serializable(tag="!TTableModel")
class TableModel:
    dim: int = 3
    slots: list = ["exp_avg"]
    dtype: str = "float32"

    def __attrs_post_init__(self):
        p = xser.params(self)
        self.emb = p.add_table("emb", self.dim, slots=tuple(self.slots), dtype=self.dtype, init="normal")
        self.bias = p.add("bias", self.dim, init="ones")


def filled(ids, dim=3, seed=0, **kw) -> TableModel:
    m = TableModel(dim, **kw)
    ids = np.asarray(ids, np.int64)
    rng = np.random.default_rng(seed)
    if ids.size:
        m.emb.set(ids, rng.standard_normal((ids.size, dim)).astype(np.float32))
        if "exp_avg" in m.emb.slots:
            m.emb.set(ids, rng.standard_normal((ids.size, dim)).astype(np.float32), slot="exp_avg")
    return m


def same_table(a, b) -> None:
    assert a.dtype == b.dtype and a.dim == b.dim and a.slots == b.slots
    assert np.array_equal(a.ids, b.ids) and a.ids.dtype == np.int64
    if len(a):
        assert a.get(a.ids).tobytes() == b.get(b.ids).tobytes()
        for s in a.slots:
            assert a.get(a.ids, slot=s).tobytes() == b.get(b.ids, slot=s).tobytes()


class TestApi:
    def test_set_get_insert(self):
        m = TableModel()
        t = m.emb
        t.set([5, -1, I64.max], np.ones((3, 3)))
        assert len(t) == 3 and t.ids.tolist() == [-1, 5, I64.max] and 5 in t and 6 not in t
        with pytest.raises(xser.DataError) as info:
            t.get([5, 6, I64.min])
        assert str(info.value).endswith(f"ids not in the table: {I64.min}, 6 (get(..., insert=True) adds them)")
        rows = t.get([6, 5], insert=True)
        assert rows.shape == (2, 3) and rows[1].tolist() == [1, 1, 1] and len(t) == 4
        assert t.get([6], slot="exp_avg").tolist() == [[0, 0, 0]]  # new slot rows are zeros
        t.set([7], np.full((1, 3), 2.0), slot="exp_avg")
        assert t.get([7]).shape == (1, 3) and t.get([7], slot="exp_avg").tolist() == [[2, 2, 2]]
        assert t.slots == ("exp_avg",)

    def test_remove(self):
        t = TableModel(dim=1).emb
        t.set([1, 2, 3, 4], np.arange(4.0).reshape(4, 1))
        assert t.remove([2, 9, 2]) == 1 and t.ids.tolist() == [1, 3, 4]
        assert t.get([1, 3, 4]).ravel().tolist() == [0.0, 2.0, 3.0]
        t.set([2], [[7.0]])
        assert t.get([2, 4]).ravel().tolist() == [7.0, 3.0]

    def test_many_batches_keep_order(self):
        t = TableModel(dim=1).emb
        rng = np.random.default_rng(0)
        ref = {}
        for _ in range(50):
            ids = rng.integers(-1000, 1000, 40)
            vals = rng.standard_normal((40, 1)).astype(np.float32)
            t.set(ids, vals)
            for i, v in zip(ids.tolist(), vals):  # the last write of an id wins, as numpy assignment does
                ref[i] = v
        assert t.ids.tolist() == sorted(ref)
        assert np.array_equal(t.get(sorted(ref)), np.array([ref[i] for i in sorted(ref)]))

    @pytest.mark.parametrize("call, message", [
        (lambda p: p.add_table("e", 2, slots=("id",)), "slot name 'id' must match"),
        (lambda p: p.add_table("e", 2, slots=("a", "a")), "slot names repeat"),
        (lambda p: p.add_table("e@x", 2), "table name 'e@x' must match"),
        (lambda p: p.add_table("bias", 2), "table 'bias' is declared twice"),
        (lambda p: p.add_table("e", 2, init="gauss"), "unknown init 'gauss'"),
        (lambda p: p.add_table("e", 2, dtype="V4"), "raw void dtype"),
    ])
    def test_bad_declarations(self, call, message):
        m = TableModel()
        with pytest.raises(xser.RegistryError, match=message.replace("(", r"\(")):
            call(xser.params(m))

    def test_bad_rows(self):
        t = TableModel().emb
        with pytest.raises(xser.DataError, match=r"2 ids need rows of shape \(2, 3\), got \(2, 4\)"):
            t.set([1, 2], np.zeros((2, 4)))
        with pytest.raises(xser.DataError, match="ids must be integers, got float64"):
            t.set([1.5], np.zeros((1, 3)))
        with pytest.raises(KeyError, match="no slot 'm'"):
            t.get([1], slot="m")


class TestRoundTrip:
    @pytest.mark.parametrize("ids", [[], [0], [I64.min, -1, 0, 1, 2**53 + 1, I64.max]], ids=["empty", "one", "extremes"])
    def test_exact(self, tmp_path, ids):
        m = filled(ids)
        path = str(tmp_path / "m.yaml")
        xser.save(m, path, durable=False)
        for kw in ({}, {"mmap": True}, {"verify": True}):
            same_table(m.emb, xser.load(path, **kw).emb)
        sub = xser.params(m).name
        on_disk = xser.read_params(path)[sub]
        assert sorted(on_disk) == ["bias", "emb@embedding", "emb@exp_avg", "emb@id"]
        assert on_disk["emb@id"].tolist() == sorted(ids)

    def test_a_million_rows(self, tmp_path):
        rng = np.random.default_rng(1)
        ids = rng.permutation(np.unique(rng.integers(I64.min, I64.max, 1_100_000, dtype=np.int64))[: 10**6])
        m = TableModel(dim=4, slots=[])
        m.emb.set(ids, np.arange(4 * 10**6, dtype=np.float32).reshape(-1, 4))
        path = str(tmp_path / "m.yaml")
        xser.save(m, path, durable=False, shards=2)
        back = xser.load(path, mmap=True).emb
        assert len(back) == 10**6
        some = ids[::1000]
        assert np.array_equal(back.get(some), m.emb.get(some))

    @settings(max_examples=40, deadline=None)
    @given(ids=st.lists(st.integers(I64.min, I64.max), unique=True, max_size=30), dtype=st.sampled_from(["float32", "bfloat16", "int32"]))
    def test_any_ids_any_dtype(self, tmp_path_factory, ids, dtype):
        m = TableModel(2, [], dtype)
        if ids:
            m.emb.set(ids, np.arange(2 * len(ids)).reshape(-1, 2).astype(m.emb.dtype))
        path = str(tmp_path_factory.mktemp("t") / "m.yaml")
        xser.save(m, path, durable=False)
        same_table(m.emb, xser.load(path).emb)

    def test_tables_may_grow_between_checkpoints(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        m = filled([1, 2])
        with xser.CheckpointSaver(path, durable=False) as saver:
            saver.save(m, step=1)
            m.emb.get([3, 4, 5], insert=True)
            saver.save(m, step=2)
        assert len(xser.load(path).emb) == 5 and len(xser.load(path, checkpoint=1).emb) == 2

    def test_dim_or_dtype_that_changed(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        m = filled([1, 2])
        xser.save(m, path, durable=False)
        from helpers import edit_spec

        edit_spec(path, lambda t: t.replace("dim: 3", "dim: 4") if "dim: 3" in t else t.replace("!TTableModel {", "!TTableModel {dim: 4, "))
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert "table 'emb': part 'embedding' is (2, 3) float32 on disk, declared rows of (4,) float32 for 2 ids" in str(info.value)


class TestPartial:
    def test_by_id_set(self, tmp_path):
        m = filled(range(0, 200, 3))
        path = str(tmp_path / "m.yaml")
        xser.save(m, path, durable=False)
        sub = xser.params(m).name
        part = xser.load(path, tables={f"{sub}/emb": [3, 9, 10, 198]}).emb
        assert part.ids.tolist() == [3, 9, 198]
        assert np.array_equal(part.get([3, 9, 198]), m.emb.get([3, 9, 198]))

    def test_resharding_from_two_to_three_slices(self, tmp_path):
        """Saved as 2 slices (two models), loaded as 3: each id lands in the slice id % size says, once."""
        size = 12
        rng = np.random.default_rng(4)
        all_ids = rng.choice(np.arange(-500, 500), 300, replace=False)
        owners = [all_ids[(all_ids.view(np.uint64) % np.uint64(size)) < 6], all_ids[(all_ids.view(np.uint64) % np.uint64(size)) >= 6]]
        full = filled(all_ids, seed=9)
        paths = []
        for k, ids in enumerate(owners):
            m = TableModel()
            m.emb.set(ids, full.emb.get(ids))
            m.emb.set(ids, full.emb.get(ids, slot="exp_avg"), slot="exp_avg")
            paths.append(str(tmp_path / f"s{k}.yaml"))
            xser.save(m, paths[-1], durable=False)
        got = {}
        for begin, end in [(0, 4), (4, 8), (8, 12)]:
            for p in paths:
                m = xser.load(p)
                sub = xser.params(m).name
                t = xser.load(p, tables={f"{sub}/emb": xser.IdSlice(begin, end, size)}).emb
                for i, row in zip(t.ids.tolist(), t.get(t.ids)):
                    assert begin <= np.uint64(i & (2**64 - 1)) % np.uint64(size) < end and i not in got
                    got[i] = row
        assert sorted(got) == sorted(all_ids.tolist())
        assert all(np.array_equal(got[i], full.emb.get([i])[0]) for i in got)

    def test_bad_slice(self):
        with pytest.raises(xser.DataError, match="IdSlice needs 0 <= begin <= end <= size"):
            xser.IdSlice(3, 2, 4)


def reference_mean(tables: list[dict], weights, missing: str) -> dict:
    """Plain dicts: {id: row} per checkpoint -> {id: mean row}."""
    out = {}
    for i in sorted(set().union(*tables)):
        num = sum(w * t[i].astype(np.float64) for t, w in zip(tables, weights) if i in t)
        den = sum(w for t, w in zip(tables, weights) if i in t) if missing == "present" else sum(weights)
        out[i] = (num / den).astype(np.float32)
    return out


class TestAverage:
    @pytest.mark.parametrize("missing", ["present", "zero"])
    @pytest.mark.parametrize("band", [2, 1 << 15])
    def test_aligned_by_id_against_dicts(self, tmp_path, monkeypatch, missing, band):
        """Checkpoints holding different ids: the union, each row the weighted mean as a dict reference computes it;
        small bands make the merge stream across many steps."""
        import xser.tools.average_tables as at

        monkeypatch.setattr(at, "BAND_ROWS", band)
        path = str(tmp_path / "m.yaml")
        rng = np.random.default_rng(2)
        m = TableModel()
        snaps = []
        with xser.CheckpointSaver(path, keep=5, durable=False) as saver:
            for step in range(3):
                ids = rng.choice(np.arange(-20, 20), 12, replace=False)
                m.emb.set(ids, rng.standard_normal((12, 3)).astype(np.float32))
                m.emb.set(ids, rng.standard_normal((12, 3)).astype(np.float32), slot="exp_avg")
                saver.save(m, step=step)
                snaps.append({i: (m.emb.get([i])[0], m.emb.get([i], slot="exp_avg")[0]) for i in m.emb.ids.tolist()})
                assert m.emb.remove(m.emb.ids) == 12 and len(m.emb) == 0  # next checkpoint: other ids
        weights = [1.0, 2.0, 0.5]  # newest first
        average(path, tmp_path / "avg.yaml", weights=weights, missing=missing, force=True)
        got = xser.load(tmp_path / "avg.yaml").emb
        newest_first = snaps[::-1]
        for k, slot in ((0, None), (1, "exp_avg")):
            ref = reference_mean([{i: v[k] for i, v in s.items()} for s in newest_first], weights, missing)
            assert got.ids.tolist() == sorted(ref)
            assert np.allclose(got.get(got.ids, slot=slot), np.array([ref[i] for i in sorted(ref)]), rtol=1e-6, atol=1e-7)

    def test_drop_slots_and_identical_checkpoints(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        m = filled([4, 5, 6])
        with xser.CheckpointSaver(path, keep=5, durable=False) as saver:
            saver.save(m, step=1)
            saver.save(m, step=2)
        report = average(path, tmp_path / "avg.yaml", drop_slots=True)
        sub = xser.params(m).name
        assert sorted(xser.read_params(tmp_path / "avg.yaml")[sub]) == ["bias", "emb@embedding", "emb@id"]
        back = xser.load(tmp_path / "avg.yaml").emb  # slots dropped: they start at zero
        assert np.array_equal(back.get([4, 5, 6]), m.emb.get([4, 5, 6]))
        assert not back.get([4, 5, 6], slot="exp_avg").any()
        assert f"{sub}/emb@embedding" in report.averaged
        meta = json.loads(Path(tmp_path / "avg.yaml.data/manifest.json").read_text())["training"]
        assert meta["tables"] == {"missing": "present", "drop_slots": True}

    def test_cli(self, tmp_path):
        import subprocess
        import sys

        path = str(tmp_path / "m.yaml")
        m = filled([1, 2])
        with xser.CheckpointSaver(path, keep=5, durable=False) as saver:
            saver.save(m, step=1)
            m.emb.remove([1])
            m.emb.set([3], np.ones((1, 3)))
            saver.save(m, step=2)
        r = subprocess.run([sys.executable, "-m", "xser", "avg", path, "--out", str(tmp_path / "a.yaml"), "--missing", "zero"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert xser.load(tmp_path / "a.yaml").emb.ids.tolist() == [1, 2, 3]


    @pytest.mark.parametrize("missing", ["present", "zero"])
    @pytest.mark.parametrize("band", [2, 1 << 15])
    @pytest.mark.parametrize("dtype", ["float32", "float64", "complex64"])
    def test_each_element_averages_alone(self, tmp_path, monkeypatch, missing, band, dtype):
        """Each element of an averaged row depends only on that element in the checkpoints that hold its id: if they
        all hold the same bits (and, with missing="zero", all of them hold the id) those bits are kept (a signalling
        NaN, a NaN payload, -0.0, a float64 the weights would round); any other element that averages to NaN is
        numpy's NaN, whatever the NaNs met (two NaNs added give the bits of whichever operand the CPU loop takes
        first); the rest is the weighted sum in checkpoint order over the weights, as a scalar loop computes it (complex
        numbers as pairs of reals: inf times a complex weight would be NaN)."""
        import xser.tools.average_tables as at

        monkeypatch.setattr(at, "BAND_ROWS", band)
        dt = np.dtype(dtype)
        real = np.dtype(dt.char.lower()) if dt.kind == "c" else dt
        parts = 2 if dt.kind == "c" else 1
        u = np.dtype(f"u{real.itemsize}")
        nans = ([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC0BEEF] if real.itemsize == 4 else
                [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x7FF80000DEADBEEF])
        inf = int(np.array(np.inf, real).view(u))
        rng = np.random.default_rng(7)
        weights = [0.1, 3.0, 0.7]  # newest first
        dim, n_ids = 5, 24
        holders = {i: sorted(rng.choice(3, int(rng.integers(1, 4)), replace=False).tolist()) for i in range(n_ids)}
        cells = {}  # id -> [dim][3] element bits per checkpoint (newest first)
        for i in range(n_ids):
            row = []
            for _ in range(dim * parts):
                num = lambda: int(np.array(rng.standard_normal() * 10.0 ** int(rng.integers(-3, 4)), real).view(u))  # noqa: E731
                kind = int(rng.integers(4))
                if kind == 0:
                    b = int(rng.choice(nans + [num(), 1 << (8 * real.itemsize - 1)]))
                    row.append([b, b, b])
                elif kind == 1:
                    row.append([int(rng.choice(nans)) for _ in range(3)])
                elif kind == 2:
                    row.append([inf, inf | (1 << (8 * real.itemsize - 1)), num()])
                else:
                    row.append([num(), num(), num()])
            cells[i] = row
        path = str(tmp_path / "m.yaml")
        m = TableModel(dim, slots=[], dtype=dtype)
        with xser.CheckpointSaver(path, keep=5, durable=False) as saver:
            for step in range(3):
                c = 2 - step  # the checkpoint's place, newest first
                ids = [i for i in range(n_ids) if c in holders[i]]
                rows = np.array([[cells[i][e][c] for e in range(dim * parts)] for i in ids], u).reshape(-1, dim * parts)
                if ids:
                    m.emb.set(np.array(ids, np.int64), rows.view(real).view(dt).reshape(len(ids), dim))
                saver.save(m, step=step)
                m.emb.remove(m.emb.ids)
        average(path, tmp_path / "avg.yaml", weights=weights, missing=missing)
        got = xser.load(tmp_path / "avg.yaml").emb
        assert got.ids.tolist() == list(range(n_ids))
        gb = np.ascontiguousarray(got.get(got.ids)).view(real).view(u).reshape(n_ids, dim * parts)
        canonical = int(np.array(np.nan, real).view(u))
        for i in range(n_ids):
            hs = holders[i]
            den = sum(weights[c] for c in hs) if missing == "present" else sum(weights)
            for e in range(dim * parts):
                bits = [cells[i][e][c] for c in hs]
                if len(set(bits)) == 1 and (missing == "present" or len(hs) == 3):
                    want = bits[0]
                else:
                    with np.errstate(all="ignore"):
                        acc = np.float64(0.0)
                        for c in hs:
                            acc = acc + np.float64(np.array(cells[i][e][c], u).view(real)) * np.float64(weights[c])
                        v = np.array(acc / np.float64(den)).astype(real)
                    want = canonical if np.isnan(v) else int(v.view(u))
                assert int(gb[i, e]) == want, (i, e, [hex(b) for b in bits], hex(int(gb[i, e])), hex(want))


    def test_long_double_rows_compare_values_not_padding(self, tmp_path):
        """Long-double rows held by both checkpoints with different padding (x87: 10 value bytes of 16) are given back;
        the average's padding is zero, whatever the memory held."""
        ld = np.dtype(np.longdouble)
        if np.finfo(ld).nmant != 63:
            pytest.skip("long double is not x87 extended precision here")
        rng = np.random.default_rng(4)
        vals = rng.standard_normal((6, 3)).astype(ld)
        vals[2, 1] = np.nan
        path = str(tmp_path / "m.yaml")
        m = TableModel(3, slots=[], dtype="longdouble")
        with xser.CheckpointSaver(path, keep=3, durable=False) as saver:
            for step in range(2):
                rows = vals.copy()
                b = rows.reshape(-1).view(np.uint8).reshape(-1, ld.itemsize)
                b[:, 10:] = rng.integers(0, 256, b[:, 10:].shape, dtype=np.uint8)
                m.emb.set(np.arange(6), rows)
                saver.save(m, step=step)
        average(path, tmp_path / "avg.yaml", weights=[0.1, 0.3])
        got = xser.load(tmp_path / "avg.yaml").emb.get(np.arange(6))
        raw = np.ascontiguousarray(got).reshape(-1).view(np.uint8).reshape(-1, ld.itemsize)
        want = vals.reshape(-1).view(np.uint8).reshape(-1, ld.itemsize)
        assert raw[:, :10].tobytes() == want[:, :10].tobytes()
        assert not raw[:, 10:].any()


class TestTools:
    def test_convert_and_ensemble(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        m = filled([7, 8, 9])
        xser.save(m, path, durable=False)
        convert(path, tmp_path / "c.yaml")
        same_table(m.emb, xser.load(tmp_path / "c.yaml").emb)
        ensemble([path, str(tmp_path / "c.yaml")], tmp_path / "e.yaml")
        ens = xser.load(tmp_path / "e.yaml")
        for member in ens.members:
            same_table(m.emb, member.emb)

    def test_load_into_replaces_the_table(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        saved = filled([1, 2, 3])
        xser.save(saved, path, durable=False)
        m = filled([10])
        table = m.emb
        xser.load_into(m, path)
        assert m.emb is table
        same_table(saved.emb, m.emb)


def test_table_average_memory_is_bounded_by_bands(tmp_path, monkeypatch):
    """Averaging two 200,000-row tables (49 MiB each) with 4,096-row bands allocates a fraction of one table: bands,
    the merged band and the checksum's read buffer, whatever the table's size."""
    import tracemalloc

    import xser.tools.average_tables as at

    monkeypatch.setattr(at, "BAND_ROWS", 4096)
    path = str(tmp_path / "m.yaml")
    m = TableModel(dim=64, slots=[])
    rng = np.random.default_rng(5)
    with xser.CheckpointSaver(path, keep=3, durable=False) as saver:
        for step in range(2):
            ids = rng.choice(np.arange(10**7), 200_000, replace=False)
            m.emb.remove(m.emb.ids)
            m.emb.set(ids, np.ones((ids.size, 64), np.float32))
            saver.save(m, step=step)
    del m
    table_bytes = 200_000 * 64 * 4
    tracemalloc.start()
    try:
        average(path, tmp_path / "avg.yaml", durable=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < table_bytes / 3, peak
    assert len(xser.load(tmp_path / "avg.yaml").emb) > 200_000
