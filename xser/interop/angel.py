"""Angel matrices: ``_meta`` (a big-endian length, then JSON) plus partition data files.

Layouts from ``docs/research/formats.md`` section 2 (read from Angel's source; the tests check
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
import shutil
import stat
import struct
from typing import Any

import numpy as np

from . import writes_files
from ..storage.progress import advance, progress
from ..errors import DataError, Location, did_you_mean
from ..model.params import fresh_name, params
from ..model.registry import serializable
from ..storage.formats.angel_codec import ANGEL_FORMATS as FORMATS
from ..storage.formats.angel_codec import (BY_CLASS, PACKAGE, PARTITIONS_PER_FILE, decode_partition, encode_partition, file_groups,
                                           hashmap_order, row_type)
from ..storage.formats.java_text import java_string

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
    per_file: int = PARTITIONS_PER_FILE,
    force: bool = False,
) -> list[str]:
    """Write ``param`` (a 2-D float matrix) as an Angel matrix directory ``out_dir/<name>/``.

    Partitions of ``block_rows`` rows go into files the way Angel's PS groups them (halving the
    sorted list until a piece has at most ``per_file``, Angel's ``angel.ps.max.partition.number.single.file``),
    and each partition's ``rowMetas`` are listed in the HashMap order Angel writes. ``param`` is
    ``"<subcollection>/<parameter>"`` or its component path; an existing ``out_dir/<name>`` is an error unless
    ``force`` (which replaces it whole).
    """
    from . import read_param, refuse_existing

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
    refuse_existing(target, force)
    if os.path.lexists(target):
        shutil.rmtree(target) if os.path.isdir(target) and not os.path.islink(target) else os.remove(target)
    os.makedirs(target)
    parts = [(k, r0, min(rows, r0 + block)) for k, r0 in enumerate(range(0, max(rows, 1), block))]
    column = format.endswith("column")
    metas: dict[str, Any] = {}
    written = []
    if per_file < 1:
        raise DataError(f"per_file must be at least 1, got {per_file}")
    with progress(w.nbytes, "exporting"):
        for g0, g1 in file_groups(len(parts), per_file):
            group = parts[g0:g1]
            fname = str(group[0][0])
            offset = 0
            with open(os.path.join(target, fname), "wb") as fh:
                for pid, r0, r1 in group:
                    data = encode_partition(w, r0, r1, 0, cols, format, is_float, sep)
                    fh.write(data)
                    advance(w[r0:r1].nbytes)
                    metas[str(pid)] = {
                        "partId": pid, "startRow": r0, "endRow": r1, "startCol": 0, "endCol": cols, "nnz": (r1 - r0) * cols,
                        "saveRowNum": 0 if column else r1 - r0, "saveColNum": cols if column else 0, "saveColElemNum": (r1 - r0) if column else 0,
                        "fileName": fname, "offset": offset, "length": len(data),
                        "rowMetas": {str(r): {"rowId": r, "offset": -1 if column else offset, "elementNum": cols, "saveType": 0}
                                     for r in hashmap_order(list(range(r0, r1)), r1 - r0)},
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


MAX_META = 64 << 20
#: a dense import may take at most this many bytes per byte on disk (or MAX_DENSE_FLOOR): beyond that the
#: matrix is sparse and a dense array of it would be a memory bomb
DENSE_PER_STORED_BYTE = 64
MAX_DENSE_FLOOR = 256 << 20
#: the fewest bytes one value takes in each layout (a text value is at least a digit and a separator)
_MIN_BYTES = {"value-binary": 4, "colid-value-binary": 8, "rowid-colid-value-binary": 12, "binary-column": 4,
              "value-text": 2, "colid-value-text": 4, "rowid-colid-value-text": 6, "text-column": 2}


def _int(value: Any, what: str, where: Location, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < 1 << 62:
        raise DataError(f"{what} must be an int >= {low}, got {value!r}", where)
    return value


def _partition_box(pid: str, pm: Any, rows: int, cols: int, where: Location) -> tuple[tuple[int, int], tuple[int, int]]:
    if not isinstance(pm, dict):
        raise DataError(f"partition {pid}: its metadata must be a mapping", where)
    r0, r1 = _int(pm.get("startRow"), f"partition {pid}: startRow", where), _int(pm.get("endRow"), f"partition {pid}: endRow", where)
    c0, c1 = _int(pm.get("startCol"), f"partition {pid}: startCol", where), _int(pm.get("endCol"), f"partition {pid}: endCol", where)
    if not (r0 <= r1 <= rows and c0 <= c1 <= cols):
        raise DataError(f"partition {pid}: rows {r0}-{r1}, cols {c0}-{c1} lie outside the {rows}x{cols} matrix", where)
    return (r0, c0), (r1 - r0, c1 - c0)


def read_angel(matrix_dir: str | os.PathLike) -> tuple[dict, np.ndarray]:
    """The ``_meta`` and the matrix of an Angel matrix directory, every partition checked.

    Nothing is allocated before the declared sizes are checked against the bytes present: the
    partitions must tile the matrix (a missing one is an error, never zeros), and each must hold
    at least as many bytes as its values need in its layout.
    """
    d = os.fspath(matrix_dir)
    mpath = os.path.join(d, "_meta")
    mwhere = Location(mpath)
    try:
        fd = os.open(mpath, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise DataError("no _meta file (not an Angel matrix directory?)", mwhere) from None
    except OSError as e:
        raise DataError(f"cannot read _meta: {e.strerror or e}", mwhere) from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_META:
            raise DataError(f"_meta must be a regular file of at most {MAX_META} bytes", mwhere)
        raw = fh.read(st.st_size)
    if len(raw) < 4:
        raise DataError("_meta is shorter than its 4-byte length prefix", mwhere)
    (n,) = struct.unpack(">i", raw[:4])
    if n < 0 or n > len(raw) - 4:
        raise DataError(f"_meta length prefix says {n} bytes of JSON, the file has {len(raw) - 4}", mwhere)
    try:
        meta = json.loads(raw[4 : 4 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise DataError(f"_meta JSON is corrupt: {e}", mwhere) from None
    if not isinstance(meta, dict):
        raise DataError("_meta JSON must be an object", mwhere)
    cls = meta.get("formatClassName")
    fmt = BY_CLASS.get(cls) if isinstance(cls, str) else None
    if fmt is None:
        known = sorted(BY_CLASS)
        raise DataError(f"unknown formatClassName {cls!r} (xser reads the 8 built-in formats){did_you_mean(str(cls), known)}", mwhere)
    try:
        rt = _int(meta.get("rowType"), "rowType", mwhere)
        vdtype, long_ids, dense = row_type(rt)
    except ValueError as e:
        raise DataError(f"_meta: {e}", mwhere) from None
    if not dense and fmt.startswith("value"):
        raise DataError(f"{fmt} stores values without column ids, and rowType {rt} is sparse: Angel wrote only the "
                        "non-zero values, so their columns are lost; save the matrix from Angel in a colid-value or "
                        "rowid-colid-value format", mwhere)
    rows, cols = _int(meta.get("row"), "row", mwhere), _int(meta.get("col"), "col", mwhere)
    parts = meta.get("partMetas", {})
    if not isinstance(parts, dict):
        raise DataError("partMetas must be a mapping", mwhere)
    boxes, reads = [], []
    for pid, pm in parts.items():
        start, size = _partition_box(str(pid), pm, rows, cols, mwhere)
        boxes.append((start, size))
        fname = pm.get("fileName")
        if not isinstance(fname, str) or not fname or os.path.isabs(fname) or ".." in fname.replace("\\", "/").split("/"):
            raise DataError(f"partition {pid}: file name {fname!r} must stay inside the matrix directory", mwhere)
        offset = _int(pm.get("offset"), f"partition {pid}: offset", mwhere)
        length = _int(pm.get("length"), f"partition {pid}: length", mwhere)
        reads.append((int(pid) if str(pid).lstrip("-").isdigit() else 0, str(pid), pm, os.path.join(d, fname), offset, length))
    _check_cover(boxes, rows, cols, mwhere)
    on_disk = sum(r[5] for r in reads)
    full = rows * cols * vdtype.itemsize
    if full > max(MAX_DENSE_FLOOR, DENSE_PER_STORED_BYTE * on_disk):
        raise DataError(
            f"this {rows}x{cols} matrix is stored in {on_disk} bytes but would take {full} bytes as the dense array xser "
            f"imports it as{' (a sparse long-key row type: an LR/FM-style model)' if not dense else ''}; refused before "
            "allocating. Save it from Angel with fewer columns, or export its non-zeros (colid-value-text) and load them "
            "as a hash table",
            mwhere,
        )
    for (_, size), (_, pid, _, _, _, length) in zip(boxes, reads):
        need = size[0] * size[1] * _MIN_BYTES[fmt]
        if length < need:
            raise DataError(
                f"partition {pid}: {length} bytes cannot hold its {size[0]}x{size[1]} values ({fmt} needs at least {need})", mwhere
            )
    out = np.zeros((rows, cols), vdtype.newbyteorder("="))
    for _, pid, pm, path, offset, length in sorted(reads):
        try:
            with open(path, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    raise DataError(f"partition {pid}: not a regular file", Location(path))
                fh.seek(offset)
                data = fh.read(length)
        except FileNotFoundError:
            raise DataError(f"partition {pid}: data file missing", Location(path)) from None
        except OSError as e:
            raise DataError(f"partition {pid}: cannot read: {e.strerror or e}", Location(path)) from None
        if len(data) != length:
            raise DataError(f"partition {pid} is truncated: {len(data)} of {length} bytes at offset {offset}", Location(path))
        try:
            decode_partition(out, pm, data, fmt, vdtype, long_ids, path, dense=dense)
        except DataError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, struct.error, AttributeError) as e:
            raise DataError(f"partition {pid}: malformed metadata or data ({type(e).__name__}: {e})", Location(path)) from None
    return meta, out


def _check_cover(boxes: list, rows: int, cols: int, where: Location) -> None:
    """The partitions tile the whole matrix: a missing partition is an error, never zeros."""
    from ..storage.manifest import Block, check_tiling

    if rows * cols == 0:
        return
    if not boxes:
        raise DataError(f"no partitions: the {rows}x{cols} matrix has no data", where)
    blocks = tuple(Block("_", "npy", 0, ("xxh3_64", "0"), s, n) for s, n in boxes)
    try:
        check_tiling(blocks, (rows, cols))
    except ValueError as e:
        raise DataError(f"partitions do not cover the matrix: {e}", where) from None


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
