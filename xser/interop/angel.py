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
import struct
from typing import Any

import numpy as np

from . import takes_storage_options, writes_files
from ..storage.progress import advance, progress
from ..errors import DataError, Location, did_you_mean
from ..model.params import fresh_name, params
from ..model.registry import serializable
from ..storage.formats.angel_codec import ANGEL_FORMATS as FORMATS
from ..storage.formats.angel_codec import (BY_CLASS, PACKAGE, PARTITIONS_PER_FILE, decode_partition, encode_box, file_groups,
                                           row_type_of, rowmetas_order)
from ..storage.formats.angel_text import readable_separator
from ..storage.formats.angel_codec import row_type as angel_row_type
from ..storage.formats.java_text import java_string
from ..storage.replace import replaced_output, staged_file
from ..storage.source import open_source
from ..storage.stores import Store, store_for

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


def _recorded(model: Any, checkpoint: Any, shape: tuple) -> dict:
    """The Angel layout recorded when the model was imported from Angel (``angel_layout``), if it still fits a
    matrix of ``shape``; else {}."""
    from ..api import retrying
    from ..storage.listing import open_checkpoint

    def once() -> Any:
        with open_checkpoint(model, checkpoint) as data:
            return data.meta.get("training") or {}

    rec = retrying(os.fspath(model), once).get("angel_layout")
    if not isinstance(rec, dict):
        return {}
    meta = rec.get("meta") if isinstance(rec.get("meta"), dict) else {}
    if (meta.get("row"), meta.get("col")) != tuple(shape):
        return {}  # the matrix changed shape since: the recorded partitioning no longer fits
    return rec


def _partitions(recorded: Any, rows: int, cols: int) -> list[tuple[int, tuple[int, int, int, int], str]] | None:
    """The recorded ``(partId, (r0, r1, c0, c1), fileName)`` list, if it is one that tiles the matrix."""
    try:
        parts = [(int(p), (int(a), int(b), int(c), int(d)), str(f)) for p, a, b, c, d, f in recorded]
    except (TypeError, ValueError):
        return None
    try:
        _check_cover([((a, c), (b - a, d - c)) for _, (a, b, c, d), _ in parts], rows, cols, Location("recorded layout"))
    except DataError:
        return None
    return parts if parts else None


