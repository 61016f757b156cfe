"""Angel's multi-partition layout: PartitionDiskOp's file grouping, rowMetas in HashMap order, row order on import."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xser
from xser.interop.angel import FORMATS, export_angel, import_angel, read_angel
from xser.storage.formats.angel_codec import file_groups, hashmap_order, row_type, rowmetas_order

from strategies import leaf_of

DATA = Path(__file__).parent / "data" / "java_text"


def _java_orders() -> list[tuple[int, int, list[int]]]:
    out = []
    for line in (DATA / "rowmetas_orders.txt").read_text().split("\n")[:-1]:
        bounds, keys = line.split("\t")
        a, b = map(int, bounds.split())
        out.append((a, b, [int(k) for k in keys.split()]))
    return out


def test_rowmetas_order_is_javas():
    """rowMetas in the order of Angel's `new HashMap<>()` (default capacity) for blocks of 1 to 64 rows, as a JDK
    computed it (the fixture): it was a HashMap sized by the partition, which differs for 6 rows or fewer."""
    cases = _java_orders()
    assert sorted(b - a for a, b, _ in cases) == sorted(list(range(1, 65)) * 5)
    assert any(keys != sorted(keys) for _, _, keys in cases)  # the fixture has wrap-arounds
    assert [rowmetas_order(list(range(a, b))) for a, b, _ in cases] == [keys for _, _, keys in cases]
    assert any(hashmap_order(list(range(a, b)), b - a) != keys for a, b, keys in cases if b - a <= 6)  # the old sizing


@pytest.mark.skipif(shutil.which("java") is None or shutil.which("javac") is None, reason="no JDK on the PATH")
def test_rowmetas_order_against_a_jdk(tmp_path):
    """Angel's own steps (RowMetas.java) on a JDK: every block size 1-64 at random starts, and random larger blocks."""
    rng = np.random.default_rng()
    cases = [(int(a), int(a) + n) for n in range(1, 65) for a in rng.integers(0, 2**31 - 100, 3)]
    cases += [(int(a), int(a) + int(n)) for a, n in zip(rng.integers(0, 2**31 - 2000, 100), rng.integers(65, 1500, 100))]
    cases += [(65536 - k, 65536 - k + n) for k in (1, 5, 17) for n in (1, 4, 9, 40)]  # h ^ (h >>> 16) mixes the high half in
    (tmp_path / "RowMetas.java").write_text((DATA / "RowMetas.java").read_text())
    subprocess.run(["javac", "-d", str(tmp_path), str(tmp_path / "RowMetas.java")], check=True, capture_output=True)
    out = subprocess.run(["java", "-cp", str(tmp_path), "RowMetas"], input="".join(f"{a} {b}\n" for a, b in cases),
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert [rowmetas_order(list(range(a, b))) for a, b in cases] == [[int(k) for k in line.split()] for line in out[: len(cases)]]


@pytest.mark.parametrize("block", range(1, 65))
def test_export_lists_rowmetas_in_angels_order(tmp_path, block):
    """Every block size 1-64: the exported _meta lists each partition's rowMetas as the JDK fixture says."""
    orders = {(a, b): keys for a, b, keys in _java_orders() if a == 0}
    w = np.arange(2 * block * 2, dtype=np.float32).reshape(2 * block, 2)
    leaf = leaf_of({"w": w})
    xser.save(leaf, tmp_path / "m.yaml", durable=False)
    export_angel(tmp_path / "m.yaml", f"{xser.params(leaf).name}/w", tmp_path / "o", format="colid-value-binary", matrix_name="w",
                 block_rows=block)
    meta = json.loads((tmp_path / "o" / "w" / "_meta").read_bytes()[4:])
    assert [int(k) for k in meta["partMetas"]["0"]["rowMetas"]] == orders[(0, block)]
    assert [int(k) for k in meta["partMetas"]["1"]["rowMetas"]] == rowmetas_order(list(range(block, 2 * block)))
    assert np.array_equal(read_angel(tmp_path / "o" / "w")[1], w)


def test_file_groups_known():
    """PartitionDiskOp halves at (start + end) / 2 until a piece has at most the limit."""
    assert file_groups(12, 5) == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert file_groups(11, 5) == [(0, 5), (5, 8), (8, 11)]
    assert file_groups(7, 5) == [(0, 3), (3, 7)]
    assert file_groups(5, 5) == [(0, 5)] and file_groups(0, 5) == [] and file_groups(3, 1) == [(0, 1), (1, 2), (2, 3)]


@given(st.integers(0, 400), st.integers(1, 30))
def test_file_groups_tile(n, per_file):
    groups = file_groups(n, per_file)
    assert (groups == []) == (n == 0)
    assert [a for a, _ in groups] == [0, *(b for _, b in groups[:-1])][: len(groups)] and (groups[-1][1] if groups else 0) == n
    assert all(0 < b - a <= per_file for a, b in groups)


def _matrix(rows, cols, dtype, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, cols)) * 10.0 ** rng.integers(-8, 8, (rows, cols))).astype(dtype)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 70), st.integers(1, 5), st.integers(1, 25), st.integers(1, 7), st.sampled_from(sorted(FORMATS)),
       st.sampled_from([np.float32, np.float64]), st.integers(0, 2**32 - 1))
