"""Angel matrices: ``_meta`` (a big-endian length, then JSON) plus partition data files.

Layouts from ``shared/research/formats.md`` section 2 (read from Angel's source; the tests check
the worked example's bytes). Eight formats: six row formats (values, column ids and values, row
ids, column ids and values; binary or text) and two column formats. Binary numbers are Java's:
big-endian int/long column ids, float or double values. Text numbers are Java's
``Float/Double.toString`` (``1234567.0``, ``1.0E-7``), except double values in the row-id text
format, which use ``DecimalFormat("#.######")``.

Angel defects not copied: row offsets are 64-bit (Angel reads them as int, so offsets past 2^31
broke); unknown ``formatClassName`` values are refused instead of loaded by reflection.
"""

from __future__ import annotations

import json
import os
import struct
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import numpy as np

from ..errors import DataError, Location, did_you_mean
from ..params import fresh_name, params
from ..registry import serializable

__all__ = ["AngelMatrix", "FORMATS", "export_angel", "import_angel", "java_string"]

PACKAGE = "com.tencent.angel.model.output.format."
#: xser name -> Angel class name
FORMATS = {
    "value-binary": "ValueBinaryRowFormat",
    "colid-value-binary": "ColIdValueBinaryRowFormat",
    "rowid-colid-value-binary": "RowIdColIdValueBinaryRowFormat",
    "value-text": "ValueTextRowFormat",
    "colid-value-text": "ColIdValueTextRowFormat",
    "rowid-colid-value-text": "RowIdColIdValueTextRowFormat",
    "binary-column": "BinaryColumnFormat",
    "text-column": "TextColumnFormat",
}
_BY_CLASS = {PACKAGE + v: k for k, v in FORMATS.items()}
PARTITIONS_PER_FILE = 5


@serializable(tag="!AngelMatrix")
class AngelMatrix:
    """An Angel matrix as one xser parameter ``values`` of shape (rows, cols)."""

    name: str
    rows: int
    cols: int
    dtype: str = "float32"

    def __attrs_post_init__(self):
        self.values = params(self).add("values", (self.rows, self.cols), dtype=self.dtype, init="zeros")


def _row_type(rt: int) -> tuple[np.dtype, bool, bool]:
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
    d = Decimal(repr(float(x))).quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN)
    text = format(d, "f").rstrip("0").rstrip(".")
    return "-0" if text in ("-0", "-") or (text == "0" and d.is_signed()) else text


def _value_text(x: float, is_float: bool, decimal: bool) -> str:
    return _decimal6(x) if decimal and not is_float else java_string(x, is_float)


# ---------------------------------------------------------------- writing


def _encode_partition(w: np.ndarray, r0: int, r1: int, c0: int, c1: int, fmt: str, is_float: bool, sep: str) -> bytes:
    vfmt = ">f" if is_float else ">d"
    part = w[r0:r1, c0:c1]
    rows, cols = part.shape
    if fmt.endswith("column"):
        if fmt == "binary-column":
            out = bytearray()
            for j in range(cols):
                out += struct.pack(">i", c0 + j) + struct.pack(f">{rows}{vfmt[1]}", *part[:, j].tolist())
            return bytes(out)
        return "".join(
            sep.join([str(c0 + j)] + [java_string(v, is_float) for v in part[:, j].tolist()]) + "\n" for j in range(cols)
        ).encode("latin-1")
    if fmt.endswith("binary"):
        recs = []
        for i in range(rows):
            for j in range(cols):
                v = struct.pack(vfmt, part[i, j])
                if fmt == "value-binary":
                    recs.append(v)
                elif fmt == "colid-value-binary":
                    recs.append(struct.pack(">i", c0 + j) + v)
                else:
                    recs.append(struct.pack(">ii", r0 + i, c0 + j) + v)
        return b"".join(recs)
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