@takes_storage_options
@writes_files
def export_angel(
    model: str | os.PathLike,
    param: str,
    out_dir: str | os.PathLike,
    *,
    format: str | None = None,
    matrix_name: str | None = None,
    block_rows: int | None = None,
    sep: str | None = None,
    checkpoint: Any = 0,
    per_file: int | None = None,
    row_type: int | None = None,
    force: bool = False,
    storage_options: dict | None = None,
) -> list[str]:
    """Write ``param`` (a 2-D float32/float64/int32/int64 matrix) as an Angel matrix directory ``out_dir/<name>/``.

    Partitions of ``block_rows`` rows go into files the way Angel's PS groups them (halving the
    sorted list until a piece has at most ``per_file``, Angel's ``angel.ps.max.partition.number.single.file``),
    and each partition's ``rowMetas`` are listed in the order Angel's ``MatrixPartitionMeta`` writes them (a
    ``HashMap`` of default capacity). ``row_type`` is Angel's RowType number (default: dense, int keys, the
    matrix's value type): long-key types write 8-byte column ids, sparse types only the non-zero values.
    Options left out are the ones recorded when the model was imported from Angel (format, separator, row type,
    partitions and their files, matrix name and the rest of ``_meta``), so that export gives back the imported
    files byte for byte; else ``colid-value-text``, ``,``, one partition, 5 per file. ``param`` is
    ``"<subcollection>/<parameter>"`` or its component path; an existing ``out_dir/<name>`` is an error unless
    ``force`` (which replaces it whole). ``out_dir`` may be a URL (``s3://``, ``memory://``, ...; ``storage_options``
    go to its filesystem): the files are uploaded, ``_meta`` last (not atomic as a set there: see docs/interop.md).
    """
    import warnings

    from . import read_param, refuse_existing

    if format is not None and format not in FORMATS:
        raise DataError(f"unknown Angel format {format!r} (known: {', '.join(FORMATS)}){did_you_mean(format, FORMATS)}")
    if per_file is not None and per_file < 1:
        raise DataError(f"per_file must be at least 1, got {per_file}")
    if block_rows is not None and block_rows < 1:
        raise DataError(f"block_rows must be at least 1, got {block_rows}")
    w = read_param(model, param, checkpoint)
    pname = param.partition("/")[2] or param.rpartition(".")[2]
    if w.ndim != 2 or (w.dtype.kind, w.dtype.itemsize) not in (("f", 4), ("f", 8), ("i", 4), ("i", 8)):
        raise DataError(f"{param} is {w.dtype} of shape {tuple(w.shape)}; Angel stores 2-D float32, float64, int32 or int64 matrices")
    rows, cols = w.shape
    rec = _recorded(model, checkpoint, w.shape)
    rmeta = rec.get("meta") if isinstance(rec.get("meta"), dict) else {}
    format = format or (rec.get("format") if rec.get("format") in FORMATS else "colid-value-text")
    sep = sep if sep is not None else (rec.get("sep") if isinstance(rec.get("sep"), str) and rec.get("sep") else ",")
    if row_type is None:
        rt = rec.get("row_type")
        row_type = row_type_of(w.dtype)
        if isinstance(rt, int) and not isinstance(rt, bool) and 0 <= rt <= 27:  # its keys and density, the values the matrix has now
            row_type += rt % 7
    try:
        if not isinstance(row_type, int) or isinstance(row_type, bool):
            raise ValueError(f"unknown rowType {row_type!r}")
        vtype, long_ids, dense = angel_row_type(row_type)
    except ValueError as e:
        raise DataError(f"row type: {e} (0-27: double, float, long, int values; dense, sparse, long keys)") from None
    if (vtype.kind, vtype.itemsize) != (w.dtype.kind, w.dtype.itemsize):
        raise DataError(f"row type {row_type} holds {vtype.newbyteorder('=')} values, {param} is {w.dtype}")
    if format in ("colid-value-text", "rowid-colid-value-text", "text-column"):
        problem = readable_separator(sep)
        if problem:
            warnings.warn(f"export angel: {problem}", UserWarning, stacklevel=3)
    parts = None if block_rows is not None or per_file is not None else _partitions(rec.get("partitions"), rows, cols)
    if parts is None:
        block = block_rows or max(rows, 1)
        boxes = [(r0, min(rows, r0 + block), 0, cols) for r0 in range(0, max(rows, 1), block)]
        groups = file_groups(len(boxes), per_file or PARTITIONS_PER_FILE)
        parts = [(pid, box, str(g0)) for g0, g1 in groups for pid, box in list(enumerate(boxes))[g0:g1]]
    else:
        block = rmeta.get("blockRow", max(rows, 1))
    name = matrix_name or (rmeta.get("matrixName") if isinstance(rmeta.get("matrixName"), str) and rmeta.get("matrixName") else pname)
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise DataError(f"matrix name {name!r} must be a plain directory name")
    store = store_for(os.fspath(out_dir))
    target = store.join(os.fspath(out_dir), name)
    refuse_existing(target, force, store)
    column = format.endswith("column")
    metas: dict[int, Any] = {}
    written = []
    files: dict[str, list] = {}
    for pid, box, fname in parts:
        files.setdefault(fname, []).append((pid, box))
    with replaced_output(target, store=store, last=("_meta",)) as staging:  # the matrix directory appears whole, replacing an old one whole
        with progress(w.nbytes, "exporting"):
            for fname, group in files.items():
                offset = 0
                with staged_file(os.path.join(staging, fname)) as fh:
                    for pid, (r0, r1, c0, c1) in group:
                        data, row_metas, save_cols, save_col_elems = encode_box(w, (r0, r1, c0, c1), format, vtype, long_ids, dense, sep)
                        fh.write(data)
                        advance(w[r0:r1, c0:c1].nbytes)
                        by_row = dict(row_metas)
                        metas[pid] = {
                            "partId": pid, "startRow": r0, "endRow": r1, "startCol": c0, "endCol": c1,
                            "nnz": sum(n for _, n in row_metas) if not dense else (r1 - r0) * (c1 - c0),
                            "saveRowNum": 0 if column else r1 - r0, "saveColNum": save_cols, "saveColElemNum": save_col_elems,
                            "fileName": fname, "offset": offset, "length": len(data),
                            "rowMetas": {str(r): {"rowId": r, "offset": -1 if column else offset, "elementNum": by_row[r], "saveType": 0}
                                         for r in rowmetas_order([r for r, _ in row_metas])},
                        }
                        offset += len(data)
                written.append(store.join(target, fname))
        meta = {
            "matrixId": rmeta.get("matrixId", 1), "matrixName": name, "formatClassName": PACKAGE + FORMATS[format], "rowType": row_type,
            "row": rows, "col": cols, "blockRow": block, "blockCol": rmeta.get("blockCol", cols) if rmeta else cols,
            "options": rmeta.get("options") if isinstance(rmeta.get("options"), dict) else
            {"feature.index.range.end": str(cols), "feature.index.range.start": "0"},
            "partMetas": {str(pid): metas[pid] for pid in sorted(metas)},
        }
        body = _jettison(meta).encode("utf-8")
        with staged_file(os.path.join(staging, "_meta")) as fh:
            fh.write(struct.pack(">i", len(body)) + body)
    written.append(store.join(target, "_meta"))
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