def test_export_layout_and_round_trip(tmp_path_factory, rows, cols, block, per_file, fmt, dtype, seed):
    """Any partitioning: files by halving, rowMetas in Angel's order, offsets back to back, import exact."""
    tmp = tmp_path_factory.mktemp("a")
    w = _matrix(rows, cols, dtype, seed)
    leaf = leaf_of({"w": w})
    xser.save(leaf, tmp / "m.yaml")
    export_angel(tmp / "m.yaml", f"{xser.params(leaf).name}/w", tmp / "o", format=fmt, matrix_name="w", block_rows=block, per_file=per_file)
    meta = json.loads((tmp / "o" / "w" / "_meta").read_bytes()[4:])
    parts = [meta["partMetas"][str(k)] for k in range(len(meta["partMetas"]))]
    groups = file_groups(len(parts), per_file)
    assert sorted(p.name for p in (tmp / "o" / "w").iterdir()) == sorted([str(a) for a, _ in groups] + ["_meta"])
    for a, b in groups:
        offset = 0
        for pm in parts[a:b]:
            assert pm["fileName"] == str(a) and pm["offset"] == offset
            offset += pm["length"]
            rows_in = list(range(pm["startRow"], pm["endRow"]))
            assert [int(k) for k in pm["rowMetas"]] == rowmetas_order(rows_in)
        assert (tmp / "o" / "w" / str(a)).stat().st_size == offset
    got = read_angel(tmp / "o" / "w")[1]
    if "text" in fmt and fmt.startswith("rowid") and dtype == np.float64:  # #.######: 6 decimals
        assert np.allclose(got, w, rtol=0, atol=5.000001e-7)
    else:
        assert got.dtype == w.dtype and np.array_equal(got, w)


ROW_TYPES = list(range(28))


def _typed_matrix(rows: int, cols: int, rt: int, fmt: str, seed: int) -> np.ndarray:
    """Values of Angel row type ``rt`` that ``fmt`` keeps exactly: zeros in a sparse type; for a sparse column format,
    zeros in whole columns (Angel writes the first row's non-zero columns); doubles of at most 6 decimals where
    DecimalFormat("#.######") writes them."""
    vtype, _, dense = row_type(rt)
    rng = np.random.default_rng(seed)
    if vtype.kind == "f":
        w = rng.standard_normal((rows, cols)) * 10.0 ** rng.integers(-6, 7, (rows, cols))
        if fmt == "rowid-colid-value-text" and vtype.itemsize == 8:
            w = np.round(rng.standard_normal((rows, cols)) * 1000, 3)
    else:
        info = np.iinfo(vtype.newbyteorder("="))
        w = rng.integers(info.min, info.max, (rows, cols), dtype=np.int64, endpoint=True)
    w = w.astype(vtype.newbyteorder("="))
    if not dense:
        if fmt.endswith("column"):
            w[w == 0] = 1
            w[:, rng.random(cols) < 0.4] = 0
        else:
            w[rng.random((rows, cols)) < 0.4] = 0
    return w