def _jettison(obj: Any) -> str:
    """jettison's JSONObject.toString(): compact, insertion order, '/' escaped as '\\/'."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).replace("/", "\\/")


def export_angel(
    model: str | os.PathLike,
    param: str,
    out_dir: str | os.PathLike,
    *,
    format: str = "colid-value-text",
    matrix_name: str | None = None,
    block_rows: int | None = None,
    sep: str = ",",
    checkpoint: int = 0,
) -> list[str]:
    """Write ``param`` (a 2-D float matrix) as an Angel matrix directory ``out_dir/<name>/``."""
    from . import read_param

    if format not in FORMATS:
        raise DataError(f"unknown Angel format {format!r} (known: {', '.join(FORMATS)}){did_you_mean(format, FORMATS)}")
    w = read_param(model, param, checkpoint)
    pname = param.partition("/")[2]
    if w.ndim != 2 or w.dtype.kind != "f" or w.dtype.itemsize not in (4, 8):
        raise DataError(f"{param} is {w.dtype} of shape {tuple(w.shape)}; Angel stores 2-D float32 or float64 matrices")
    is_float = w.dtype.itemsize == 4
    rows, cols = w.shape
    name = matrix_name or pname
    block = block_rows or max(rows, 1)
    target = os.path.join(os.fspath(out_dir), name)
    os.makedirs(target, exist_ok=True)
    parts = [(k, r0, min(rows, r0 + block)) for k, r0 in enumerate(range(0, max(rows, 1), block))]
    column = format.endswith("column")
    metas: dict[str, Any] = {}
    written = []
    for f0 in range(0, len(parts), PARTITIONS_PER_FILE):
        group = parts[f0 : f0 + PARTITIONS_PER_FILE]
        fname = str(group[0][0])
        offset = 0
        with open(os.path.join(target, fname), "wb") as fh:
            for pid, r0, r1 in group:
                data = _encode_partition(w, r0, r1, 0, cols, format, is_float, sep)
                fh.write(data)
                metas[str(pid)] = {
                    "partId": pid, "startRow": r0, "endRow": r1, "startCol": 0, "endCol": cols, "nnz": (r1 - r0) * cols,
                    "saveRowNum": r1 - r0, "saveColNum": cols if column else 0, "saveColElemNum": (r1 - r0) if column else 0,
                    "fileName": fname, "offset": offset, "length": len(data),
                    "rowMetas": {str(r): {"rowId": r, "offset": -1 if column else offset, "elementNum": cols, "saveType": 0} for r in range(r0, r1)},
                }
                offset += len(data)
        written.append(os.path.join(target, fname))
    meta = {
        "matrixId": 1, "matrixName": name, "formatClassName": PACKAGE + FORMATS[format], "rowType": 7 if is_float else 0,
        "row": rows, "col": cols, "blockRow": block, "blockCol": cols,
        "options": {"feature.index.range.end": str(cols), "feature.index.range.start": "0"}, "partMetas": metas,
    }
    body = _jettison(meta).encode("utf-8")
    with open(os.path.join(target, "_meta"), "wb") as fh:
        fh.write(struct.pack(">i", len(body)) + body)
    written.append(os.path.join(target, "_meta"))
    return written


# ---------------------------------------------------------------- reading


def read_angel(matrix_dir: str | os.PathLike) -> tuple[dict, np.ndarray]:
    """The ``_meta`` and the matrix of an Angel matrix directory, every partition checked."""
    d = os.fspath(matrix_dir)
    mpath = os.path.join(d, "_meta")
    try:
        with open(mpath, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise DataError("no _meta file (not an Angel matrix directory?)", Location(mpath)) from None
    if len(raw) < 4:
        raise DataError("_meta is shorter than its 4-byte length prefix", Location(mpath))
    (n,) = struct.unpack(">i", raw[:4])
    if n < 0 or n > len(raw) - 4:
        raise DataError(f"_meta length prefix says {n} bytes of JSON, the file has {len(raw) - 4}", Location(mpath))
    try:
        meta = json.loads(raw[4 : 4 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"_meta JSON is corrupt: {e}", Location(mpath)) from None
    cls = meta.get("formatClassName")
    fmt = _BY_CLASS.get(cls)
    if fmt is None:
        known = sorted(_BY_CLASS)
        raise DataError(f"unknown formatClassName {cls!r} (xser reads the 8 built-in formats){did_you_mean(str(cls), known)}", Location(mpath))
    try:
        vdtype, long_ids, _ = _row_type(int(meta["rowType"]))
        rows, cols = int(meta["row"]), int(meta["col"])
    except (KeyError, ValueError, TypeError) as e:
        raise DataError(f"_meta: {e}", Location(mpath)) from None
    out = np.zeros((rows, cols), vdtype.newbyteorder("="))
    for pid, pm in sorted(meta.get("partMetas", {}).items(), key=lambda kv: int(kv[0])):
        path = os.path.join(d, str(pm["fileName"]))
        if os.path.isabs(str(pm["fileName"])) or ".." in str(pm["fileName"]).split("/"):
            raise DataError(f"partition {pid}: file name {pm['fileName']!r} must stay inside the matrix directory", Location(mpath))
        try:
            with open(path, "rb") as fh:
                fh.seek(int(pm["offset"]))
                data = fh.read(int(pm["length"]))
        except FileNotFoundError:
            raise DataError(f"partition {pid}: data file missing", Location(path)) from None
        if len(data) != int(pm["length"]):
            raise DataError(f"partition {pid} is truncated: {len(data)} of {pm['length']} bytes at offset {pm['offset']}", Location(path))
        _decode_partition(out, pm, data, fmt, vdtype, long_ids, path)
    return meta, out


def _decode_partition(out: np.ndarray, pm: dict, data: bytes, fmt: str, vdtype: np.dtype, long_ids: bool, path: str) -> None:
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
            dt = np.dtype([("c", ">i4"), ("v", vdtype, (n_rows,))])
            if len(data) != dt.itemsize * n_cols:
                raise DataError(f"{len(data)} bytes, {n_cols} columns of {n_rows} values need {dt.itemsize * n_cols}", where)
            recs = np.frombuffer(data, dt)
            row_ids = [int(m["rowId"]) for m in rows_meta] or list(range(r0, r0 + n_rows))
            for c, vals in zip(recs["c"].tolist(), recs["v"]):
                for r, v in zip(row_ids, vals.tolist()):
                    put(r, c, v)
            return
        dt = np.dtype(rec)
        if len(data) % dt.itemsize:
            raise DataError(f"{len(data)} bytes is not a whole number of {dt.itemsize}-byte records", where)
        recs = np.frombuffer(data, dt)
        _place_row_records(recs, rows_meta, fmt, r0, c0, put, where)
        return
    text = data.decode("latin-1")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    sep = "," if not lines or "," in lines[0] or fmt == "value-text" else (" " if " " in lines[0] else "\t")
    if fmt == "text-column":
        row_ids = [int(m["rowId"]) for m in rows_meta]
        for k, line in enumerate(lines):
            f = line.split(sep)
            for r, v in zip(row_ids, f[1:]):
                put(r, int(f[0]), _parse_value(v, path, k + 1))
        return
    fields = {"value-text": 1, "colid-value-text": 2, "rowid-colid-value-text": 3}[fmt]
    recs = []
    for k, line in enumerate(lines):
        f = line.split(sep)
        if len(f) != fields:
            raise DataError(f"{len(f)} fields, {fields} expected", Location(path, k + 1))
        recs.append(tuple(f))
    _place_row_records(recs, rows_meta, fmt, r0, c0, put, where, text_path=path)


def _parse_value(text: str, path: str, line: int) -> float:
    try:
        return float(text.replace("Infinity", "inf"))
    except ValueError:
        raise DataError(f"not a number: {text!r}", Location(path, line)) from None


def _place_row_records(recs: Any, rows_meta: list, fmt: str, r0: int, c0: int, put: Any, where: Any, text_path: str | None = None) -> None:
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
                r, c, v = int(r), int(c), _parse_value(str(v), text_path, k + 1)
            put(int(r), int(c), float(v))
            k += 1


def import_angel(matrix_dir: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, durable: bool = True) -> str:
    """Make an xser model (one ``!AngelMatrix``) of an Angel matrix directory; returns its subcollection name."""
    from ..api import SPEC_FORMAT, spec_header
    from ..checkpointing import write_new_model
    from ..spec import Tagged, dump

    meta, values = read_angel(matrix_dir)
    name = fresh_name(AngelMatrix)
    dtype = "float32" if values.dtype == np.float32 else str(values.dtype)
    tree = Tagged("!AngelMatrix", {"name": str(meta.get("matrixName", "")), "rows": values.shape[0], "cols": values.shape[1],
                                   "dtype": dtype, "xser_subcol_name": name})
    text = spec_header(os.fspath(out)) + dump({"xser_format": SPEC_FORMAT, "name": str(meta.get("matrixName")), "experiment": tree})
    info = {k: v for k, v in meta.items() if k != "partMetas"}
    write_new_model(os.fspath(out), {name: {"values": (values, True)}}, text,
                    {"training": {"imported_from": os.path.abspath(os.fspath(matrix_dir)), "angel_meta": info}},
                    durable=durable, force=force)
    return name
