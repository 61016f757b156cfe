"""Angel's partition codecs: the eight row and column layouts, and Java's number text.

Pure codecs (bytes <-> arrays), used by the weight-format table and by ``xser import/export
angel``. Layouts from ``docs/research/formats.md`` section 2; number text from ``java_text``
(JDK 8's, exactly), written and read as arrays.
"""

from __future__ import annotations

from typing import Any

import warnings

import numpy as np

from ...errors import DataError, Location
from .java_text import java_string, parse_java
from .java_vector import decimal6_chars, int_chars, java_chars, join_records

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


def encode_partition(w: np.ndarray, r0: int, r1: int, c0: int, c1: int, fmt: str, is_float: bool, sep: str) -> bytes:
    vfmt = ">f" if is_float else ">d"
    part = w[r0:r1, c0:c1]
    rows, cols = part.shape
    if fmt.endswith("column"):
        if fmt == "binary-column":  # per column: its id (int32) then its values, big-endian; vectorised
            rec = np.empty(cols, np.dtype([("c", ">i4"), ("v", vfmt, (rows,))]))
            rec["c"] = np.arange(c0, c0 + cols)
            rec["v"] = part.T
            return rec.tobytes()
        ids = int_chars(np.arange(c0, c0 + cols))
        vals = java_chars(part.T, is_float)  # column by column, one value per row
        return join_records([ids, (vals[0].reshape(cols, rows, -1), vals[1].reshape(cols, rows))], sep.encode("latin-1"))
    if fmt == "value-binary":  # the values, big-endian, row by row: one byte-swapping copy
        return part.astype(vfmt).tobytes()
    if fmt.endswith("binary"):  # one record per value, row by row; vectorised as a structured array
        fields = {"value-binary": [], "colid-value-binary": [("c", ">i4")], "rowid-colid-value-binary": [("r", ">i4"), ("c", ">i4")]}[fmt]
        rec = np.empty((rows, cols), np.dtype(fields + [("v", vfmt)]))
        if fmt != "value-binary":
            rec["c"] = np.arange(c0, c0 + cols)[None, :]
        if fmt == "rowid-colid-value-binary":
            rec["r"] = np.arange(r0, r0 + rows)[:, None]
        rec["v"] = part
        return rec.tobytes()
    if part.size == 0:
        return b""
    values = decimal6_chars(part) if fmt == "rowid-colid-value-text" and not is_float else java_chars(part, is_float)
    fields = [values]
    if fmt != "value-text":
        fields.insert(0, int_chars(np.tile(np.arange(c0, c0 + cols), rows)))
    if fmt == "rowid-colid-value-text":
        fields.insert(0, int_chars(np.repeat(np.arange(r0, r0 + rows), cols)))
    return join_records(fields, sep.encode("latin-1"))


_NUMBER_CHARS = frozenset("0123456789+-.eEInfityNa\xfd\x1e")  # \xfd, \x1e: JDK 8 DecimalFormat NaN, infinity


def detect_sep(line: str) -> str:
    """The separator of an Angel text line: its first character that cannot be part of a number (',' if none)."""
    return next((ch for ch in line if ch not in _NUMBER_CHARS), ",")


def decode_partition(out: np.ndarray, pm: dict, data: bytes, fmt: str, vdtype: np.dtype, long_ids: bool, path: str,
                     sep: str | None = None, dense: bool = True) -> None:
    """Put one partition's values into ``out``.

    Rows without row ids in the data come in storage order: ascending with Angel's dense row storage
    (``dense``: a dense rowType; ``rowMetas`` is then in HashMap order, which Angel itself misreads),
    ``rowMetas`` order otherwise (a sparse rowType's map storage writes rows as it lists them). Column
    formats sort their rows by id.
    """
    r0, c0 = int(pm["startRow"]), int(pm["startCol"])
    rows_meta = list(pm.get("rowMetas", {}).values())
    if dense or fmt.endswith("column"):
        rows_meta.sort(key=lambda m: int(m["rowId"]))
    idt = ">i8" if long_ids else ">i4"
    where = Location(path, path=f"partition {pm['partId']}")

    if fmt.endswith("binary") or fmt == "binary-column":
        rec = {"value-binary": [("v", vdtype)], "colid-value-binary": [("c", idt), ("v", vdtype)],
               "rowid-colid-value-binary": [("r", ">i4"), ("c", idt), ("v", vdtype)]}.get(fmt)
        if fmt == "binary-column":
            n_rows, n_cols = int(pm["saveColElemNum"]), int(pm["saveColNum"])
            dt = np.dtype([("c", idt), ("v", vdtype, (n_rows,))])
            if len(data) != dt.itemsize * n_cols:
                raise DataError(f"{len(data)} bytes, {n_cols} columns of {n_rows} values need {dt.itemsize * n_cols}", where)
            recs = np.frombuffer(data, dt)
            row_ids = np.array([int(m["rowId"]) for m in rows_meta] or list(range(r0, r0 + n_rows)), np.int64)
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
        counts = [(int(m["rowId"]), int(m["elementNum"])) for m in rows_meta]
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
        return
    if sep is None:
        first = data[: data.find(b"\n")] if b"\n" in data else data
        sep = detect_sep(first.decode("latin-1"))
    if fmt == "text-column":
        row_ids = np.array([int(m["rowId"]) for m in rows_meta] or list(range(r0, r0 + int(pm.get("saveColElemNum", 0)))), np.int64)
        table = _fields(data, sep, 1 + len(row_ids), path, f"a column id and {len(row_ids)} values")
        cols = _column(table[:, 0], np.dtype(np.int64), path, 0)
        vals = np.stack([_column(table[:, 1 + k], vdtype, path, 1 + k) for k in range(len(row_ids))], axis=1) if len(row_ids) else \
            np.empty((len(cols), 0), vdtype)
        place(np.repeat(row_ids[None, :], len(cols), 0).reshape(-1), np.repeat(cols, len(row_ids)), vals.reshape(-1), out, where)
        return
    n_fields = {"value-text": 1, "colid-value-text": 2, "rowid-colid-value-text": 3}[fmt]
    table = _fields(data, sep, n_fields, path, str(n_fields))
    counts = [(int(m["rowId"]), int(m["elementNum"])) for m in rows_meta]
    if sum(n for _, n in counts) != len(table):
        raise DataError(f"{len(table)} records, the row metadata says {sum(n for _, n in counts)}", where)
    v = _column(table[:, -1], vdtype, path, n_fields - 1)
    if fmt == "rowid-colid-value-text":
        r = _column(table[:, 0], np.dtype(np.int64), path, 0)
    else:
        r = np.repeat(np.array([row for row, _ in counts], np.int64), [n for _, n in counts])
    if fmt == "value-text":  # the columns follow each row's start
        c = c0 + np.concatenate([np.arange(n) for _, n in counts]) if counts else np.empty(0, np.int64)
    else:
        c = _column(table[:, -2], np.dtype(np.int64), path, n_fields - 2)
    place(r, c, v, out, where)