def _formats_for(rt: int) -> list[str]:
    return sorted(FORMATS) if row_type(rt)[2] else sorted(f for f in FORMATS if not f.startswith("value"))


def _save(tmp, w):
    leaf = leaf_of({"w": w})
    xser.save(leaf, tmp / "m.yaml", durable=False)
    return tmp / "m.yaml", f"{xser.params(leaf).name}/w"


def _rewrite_meta(d: Path, edit) -> None:
    meta = json.loads((d / "_meta").read_bytes()[4:])
    edit(meta)
    body = json.dumps(meta, separators=(",", ":")).encode()
    (d / "_meta").write_bytes(struct.pack(">i", len(body)) + body)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ROW_TYPES), st.data(), st.integers(1, 9), st.integers(1, 6), st.integers(1, 4), st.integers(1, 3),
       st.integers(0, 2**32 - 1), st.sampled_from([",", "::", ", ", "\t", "ab"]))
def test_every_row_type_and_format_round_trips(tmp_path_factory, rt, data, rows, cols, block, per_file, seed, sep):
    """Every row type (double/float/long/int values; dense, sparse, long keys) in every format it can be written in:
    import gives the matrix; the rowMetas in any order place the same rows; export without options after the import
    gives the files back byte for byte (separators of any length too)."""
    fmt = data.draw(st.sampled_from(_formats_for(rt)))
    tmp = tmp_path_factory.mktemp("t")
    w = _typed_matrix(rows, cols, rt, fmt, seed)
    model, param = _save(tmp, w)
    export_angel(model, param, tmp / "a", format=fmt, matrix_name="w", block_rows=block, per_file=per_file, row_type=rt, sep=sep)
    got = read_angel(tmp / "a" / "w")[1]
    assert got.dtype == w.dtype and np.array_equal(got, w)
    import_angel(tmp / "a" / "w", tmp / "b.yaml")
    export_angel(tmp / "b.yaml", xser.params(xser.load(tmp / "b.yaml")).name + "/values", tmp / "c")
    first = sorted(p.name for p in (tmp / "a" / "w").iterdir())
    assert sorted(p.name for p in (tmp / "c" / "w").iterdir()) == first
    for name in first:
        assert (tmp / "c" / "w" / name).read_bytes() == (tmp / "a" / "w" / name).read_bytes(), name
    order = data.draw(st.permutations(range(rows)))
    def shuffle(meta):
        for pm in meta["partMetas"].values():
            rm = pm["rowMetas"]
            pm["rowMetas"] = {k: rm[k] for k in sorted(rm, key=lambda k: order[int(k)])}
    _rewrite_meta(tmp / "a" / "w", shuffle)
    assert np.array_equal(read_angel(tmp / "a" / "w")[1], w)


@pytest.mark.parametrize("rt", ROW_TYPES)
def test_rows_are_placed_by_row_id_for_every_row_type(tmp_path, rt):
    """The data holds rows in ascending id order (Angel's default row storage, every row type); each row goes where its
    rowMeta's rowId says, whatever order rowMetas lists them in (sparse row types were read in rowMetas order)."""
    fmt = "colid-value-text"
    w = _typed_matrix(5, 3, rt, fmt, rt)
    model, param = _save(tmp_path, w)
    export_angel(model, param, tmp_path / "o", format=fmt, matrix_name="w", row_type=rt)
    _rewrite_meta(tmp_path / "o" / "w", lambda m: m["partMetas"]["0"].update(
        rowMetas={k: m["partMetas"]["0"]["rowMetas"][k] for k in ("4", "2", "0", "3", "1")}))
    assert np.array_equal(read_angel(tmp_path / "o" / "w")[1], w)


