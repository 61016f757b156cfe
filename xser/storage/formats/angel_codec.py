"""Angel's partition codecs: the eight row and column layouts, and Java's number text.

Pure codecs (bytes <-> arrays), used by the weight-format table and by ``xser import/export
angel``. Layouts from ``shared/research/formats.md`` section 2.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

import numpy as np

from ...errors import DataError, Location

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


def row_type(rt: int) -> tuple[np.dtype, bool, bool]:
    """(value dtype, long column ids, dense) of an Angel RowType number."""
    if not 0 <= rt <= 27:
        raise ValueError(f"unknown rowType {rt}")
    group, kind = divmod(rt, 7)
    value = [np.dtype(">f8"), np.dtype(">f4"), np.dtype(">i8"), np.dtype(">i4")][group]
    return value, kind in (2, 5, 6), kind in (0, 1, 2)


# ---------------------------------------------------------------- Java number text


def java_string(x: float, is_float: bool) -> str:
    """Java's ``Float.toString`` / ``Double.toString`` (shortest digits, as JDK 19 and later)."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if np.signbit(x) else "0.0"
    v = np.float32(x) if is_float else np.float64(x)
    sci = np.format_float_scientific(v, unique=True, trim="-", exp_digits=1)
    sign = "-" if sci.startswith("-") else ""
    mant, exp = sci.lstrip("-").split("e")
    digits, e = mant.replace(".", ""), int(exp)
    if 1e-3 <= abs(float(v)) < 1e7:
        if e >= 0:
            whole = digits[: e + 1].ljust(e + 1, "0")
            frac = digits[e + 1 :] or "0"
        else:
            whole, frac = "0", "0" * (-e - 1) + digits
        return f"{sign}{whole}.{frac}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{e}"


def _decimal6(x: float) -> str:
    """``DecimalFormat("#.######")``: at most 6 decimals, half-even, no exponent, '-0' kept."""
    if not math.isfinite(x):
        raise ValueError(f"{x!r} has no #.###### form")
    try:
        d = Decimal(repr(float(x))).quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN)
    except InvalidOperation:
        raise ValueError(f"{x!r} is too large for #.######") from None
    text = format(d, "f").rstrip("0").rstrip(".")
    return "-0" if text in ("-0", "-") or (text == "0" and d.is_signed()) else text


def _value_text(x: float, is_float: bool, decimal: bool) -> str:
    return _decimal6(x) if decimal and not is_float else java_string(x, is_float)


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
        return "".join(
            sep.join([str(c0 + j)] + [java_string(v, is_float) for v in part[:, j].tolist()]) + "\n" for j in range(cols)
        ).encode("latin-1")
    if fmt.endswith("binary"):  # one record per value, row by row; vectorised as a structured array
        fields = {"value-binary": [], "colid-value-binary": [("c", ">i4")], "rowid-colid-value-binary": [("r", ">i4"), ("c", ">i4")]}[fmt]
        rec = np.empty((rows, cols), np.dtype(fields + [("v", vfmt)]))
        if fmt != "value-binary":
            rec["c"] = np.arange(c0, c0 + cols)[None, :]
        if fmt == "rowid-colid-value-binary":
            rec["r"] = np.arange(r0, r0 + rows)[:, None]
        rec["v"] = part
        return rec.tobytes()
    lines = []
    for i in range(rows):
        for j in range(cols):
            v = float(part[i, j])
            if fmt == "value-text":
                lines.append(java_string(v, is_float))
            elif fmt == "colid-value-text":
                lines.append(f"{c0 + j}{sep}{java_string(v, is_float)}")
            else:
                lines.append(f"{r0 + i}{sep}{c0 + j}{sep}{_value_text(v, is_float, True)}")
    return ("\n".join(lines) + "\n").encode("latin-1") if lines else b""


_NUMBER_CHARS = frozenset("0123456789+-.eEInfityNa")


def detect_sep(line: str) -> str:
    """The separator of an Angel text line: its first character that cannot be part of a number (',' if none)."""
    return next((ch for ch in line if ch not in _NUMBER_CHARS), ",")


def decode_partition(out: np.ndarray, pm: dict, data: bytes, fmt: str, vdtype: np.dtype, long_ids: bool, path: str,
                     sep: str | None = None) -> None:
    r0, c0 = int(pm["startRow"]), int(pm["startCol"])
    rows_meta = sorted(pm.get("rowMetas", {}).values(), key=lambda m: int(m["rowId"]))
    idt = ">i8" if long_ids else ">i4"
    where = Location(path, path=f"partition {pm['partId']}")

    def put(r: int, c: int, v: float) -> None:
        if not (0 <= r < out.shape[0] and 0 <= c < out.shape[1]):
            raise DataError(f"element ({r}, {c}) is outside the {out.shape[0]}x{out.shape[1]} matrix", where)
        out[r, c] = v

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
    text = data.decode("latin-1")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if sep is None:
        sep = detect_sep(lines[0]) if lines else ","
    parse = _parse_int if vdtype.kind in "iu" else _parse_value  # int64 values beyond 2^53 stay exact
    if fmt == "text-column":
        row_ids = [int(m["rowId"]) for m in rows_meta] or list(range(r0, r0 + int(pm.get("saveColElemNum", 0))))
        for k, line in enumerate(lines):
            f = line.split(sep)
            if len(f) != 1 + len(row_ids):
                raise DataError(f"{len(f)} fields separated by {sep!r}, a column id and {len(row_ids)} values expected",
                                Location(path, k + 1))
            for r, v in zip(row_ids, f[1:]):
                put(r, _parse_int(f[0], path, k + 1), parse(v, path, k + 1))
        return
    fields = {"value-text": 1, "colid-value-text": 2, "rowid-colid-value-text": 3}[fmt]
    recs = []
    for k, line in enumerate(lines):
        f = line.split(sep)
        if len(f) != fields:
            raise DataError(f"{len(f)} fields separated by {sep!r}, {fields} expected", Location(path, k + 1))
        recs.append(tuple(f))
    _place_row_records(recs, rows_meta, fmt, r0, c0, put, where, text_path=path, parse=parse)


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


def _parse_int(text: str, path: str, line: int) -> int:
    try:
        return int(text)
    except ValueError:
        raise DataError(f"not an integer id: {text!r}", Location(path, line)) from None


def _parse_value(text: str, path: str, line: int) -> float:
    try:
        return float(text.replace("Infinity", "inf"))
    except ValueError:
        raise DataError(f"not a number: {text!r}", Location(path, line)) from None


def _place_row_records(recs: Any, rows_meta: list, fmt: str, r0: int, c0: int, put: Any, where: Any, text_path: str | None = None,
                       parse: Any = None) -> None:
    k = 0
    counts = [(int(m["rowId"]), int(m["elementNum"])) for m in rows_meta]
    total = sum(n for _, n in counts)
    if total != len(recs):
        raise DataError(f"{len(recs)} records, the row metadata says {total}", where)
    for row, n in counts:
        for i in range(n):
            rec = recs[k]
            if fmt.startswith("value"):
                v, r, c = rec[0], row, c0 + i
            elif fmt.startswith("colid"):
                c, v, r = rec[0], rec[1], row
            else:
                r, c, v = rec[0], rec[1], rec[2]
            if text_path is not None:
                r, c, v = _parse_int(str(r), text_path, k + 1), _parse_int(str(c), text_path, k + 1), (parse or _parse_value)(str(v), text_path, k + 1)
            put(int(r), int(c), v)
            k += 1
