"""Angel's partition codecs: the eight row and column layouts, and Java's number text.

Pure codecs (bytes <-> arrays), used by the weight-format table and by ``xser import/export
angel``. Layouts from ``docs/research/formats.md`` section 2; number text from ``java_text``
(JDK 8's, exactly), written and read as arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import DataError, Location
from .angel_text import fields, first_lines, infer_sep, number_column
from .java_text import java_string
from .java_vector import decimal6_chars, java_chars, join_records, long_chars

__all__ = ["ANGEL_FORMATS", "BY_CLASS", "PACKAGE", "PARTITIONS_PER_FILE", "decode_partition", "encode_partition", "java_string", "row_type"]

PACKAGE = "com.tencent.angel.model.output.format."
#: xser name -> Angel class name
ANGEL_FORMATS = {
    "value-binary": "ValueBinaryRowFormat",
    "colid-value-binary": "ColIdValueBinaryRowFormat",
    "rowid-colid-value-binary": "RowIdColIdValueBinaryRowFormat",
    "value-text": "ValueTextRowFormat",
    "colid-value-text": "ColIdValueTextRowFormat",
    "rowid-colid-value-text": "RowIdColIdValueTextRowFormat",
    "binary-column": "BinaryColumnFormat",
    "text-column": "TextColumnFormat",
}
BY_CLASS = {PACKAGE + v: k for k, v in ANGEL_FORMATS.items()}
PARTITIONS_PER_FILE = 5


def file_groups(n: int, per_file: int = PARTITIONS_PER_FILE) -> list[tuple[int, int]]:
    """How Angel's ``PartitionDiskOp`` splits a PS's sorted partitions into files: halve (at
    ``(start + end) // 2``) until a piece has at most ``per_file``; each piece is one file."""
    if n <= 0:
        return []
    if n <= per_file:
        return [(0, n)]
    mid = n // 2
    return file_groups(mid, per_file) + [(mid + a, mid + b) for a, b in file_groups(n - mid, per_file)]


def hashmap_order(keys: list[int], expected: int) -> list[int]:
    """Iteration order of a Java ``new HashMap<Integer, V>(expected)`` after putting ``keys`` in order.

    The table is the next power of two of ``expected``, doubled while more keys than 3/4 of it are
    held; a key's bucket is ``(h ^ (h >>> 16)) & (capacity - 1)``, buckets are visited in order and
    keys within one in insertion order (resizes keep that order). Angel's ``MatrixPartitionMeta``
    keeps ``rowMetas`` in such a map, sized by the partition's rows.
    """
    cap = 1
    while cap < max(expected, 1):
        cap *= 2
    while len(keys) > int(cap * 0.75):
        cap *= 2
    def bucket(k: int) -> int:
        h = k & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (cap - 1)
    return [k for _, _, k in sorted((bucket(k), i, k) for i, k in enumerate(keys))]


def row_type(rt: int) -> tuple[np.dtype, bool, bool]:
    """(value dtype, long column ids, dense) of an Angel RowType number."""
    if not 0 <= rt <= 27:
        raise ValueError(f"unknown rowType {rt}")
    group, kind = divmod(rt, 7)
    value = [np.dtype(">f8"), np.dtype(">f4"), np.dtype(">i8"), np.dtype(">i4")][group]
    return value, kind in (2, 5, 6), kind in (0, 1, 2)


# ---------------------------------------------------------------- writing


#: what Angel's ``MatrixPartitionMeta.write(JSONObject)`` lists ``rowMetas`` in: a ``new HashMap<>()`` (default
#: capacity 16), filled in the order the rows were written
ROWMETAS_CAPACITY = 16


def rowmetas_order(row_ids: list[int]) -> list[int]:
    """The order of the ``rowMetas`` keys in ``_meta`` for rows written in ``row_ids`` order."""
    return hashmap_order(row_ids, ROWMETAS_CAPACITY)


def row_type_of(dtype: np.dtype, long_ids: bool = False, dense: bool = True) -> int:
    """Angel's RowType number for values of ``dtype`` (T_FLOAT_DENSE = 7, T_DOUBLE_SPARSE_LONGKEY = 5, ...)."""
    group = {("f", 8): 0, ("f", 4): 1, ("i", 8): 2, ("i", 4): 3}.get((dtype.kind, dtype.itemsize))
    if group is None:
        raise ValueError(f"Angel stores float32, float64, int32 or int64 values, not {dtype}")
    kind = (2 if long_ids else 0) if dense else (5 if long_ids else 3)
    return 7 * group + kind


def _value_chars(v: np.ndarray, vtype: np.dtype, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """Value text as Angel writes it: String.valueOf (float, double, int, long); DecimalFormat("#.######") for
    double values of the row-id text format."""
    if vtype.kind in "iu":
        return long_chars(v)
    if vtype.itemsize == 4:
        return java_chars(v, True)
    return decimal6_chars(v) if fmt == "rowid-colid-value-text" else java_chars(v, False)


def encode_box(w: np.ndarray, box: tuple[int, int, int, int], fmt: str, vtype: np.dtype, long_ids: bool, dense: bool,
               sep: str) -> tuple[bytes, list[tuple[int, int]], int, int]:
    """One partition (rows ``r0:r1``, columns ``c0:c1`` of ``w``) as Angel's default row storage writes it.

    Rows go in ascending id order (``DenseServerRowsStorage``, Angel's default for every row type). A dense row
    type writes every column; a sparse one the non-zero columns, ascending (``sortFirst``). Column formats write the
    columns of a dense row, or the non-zero columns of the first row (Angel's ``ColumnFormat``; values of other rows
    elsewhere would be lost, so they are refused). Returns the bytes, ``(rowId, elementNum)`` per row in write
    order, and ``saveColNum``, ``saveColElemNum``.
    """
    r0, r1, c0, c1 = box
    vt = np.dtype(vtype).newbyteorder(">")
    idt = ">i8" if long_ids else ">i4"
    part = w[r0:r1, c0:c1]
    rows, cols = part.shape
    sep_b = sep.encode("latin-1")
    if fmt.endswith("column"):
        if dense:
            col_ids = np.arange(c0, c1)
        else:
            first = np.flatnonzero(part[0] != 0) if rows else np.empty(0, np.int64)
            outside = np.ones(cols, bool)
            outside[first] = False
            bad = np.argwhere(part[:, outside] != 0)
            if bad.size:
                r, k = bad[0]
                raise DataError(f"{fmt} with a sparse row type writes the non-zero columns of the partition's first row "
                                f"(row {r0}) only: row {r0 + int(r)} has a value in column {c0 + int(np.flatnonzero(outside)[k])}, "
                                "which Angel would drop; use a row format or a dense row type")
            col_ids = c0 + first
        vals = part[:, col_ids - c0].T  # (columns, rows)
        counts = [cols] * rows if dense else np.count_nonzero(part, axis=1).tolist()
        metas = [(r0 + i, int(n)) for i, n in enumerate(counts)]
        if fmt == "binary-column":
            rec = np.empty(len(col_ids), np.dtype([("c", idt), ("v", vt, (rows,))]))
            rec["c"] = col_ids
            rec["v"] = vals
            return rec.tobytes(), metas, len(col_ids), rows
        if not len(col_ids):
            return b"", metas, 0, rows
        chars, lengths = _value_chars(vals, vt, fmt)
        data = join_records([long_chars(col_ids), (chars.reshape(len(col_ids), rows, -1), lengths.reshape(len(col_ids), rows))], sep_b)
        return data, metas, len(col_ids), rows
    if dense:
        r = np.repeat(np.arange(r0, r1), cols)
        c = np.tile(np.arange(c0, c1), rows)
        v = part.reshape(-1)
        metas = [(r0 + i, cols) for i in range(rows)]
    else:
        if fmt.startswith("value"):
            raise DataError(f"{fmt} keeps no column ids, so a sparse row type's non-zero values would lose their columns; "
                            "use a colid-value or rowid-colid-value format, or a dense row type")
        rr, cc = np.nonzero(part)  # row by row, columns ascending
        r, c, v = r0 + rr, c0 + cc, part[rr, cc]
        metas = [(r0 + i, int(n)) for i, n in enumerate(np.bincount(rr, minlength=rows).tolist())]
    if fmt.endswith("binary"):
        fields = {"value-binary": [], "colid-value-binary": [("c", idt)], "rowid-colid-value-binary": [("r", ">i4"), ("c", idt)]}[fmt]
        rec = np.empty(v.size, np.dtype(fields + [("v", vt)]))
        if "c" in rec.dtype.names:
            rec["c"] = c
        if "r" in rec.dtype.names:
            rec["r"] = r
        rec["v"] = v
        return rec.tobytes(), metas, 0, 0
    if not v.size:
        return b"", metas, 0, 0
    text = [_value_chars(v, vt, fmt)]
    if fmt != "value-text":
        text.insert(0, long_chars(c))
    if fmt == "rowid-colid-value-text":
        text.insert(0, long_chars(r))
    return join_records(text, sep_b), metas, 0, 0


def encode_partition(w: np.ndarray, r0: int, r1: int, c0: int, c1: int, fmt: str, is_float: bool, sep: str) -> bytes:
    """A dense float partition's bytes (int column ids)."""
    return encode_box(w, (r0, r1, c0, c1), fmt, np.dtype(">f4" if is_float else ">f8"), False, True, sep)[0]


def _row_metas(pm: dict, where: Any) -> list[tuple[int, int]]:
    """``(rowId, elementNum)`` of every rowMeta, ascending by rowId: the order Angel's default row storage wrote
    the rows in (``rowMetas`` itself is in HashMap order, whatever the order of the data)."""
    metas = pm.get("rowMetas", {})
    if not isinstance(metas, dict):
        raise DataError("rowMetas must be a mapping", where)
    out = []
    for key, m in metas.items():
        if not isinstance(m, dict):
            raise DataError(f"rowMetas[{key!r}] must be a mapping", where)
        row, n = m.get("rowId"), m.get("elementNum")
        for what, x in (("rowId", row), ("elementNum", n)):
            if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < 1 << 62:
                raise DataError(f"rowMetas[{key!r}].{what} must be an int >= 0, got {x!r}", where)
        out.append((row, n))
    out.sort()
    if len({r for r, _ in out}) != len(out):
        raise DataError("rowMetas list a row twice", where)
    return out


def _column_counts(pm: dict, counts: list, shape: tuple, where: Any) -> tuple[int, int]:
    """(saveColElemNum, saveColNum) of a column-format partition: rows and columns within the partition (checked
    before anything is sized by them), as many rows as rowMetas lists when it lists any."""
    r0, c0 = int(pm["startRow"]), int(pm["startCol"])
    rows, cols = int(pm.get("endRow", shape[0])) - r0, int(pm.get("endCol", shape[1])) - c0
    out = []
    for key, most in (("saveColElemNum", rows), ("saveColNum", cols)):
        v = pm.get(key, 0 if key == "saveColNum" else rows)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= most:
            raise DataError(f"{key} must be an int from 0 to {most} (the partition's {'rows' if most == rows else 'columns'}), got {v!r}", where)
        out.append(v)
    if counts and len(counts) != out[0]:
        raise DataError(f"saveColElemNum is {out[0]}, rowMetas list {len(counts)} rows", where)
    return out[0], out[1]


def decode_partition(out: np.ndarray, pm: dict, data: bytes, fmt: str, vdtype: np.dtype, long_ids: bool, path: str,
                     sep: str | None = None, dense: bool = True, sep_regex: bool = False) -> str | None:
    """Put one partition's values into ``out``; returns the separator of a text format (None for binary).

    Every row goes where the ``rowId`` of its rowMeta says, never by the rowMeta's position: formats without row
    ids in the data hold the rows in ascending id order (Angel's default row storage writes them so, for every
    row type), each with the ``elementNum`` of its rowMeta; the row-id formats carry their ids. Column formats
    sort their rows by id too. ``sep``: the separator, found from the first line when None (a literal string);
    with ``sep_regex`` a regular expression applied as Java's ``String.split`` (as Angel's reader does).
    """
    r0, c0 = int(pm["startRow"]), int(pm["startCol"])
    where = Location(path, path=f"partition {pm['partId']}")
    counts = _row_metas(pm, where)
    if fmt.endswith("column"):
        n_rows, n_cols = _column_counts(pm, counts, out.shape, where)
    idt = ">i8" if long_ids else ">i4"

    if fmt.endswith("binary") or fmt == "binary-column":
        rec = {"value-binary": [("v", vdtype)], "colid-value-binary": [("c", idt), ("v", vdtype)],
               "rowid-colid-value-binary": [("r", ">i4"), ("c", idt), ("v", vdtype)]}.get(fmt)
        if fmt == "binary-column":
            dt = np.dtype([("c", idt), ("v", vdtype, (n_rows,))])
            if len(data) != dt.itemsize * n_cols:
                raise DataError(f"{len(data)} bytes, {n_cols} columns of {n_rows} values need {dt.itemsize * n_cols}", where)
            recs = np.frombuffer(data, dt)
            row_ids = np.array([row for row, _ in counts] or list(range(r0, r0 + n_rows)), np.int64)
            if out.shape == (n_rows, n_cols) and _is_range(row_ids, out.shape[0]) and _is_range(recs["c"], out.shape[1]):
                out[...] = recs["v"].T  # the whole matrix, in order: one transposed copy
                return
            place(np.repeat(row_ids[None, :], n_cols, 0).reshape(-1), np.repeat(recs["c"].astype(np.int64), len(row_ids)),
                  recs["v"].reshape(-1), out, where)
            return
        dt = np.dtype(rec)
        if len(data) % dt.itemsize:
            raise DataError(f"{len(data)} bytes is not a whole number of {dt.itemsize}-byte records", where)
        recs = np.frombuffer(data, dt)
        total = sum(n for _, n in counts)
        if total != len(recs):
            raise DataError(f"{len(recs)} records, the row metadata says {total}", where)
        rows, cols = out.shape
        if (total == out.size and r0 == 0 and c0 == 0 and [row for row, _ in counts] == list(range(rows))
                and all(n == cols for _, n in counts) and ("c" not in recs.dtype.names or _is_tiled(recs["c"], rows, cols))
                and ("r" not in recs.dtype.names or _is_tiled(recs["r"], cols, rows, by_row=True))):
            out[...] = recs["v"].reshape(rows, cols)  # every element once, row by row: no scatter
            return
        r = np.repeat(np.array([row for row, _ in counts], np.int64), [n for _, n in counts]) if "r" not in recs.dtype.names else recs["r"].astype(np.int64)
        if "c" in recs.dtype.names:
            c = recs["c"].astype(np.int64)
        else:  # value-binary: the columns follow each row's start
            c = c0 + np.concatenate([np.arange(n) for _, n in counts]) if counts else np.empty(0, np.int64)
        place(r, c, recs["v"], out, where)
        return None
    if sep is None:
        sep = infer_sep(first_lines(data, 64), fmt)
    if fmt == "text-column":
        row_ids = np.array([row for row, _ in counts] or list(range(r0, r0 + n_rows)), np.int64)
        table = fields(data, sep, 1 + len(row_ids), path, f"a column id and {len(row_ids)} values", sep_regex)
        cols = number_column(table[:, 0], np.dtype(np.int64), path, 0)
        vals = np.stack([number_column(table[:, 1 + k], vdtype, path, 1 + k) for k in range(len(row_ids))], axis=1) if len(row_ids) else \
            np.empty((len(cols), 0), vdtype)
        place(np.repeat(row_ids[None, :], len(cols), 0).reshape(-1), np.repeat(cols, len(row_ids)), vals.reshape(-1), out, where)
        return sep
    n_fields = {"value-text": 1, "colid-value-text": 2, "rowid-colid-value-text": 3}[fmt]
    table = fields(data, sep, n_fields, path, str(n_fields), sep_regex)
    if sum(n for _, n in counts) != len(table):
        raise DataError(f"{len(table)} records, the row metadata says {sum(n for _, n in counts)}", where)
    v = number_column(table[:, -1], vdtype, path, n_fields - 1)
    if fmt == "rowid-colid-value-text":
        r = number_column(table[:, 0], np.dtype(np.int64), path, 0)
    else:
        r = np.repeat(np.array([row for row, _ in counts], np.int64), [n for _, n in counts])
    if fmt == "value-text":  # the columns follow each row's start
        c = c0 + np.concatenate([np.arange(n) for _, n in counts]) if counts else np.empty(0, np.int64)
    else:
        c = number_column(table[:, -2], np.dtype(np.int64), path, n_fields - 2)
    place(r, c, v, out, where)
    return sep


def _is_range(ids: np.ndarray, n: int) -> bool:
    return ids.shape == (n,) and bool((ids == np.arange(n)).all())


def _is_tiled(ids: np.ndarray, rows: int, cols: int, by_row: bool = False) -> bool:
    """Column ids 0..cols-1 repeated for each of ``rows`` rows (or, ``by_row``, each row id repeated ``rows`` times)."""
    if ids.size != rows * cols:
        return False
    if by_row:  # here rows is the number of columns, cols the number of rows: r = [0]*ncols + [1]*ncols + ...
        return bool((ids.reshape(cols, rows) == np.arange(cols)[:, None]).all())
    return bool((ids.reshape(rows, cols) == np.arange(cols)[None, :]).all())


def place(r: np.ndarray, c: np.ndarray, v: np.ndarray, out: np.ndarray, where: Any) -> None:
    """``out[r, c] = v`` for every record, ids checked against the matrix first; integers stay integers."""
    rows, cols = out.shape
    if r.size and r.size == out.size and rows and cols:  # every element once, row by row (dense layouts): no scatter
        rr, cc = r.reshape(rows, cols), c.reshape(rows, cols)
        if (rr == np.arange(rows)[:, None]).all() and (cc == np.arange(cols)[None, :]).all():
            out[...] = v.reshape(rows, cols)
            return
    if r.size:
        bad = (r < 0) | (r >= out.shape[0]) | (c < 0) | (c >= out.shape[1])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"element ({int(r[i])}, {int(c[i])}) is outside the {out.shape[0]}x{out.shape[1]} matrix", where)
        out[r, c] = v