@pytest.mark.parametrize("fmt", ["binary-column", "text-column", "colid-value-binary", "colid-value-text",
                                 "rowid-colid-value-binary", "rowid-colid-value-text"])
@pytest.mark.parametrize("rt", [5, 12, 19, 26, 3, 10])  # sparse: long keys (double, float, long, int values), int keys
def test_sparse_partitions_hold_only_their_non_zeros(tmp_path, fmt, rt):
    """A sparse partition of 3 rows and 40 columns with few non-zeros imports (binary-column with long keys was
    refused: "160 bytes cannot hold 3x40 values"): the size check counts the values its metadata declares."""
    vtype = row_type(rt)[0].newbyteorder("=")
    w = np.zeros((3, 40), vtype)
    w[:, [3, 17, 39]] = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]], vtype)
    model, param = _save(tmp_path, w)
    export_angel(model, param, tmp_path / "o", format=fmt, matrix_name="w", row_type=rt)
    assert (tmp_path / "o" / "w" / "0").stat().st_size < 3 * 40 * 4
    assert np.array_equal(read_angel(tmp_path / "o" / "w")[1], w)


def test_a_sparse_partition_declaring_more_than_its_bytes_is_refused(tmp_path):
    w = np.zeros((3, 40), np.float32)
    w[0, 5] = 1
    model, param = _save(tmp_path, w)
    export_angel(model, param, tmp_path / "o", format="colid-value-binary", matrix_name="w", row_type=12)
    _rewrite_meta(tmp_path / "o" / "w", lambda m: m["partMetas"]["0"]["rowMetas"]["1"].update(elementNum=10**6))
    with pytest.raises(xser.DataError) as info:
        read_angel(tmp_path / "o" / "w")
    assert str(info.value).endswith("partition 0: 12 bytes cannot hold the 1000001 values its metadata declares "
                                    "(colid-value-binary needs at least 8000008)")


def test_sparse_column_format_refuses_values_angel_would_drop(tmp_path):
    """A sparse row type in a column format keeps the first row's non-zero columns only: other values are refused."""
    w = np.zeros((2, 4), np.float32)
    w[0, 1], w[1, 2] = 1, 2
    model, param = _save(tmp_path, w)
    with pytest.raises(xser.DataError) as info:
        export_angel(model, param, tmp_path / "o", format="text-column", matrix_name="w", row_type=10)
    assert str(info.value) == ("text-column with a sparse row type writes the non-zero columns of the partition's first row (row 0) "
                               "only: row 1 has a value in column 2, which Angel would drop; use a row format or a dense row type")


@pytest.mark.parametrize("fmt", ["text-column", "binary-column"])
@pytest.mark.parametrize("edit, message", [
    ({"rowMetas": {}, "saveColElemNum": 10**12}, "saveColElemNum must be an int from 0 to 2 (the partition's rows), got 1000000000000"),
    ({"saveColNum": 2**31}, "saveColNum must be an int from 0 to 3 (the partition's columns), got 2147483648"),
    ({"saveColElemNum": -1}, "saveColElemNum must be an int from 0 to 2 (the partition's rows), got -1"),
    ({"saveColElemNum": 1}, "saveColElemNum is 1, rowMetas list 2 rows"),
])
def test_column_counts_are_checked_before_use(tmp_path, fmt, edit, message):
    """A column format's saveColElemNum and saveColNum size what is read: checked against the partition first (a
    forged saveColElemNum without rowMetas made a list of 10^12 row ids: a MemoryError or a hang)."""
    w = np.ones((2, 3), np.float32)
    model, param = _save(tmp_path, w)
    export_angel(model, param, tmp_path / "o", format=fmt, matrix_name="w")
    _rewrite_meta(tmp_path / "o" / "w", lambda m: m["partMetas"]["0"].update(edit))
    with pytest.raises(xser.DataError) as info:
        read_angel(tmp_path / "o" / "w")
    assert str(info.value).endswith(f"partition 0: {message}")