@takes_storage_options
def read_angel(matrix_dir: str | os.PathLike, sep: str | None = None, *, storage_options: dict | None = None) -> tuple[dict, np.ndarray]:
    """The ``_meta`` and the matrix of an Angel matrix directory, every partition checked.

    Nothing is allocated before the declared sizes are checked against the bytes present: the
    partitions must tile the matrix (a missing one is an error, never zeros), and each must hold
    at least as many bytes as its values need in its layout (every value for a dense row type, the
    element counts its metadata declares for a sparse one). Text formats are split at ``sep``, a
    regular expression as Angel's reader uses it (``text.format.filed.sep``); found in each file when None.
    ``matrix_dir`` may be a URL (``storage_options`` go to its filesystem).
    """
    meta, out, _ = _read_angel(store_for(os.fspath(matrix_dir)), matrix_dir, sep)
    return meta, out


def _declared(fmt: str, pm: dict, size: tuple[int, int], dense: bool, pid: str, where: Location) -> int:
    """How many values a partition holds: all of them for a dense row type; as its metadata says for a sparse one
    (a row format: the rows' elementNum; a column format: saveColNum x saveColElemNum)."""
    if dense:
        return size[0] * size[1]
    if fmt.endswith("column"):
        return _int(pm.get("saveColNum"), f"partition {pid}: saveColNum", where) * _int(pm.get("saveColElemNum"), f"partition {pid}: saveColElemNum", where)
    metas = pm.get("rowMetas", {})
    if not isinstance(metas, dict):
        raise DataError(f"partition {pid}: rowMetas must be a mapping", where)
    return sum(_int(m.get("elementNum") if isinstance(m, dict) else None, f"partition {pid}: rowMetas[{k!r}].elementNum", where)
               for k, m in metas.items())


def _read_angel(store: Store, matrix_dir: str | os.PathLike, sep: str | None = None) -> tuple[dict, np.ndarray, dict[str, str]]:
    """read_angel, and the separator each text partition was split at (by partId)."""
    d = os.fspath(matrix_dir)
    mpath = store.join(d, "_meta")
    mwhere = Location(mpath)
    if not store.exists(mpath):
        raise DataError("no _meta file (not an Angel matrix directory?)", mwhere)
    raw = store.read_bytes(mpath, "_meta", limit=MAX_META)
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
        vdtype, long_ids, dense = angel_row_type(rt)
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
    sizes: dict[str, int] = {}
    for pid, pm in parts.items():
        start, size = _partition_box(str(pid), pm, rows, cols, mwhere)
        boxes.append((start, size))
        fname = pm.get("fileName")
        if not isinstance(fname, str) or not fname or os.path.isabs(fname) or ".." in fname.replace("\\", "/").split("/"):
            raise DataError(f"partition {pid}: file name {fname!r} must stay inside the matrix directory", mwhere)
        offset = _int(pm.get("offset"), f"partition {pid}: offset", mwhere)
        length = _int(pm.get("length"), f"partition {pid}: length", mwhere)
        path = store.join(d, fname)
        _check_extent(store, path, str(pid), offset, length, sizes)
        reads.append((int(pid) if str(pid).lstrip("-").isdigit() else 0, str(pid), pm, path, offset, length))
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
    for (_, size), (_, pid, pm, _, _, length) in zip(boxes, reads):
        values = _declared(fmt, pm, size, dense, pid, mwhere)
        need = values * _MIN_BYTES[fmt]
        if length < need:
            what = f"its {size[0]}x{size[1]} values" if dense else f"the {values} values its metadata declares"
            raise DataError(f"partition {pid}: {length} bytes cannot hold {what} ({fmt} needs at least {need})", mwhere)
    out = np.zeros((rows, cols), vdtype.newbyteorder("="))
    seps: dict[str, str] = {}
    for _, pid, pm, path, offset, length in sorted(reads, key=lambda r: (r[0], r[1])):
        try:
            with open_source(store, path, f"partition {pid}'s data file", missing=f"partition {pid}: data file missing",
                             special=f"partition {pid}: not a regular file") as fh:
                fh.seek(offset)
                data = _read_span(fh, length)
        except OSError as e:
            raise DataError(f"partition {pid}: cannot read: {e.strerror or e}", Location(path)) from None
        if len(data) != length:
            raise DataError(f"partition {pid} is truncated: {len(data)} of {length} bytes at offset {offset}", Location(path))
        try:
            found = decode_partition(out, pm, data, fmt, vdtype, long_ids, path, sep=sep, dense=dense, sep_regex=sep is not None)
            if found is not None and data:
                seps[pid] = found
        except DataError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, struct.error, AttributeError) as e:
            raise DataError(f"partition {pid}: malformed metadata or data ({type(e).__name__}: {e})", Location(path)) from None
    return meta, out, seps


