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
from typing import Any

import numpy as np

from . import writes_files
from ..errors import DataError, Location, did_you_mean
from ..model.params import fresh_name, params
from ..model.registry import serializable
from ..storage.formats.angel_codec import ANGEL_FORMATS as FORMATS
from ..storage.formats.angel_codec import BY_CLASS, PACKAGE, PARTITIONS_PER_FILE, decode_partition, encode_partition, java_string, row_type

__all__ = ["AngelMatrix", "FORMATS", "export_angel", "import_angel", "java_string"]



@serializable(tag="!AngelMatrix")
class AngelMatrix:
    """An Angel matrix as one xser parameter ``values`` of shape (rows, cols)."""

    name: str
    rows: int
    cols: int
    dtype: str = "float32"

    def __attrs_post_init__(self):
        self.values = params(self).add("values", (self.rows, self.cols), dtype=self.dtype, init="zeros")


def _jettison(obj: Any) -> str:
    """jettison's JSONObject.toString(): compact, insertion order, '/' escaped as '\\/'."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).replace("/", "\\/")


@writes_files
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
                data = encode_partition(w, r0, r1, 0, cols, format, is_float, sep)
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
    fmt = BY_CLASS.get(cls)
    if fmt is None:
        known = sorted(BY_CLASS)
        raise DataError(f"unknown formatClassName {cls!r} (xser reads the 8 built-in formats){did_you_mean(str(cls), known)}", Location(mpath))
    try:
        vdtype, long_ids, _ = row_type(int(meta["rowType"]))
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
        decode_partition(out, pm, data, fmt, vdtype, long_ids, path)
    return meta, out


def import_angel(matrix_dir: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, durable: bool = True) -> str:
    """Make an xser model (one ``!AngelMatrix``) of an Angel matrix directory; returns its subcollection name."""
    from ..checkpoints.saver import SaveOptions, write_new_model
    from ..checkpoints.snapshot import Snapshot
    from ..spec import Tagged, dump
    from ..spec.saved import SPEC_FORMAT, spec_header

    meta, values = read_angel(matrix_dir)
    name = fresh_name(AngelMatrix)
    dtype = "float32" if values.dtype == np.float32 else str(values.dtype)
    tree = Tagged("!AngelMatrix", {"name": str(meta.get("matrixName", "")), "rows": values.shape[0], "cols": values.shape[1],
                                   "dtype": dtype, "xser_subcol_name": name})
    text = spec_header(os.fspath(out)) + dump({"xser_format": SPEC_FORMAT, "name": str(meta.get("matrixName")), "experiment": tree})
    info = {k: v for k, v in meta.items() if k != "partMetas"}
    meta_out = {"training": {"imported_from": os.path.abspath(os.fspath(matrix_dir)), "angel_meta": info}}
    write_new_model(os.fspath(out), [Snapshot(text, {name: {"values": (values, True)}}, meta_out)], SaveOptions(durable), force=force)
    return name