def _fields(data: bytes, sep: str, n: int, path: str, expected: str) -> np.ndarray:
    """The lines of ``data`` split at ``sep`` into an (lines, n) table: float64 numbers when C's parser
    reads every field exactly (plain numbers, ints below 2^53), else byte strings; wrong field counts are errors."""
    if not data:
        return np.empty((0, n))
    body = data[:-1] if data.endswith(b"\n") else data
    raw = np.frombuffer(body, np.uint8)
    sep_b = sep.encode("latin-1")
    if len(sep_b) == 1:
        ends = np.concatenate([np.flatnonzero(raw == 10), [raw.size]])
        at = np.searchsorted(np.flatnonzero(raw == sep_b[0]), ends)  # separators before each line end
        per_line = np.diff(np.concatenate([[0], at])) + 1
    else:
        per_line = np.array([line.count(sep_b) + 1 for line in body.split(b"\n")])
    bad = np.flatnonzero(per_line != n)
    if bad.size:
        k = int(bad[0])
        raise DataError(f"{int(per_line[k])} fields separated by {sep!r}, {expected} expected", Location(path, k + 1))
    flat = body.replace(b"\n", sep_b) if n > 1 else body
    if b" " not in flat and b"\t" not in flat:  # C's parser, whitespace-separated (fields with blanks go the slow way)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                numbers = np.fromstring(flat.replace(sep_b, b" ").decode("latin-1"), sep=" ")
            except (ValueError, DeprecationWarning):
                numbers = None
        if numbers is not None and numbers.size == per_line.size * n and not (np.isfinite(numbers) & (np.abs(numbers) >= 2.0**53)).any():
            return numbers.reshape(-1, n)
    tokens = flat.split(sep_b) if n > 1 else body.split(b"\n")
    return np.array(tokens, dtype=object).reshape(-1, n)


def _column(tokens: np.ndarray, dtype: np.dtype, path: str, field: int) -> np.ndarray:
    """One field of every line as numbers: numpy's parser, then Java's names of NaN and infinity, then the line at fault."""
    native = dtype.newbyteorder("=")
    if tokens.dtype == np.float64:  # parsed already: integers are exact below 2^53, floats round once
        if native.kind in "iu":
            whole = np.isfinite(tokens) & (tokens == np.floor(tokens)) & (np.abs(tokens) < 2.0**53)
            if whole.all():
                return tokens.astype(native)
            k = int(np.flatnonzero(~whole)[0])
            raise DataError(f"field {field + 1} is not an integer: {float(tokens[k])!r}", Location(path, k + 1))
        return tokens.astype(native)
    try:
        return tokens.astype(bytes).astype(native) if tokens.size else np.empty(0, native)
    except (ValueError, OverflowError):
        pass
    out = np.empty(tokens.size, native)
    for k, tok in enumerate(tokens.tolist()):
        text = tok.decode("latin-1")
        try:
            out[k] = int(text) if native.kind in "iu" else parse_java(text)
        except (ValueError, OverflowError):
            what = "an integer" if native.kind in "iu" else "a number"
            raise DataError(f"field {field + 1} is not {what}: {text!r}", Location(path, k + 1)) from None
    return out


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