def _read_span(f: object, length: int) -> bytes:
    """Up to ``length`` bytes from where an open file stands, however many reads it takes."""
    parts, got = [], 0
    while got < length:
        b = f.read(length - got)  # type: ignore[attr-defined]
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def _check_extent(store: Store, path: str, pid: str, offset: int, length: int, sizes: dict[str, int]) -> None:
    """The partition's bytes are in its data file, a regular file (the store refuses a FIFO when it is opened, never
    waiting for it), so that the sizes checked before allocating are the bytes really there."""
    if path not in sizes:
        try:
            with open_source(store, path, f"partition {pid}'s data file", missing=f"partition {pid}: data file missing",
                             special=f"partition {pid}: not a regular file") as f:
                sizes[path] = f.size
        except OSError as e:
            raise DataError(f"partition {pid}: cannot read: {e.strerror or e}", Location(path)) from None
    if offset + length > sizes[path]:
        raise DataError(f"partition {pid} is truncated: {max(0, min(length, sizes[path] - offset))} of {length} bytes at offset "
                        f"{offset}", Location(path))


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


@takes_storage_options
def import_angel(matrix_dir: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, durable: bool = True,
                 sep: str | None = None, storage_options: dict | None = None) -> str:
    """Make an xser model (one ``!AngelMatrix``) of an Angel matrix directory; returns its subcollection name.

    ``sep``: the text formats' separator, a regular expression as Angel's reader takes it (found in the files
    when None). The model's metadata records the layout (``angel_layout``: format, separator, row type, the
    partitions and their files, the rest of ``_meta``), which ``export_angel`` uses when not told otherwise.
    ``matrix_dir`` may be a URL (``s3://``, ``hdfs://``, ``memory://``, ...; ``storage_options`` go to its filesystem)."""
    from . import where_from

    from ..checkpoints.newmodel import write_new_model
    from ..checkpoints.saver import SaveOptions
    from ..checkpoints.snapshot import Snapshot
    from ..spec import Tagged, dump
    from ..spec.saved import SPEC_FORMAT, spec_header

    meta, values, seps = _read_angel(store_for(os.fspath(matrix_dir)), matrix_dir, sep)
    name = fresh_name(AngelMatrix)
    dtype = "float32" if values.dtype == np.float32 else str(values.dtype)
    tree = Tagged("!AngelMatrix", {"name": str(meta.get("matrixName", "")), "rows": values.shape[0], "cols": values.shape[1],
                                   "dtype": dtype, "xser_subcol_name": name})
    text = spec_header(os.fspath(out)) + dump({"xser_format": SPEC_FORMAT, "name": str(meta.get("matrixName")), "experiment": tree})
    info = {k: v for k, v in meta.items() if k != "partMetas"}
    parts = sorted(meta["partMetas"].items(), key=lambda kv: (str(kv[1]["fileName"]), kv[1]["offset"], str(kv[0])))
    layout = {
        "format": BY_CLASS[meta["formatClassName"]], "row_type": meta["rowType"],
        "sep": sep if sep is not None else next(iter(seps.values()), ","),
        "partitions": [[int(pid) if str(pid).lstrip("-").isdigit() else pid, pm["startRow"], pm["endRow"], pm["startCol"], pm["endCol"],
                        pm["fileName"]] for pid, pm in parts],
        "meta": info,
    }
    meta_out = {"training": {"imported_from": where_from(os.fspath(matrix_dir)), "angel_meta": info, "angel_layout": layout}}
    write_new_model(os.fspath(out), [Snapshot(text, {name: {"values": (values, True)}}, meta_out)], SaveOptions(durable), force=force)
    return name
