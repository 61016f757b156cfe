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
from xser.interop.angel import FORMATS, export_angel, read_angel
from xser.storage.formats.angel_codec import file_groups, hashmap_order

from strategies import leaf_of

DATA = Path(__file__).parent / "data" / "java_text"


def _java_orders() -> list[tuple[int, int, list[int]]]:
    out = []
    for line in (DATA / "hashmap_orders.txt").read_text().split("\n")[:-1]:
        bounds, keys = line.split("\t")
        a, b = map(int, bounds.split())
        out.append((a, b, [int(k) for k in keys.split()]))
    return out


def test_hashmap_order_is_javas():
    cases = _java_orders()
    assert any(keys != sorted(keys) for _, _, keys in cases)  # the fixture has wrap-arounds
    assert [hashmap_order(list(range(a, b)), b - a) for a, b, _ in cases] == [keys for _, _, keys in cases]


@pytest.mark.skipif(shutil.which("java") is None or shutil.which("javac") is None, reason="no JDK on the PATH")
def test_hashmap_order_against_a_jdk(tmp_path):
    rng = np.random.default_rng()
    cases = [(int(a), int(a) + int(n)) for a, n in zip(rng.integers(0, 2**31 - 2000, 200), rng.integers(1, 1500, 200))]
    (tmp_path / "HM.java").write_text((DATA / "HM.java").read_text())
    subprocess.run(["javac", "-d", str(tmp_path), str(tmp_path / "HM.java")], check=True, capture_output=True)
    out = subprocess.run(["java", "-cp", str(tmp_path), "HM"], input="".join(f"{a} {b}\n" for a, b in cases),
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert [hashmap_order(list(range(a, b)), b - a) for a, b in cases] == [[int(k) for k in line.split()] for line in out[: len(cases)]]


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
    """Any partitioning: files by halving, rowMetas in HashMap order, offsets back to back, import exact."""
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
            assert [int(k) for k in pm["rowMetas"]] == hashmap_order(rows_in, len(rows_in))
        assert (tmp / "o" / "w" / str(a)).stat().st_size == offset
    got = read_angel(tmp / "o" / "w")[1]
    if "text" in fmt and fmt.startswith("rowid") and dtype == np.float64:  # #.######: 6 decimals
        assert np.allclose(got, w, rtol=0, atol=5.000001e-7)
    else:
        assert got.dtype == w.dtype and np.array_equal(got, w)


def _sparse_dir(tmp_path, row_type: int, order: list[int]) -> Path:
    """A 3x2 matrix in one colid-value-text partition whose data lists rows in ``order``."""
    d = tmp_path / "w"
    d.mkdir()
    values = {0: (1.5, 2.5), 1: (3.5, 4.5), 2: (5.5, 6.5)}
    data = "".join(f"{c},{values[r][c]}\n" for r in order for c in range(2)).encode()
    (d / "0").write_bytes(data)
    meta = {"matrixId": 1, "matrixName": "w", "formatClassName": "com.tencent.angel.model.output.format.ColIdValueTextRowFormat",
            "rowType": row_type, "row": 3, "col": 2, "blockRow": 3, "blockCol": 2, "options": {},
            "partMetas": {"0": {"partId": 0, "startRow": 0, "endRow": 3, "startCol": 0, "endCol": 2, "nnz": 6, "saveRowNum": 3,
                                "saveColNum": 0, "saveColElemNum": 0, "fileName": "0", "offset": 0, "length": len(data),
                                "rowMetas": {str(r): {"rowId": r, "offset": 0, "elementNum": 2, "saveType": 0} for r in order}}}}
    body = json.dumps(meta).encode()
    (d / "_meta").write_bytes(struct.pack(">i", len(body)) + body)
    return d


def test_rows_without_ids_follow_the_storage_order(tmp_path):
    """Sparse row types (map storage) write rows in rowMetas order; dense ones ascending, whatever rowMetas says."""
    want = np.array([[1.5, 2.5], [3.5, 4.5], [5.5, 6.5]], np.float32)
    (tmp_path / "s").mkdir()
    assert np.array_equal(read_angel(_sparse_dir(tmp_path / "s", 10, [2, 0, 1]))[1], want)  # T_FLOAT_SPARSE
    # the same rowMetas order with a dense row type: the data is ascending (Angel's dense storage)
    (tmp_path / "d").mkdir()
    d = _sparse_dir(tmp_path / "d", 7, [0, 1, 2])
    meta = json.loads((d / "_meta").read_bytes()[4:])
    rm = meta["partMetas"]["0"]["rowMetas"]
    meta["partMetas"]["0"]["rowMetas"] = {k: rm[k] for k in ("2", "0", "1")}
    body = json.dumps(meta).encode()
    (d / "_meta").write_bytes(struct.pack(">i", len(body)) + body)
    assert np.array_equal(read_angel(d)[1], want)
