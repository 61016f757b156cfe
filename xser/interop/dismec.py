"""DiSMEC++ models: a JSON metadata file plus weight files of contiguous label rows.

Layout, byte by byte, in ``docs/research/formats.md`` section 1 (checked against files
DiSMEC++ wrote, copied to ``tests/data/dismec/``). Import reads every weight format strictly
(non-finite values, short rows, bad sparse indices are errors with file and line) and makes an
xser model whose one parameter keeps DiSMEC++'s row ranges as blocks. Export writes files
byte-identical to DiSMEC++'s own, with its naming, key order and indentation.

Defects of DiSMEC++ that are not copied: weight files are resolved relative to the metadata
file (never the working directory); a metadata file with the documented but wrong ``"weights"``
key is refused with a message saying that DiSMEC++ reads ``"files"``.
"""

from __future__ import annotations

import json
import math
import os
from datetime import datetime, timezone
from typing import Any

import attrs
import numpy as np

from . import takes_storage_options, writes_files
from ..storage.progress import advance, progress
from ..storage.replace import replaced_outputs, staged_file
from ..errors import DataError, Location, did_you_mean
from ..model.params import fresh_name, params
from ..model.registry import serializable
from ..storage.formats.dismec_codec import dense_text, dismec_npy, lost_values, save_model_files, sparse_text
from ..storage.stores import Store, store_for

__all__ = ["DismecModel", "export_dismec", "import_dismec", "read_dismec"]

FORMATS = ("DenseTXT", "SparseTXT", "DenseNPY")


@serializable(tag="!DismecModel")
class DismecModel:
    """A DiSMEC++ weight matrix: one row of ``num_features`` weights per label. A partial model (imported from a
    checkpoint of a training run with some label ranges still missing) holds only the ``present`` ranges'
    rows, ``[[first, count], ...]`` in label order."""

    num_labels: int
    num_features: int
    present: list | None = None

    def __attrs_post_init__(self):
        rows = self.num_labels if self.present is None else sum(int(c) for _, c in self.present)
        self.weights = params(self).add("weights", (rows, self.num_features), init="zeros")


@attrs.frozen
class WeightFile:
    first: int
    count: int
    file: str
    format: str
    #: text formats: the ``%.{P}g`` precision the file was written with (``text.g_precision``), recorded at import
    precision: int | None = None


# ---------------------------------------------------------------- reading


def _meta(store: Store, path: str, partial: bool = False) -> tuple[dict, list[WeightFile]]:
    raw = store.read_bytes(path, "metadata file")
    try:
        meta = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise DataError("not DiSMEC++ metadata (JSON): nested too deeply", Location(path)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        line = getattr(e, "lineno", None)
        raise DataError(f"not DiSMEC++ metadata (JSON): {getattr(e, 'msg', e)}", Location(path, line, getattr(e, "colno", None))) from None
    if not isinstance(meta, dict):
        raise DataError("DiSMEC++ metadata must be a JSON object", Location(path))
    if "files" not in meta:
        if "weights" in meta:
            raise DataError('the weight files are listed under "weights", but DiSMEC++ reads "files" (its documentation is wrong)', Location(path))
        raise DataError('no "files" in the metadata (a model without weight files)', Location(path))
    for key in ("num-labels", "num-features"):
        if not isinstance(meta.get(key), int) or isinstance(meta.get(key), bool) or meta[key] < 0:
            raise DataError(f"{key!r} must be a non-negative int, got {meta.get(key)!r}", Location(path))
    files = []
    for i, e in enumerate(meta["files"] if isinstance(meta["files"], list) else [None]):
        where = Location(path, path=f"files.{i}")
        if not isinstance(e, dict):
            raise DataError('"files" must be a list of {first, count, file, weight-format}', where)
        missing = [k for k in ("first", "count", "file", "weight-format") if k not in e]
        if missing:
            raise DataError(f"missing {missing[0]!r}", where)
        for key in ("first", "count"):
            if not isinstance(e[key], int) or isinstance(e[key], bool):
                raise DataError(f"{key!r} must be an int, got {e[key]!r}", where)
        if not isinstance(e["file"], str) or not isinstance(e["weight-format"], str):
            raise DataError(f"'file' and 'weight-format' must be strings, got {e['file']!r} and {e['weight-format']!r}", where)
        wf = WeightFile(e["first"], e["count"], e["file"], e["weight-format"])
        if wf.format not in FORMATS:
            raise DataError(f"unknown weight-format {wf.format!r} (known: {', '.join(FORMATS)}){did_you_mean(wf.format, FORMATS)}", where)
        if wf.count < 0 or wf.first < 0:
            raise DataError(f"first and count must be >= 0, got {wf.first} and {wf.count}", where)
        files.append(wf)
    files.sort(key=lambda w: w.first)
    nxt = 0
    for wf in files:
        if wf.first < nxt:
            raise DataError(f"weight files overlap: {wf.file} starts at label {wf.first}, before {nxt}", Location(path))
        if wf.first > nxt and not partial:
            raise DataError(f"labels {nxt} to {wf.first - 1} are in no weight file (a checkpoint of an unfinished "
                            "run? import the ranges present with --partial)", Location(path))
        nxt = wf.first + wf.count
    if nxt > meta["num-labels"] or (nxt != meta["num-labels"] and not partial):
        raise DataError(f"weight files cover {nxt} labels, num-labels is {meta['num-labels']}", Location(path))
    return meta, files


def _resolve(store: Store, meta_path: str, name: str) -> str:
    if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        raise DataError(f"weight file {name!r} must be a path relative to the metadata file, inside its directory", Location(meta_path))
    return store.join(store.parent(meta_path), name)


def _read_text(fmt: Any, store: Store, path: str, count: int, features: int) -> tuple[np.ndarray, int | None]:
    """A DiSMEC++ text file, parsed by xser's own text format (every value must be finite), and its precision."""
    from ..storage.formats.text import SPARSE_TEXT, g_precision

    data = store.read_bytes(path, "weight file")
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if len(lines) != count:
        raise DataError(f"{len(lines)} rows, the metadata says {count}", Location(path, min(len(lines), count) + 1))
    out = fmt._parse(lines, count, features, np.dtype(np.float32), path).reshape(count, features)
    bad = np.argwhere(~np.isfinite(out))
    if bad.size:
        r, c = bad[0]
        raise DataError(f"non-finite value {str(out[r, c])!r}", Location(path, int(r) + 1))
    return out, g_precision(data, sparse=fmt is SPARSE_TEXT)


def _read_dense_text(store: Store, path: str, count: int, features: int) -> tuple[np.ndarray, int | None]:
    from ..storage.formats.text import DENSE_TEXT

    return _read_text(DENSE_TEXT, store, path, count, features)


def _read_sparse_text(store: Store, path: str, count: int, features: int) -> tuple[np.ndarray, int | None]:
    from ..storage.formats.text import SPARSE_TEXT

    return _read_text(SPARSE_TEXT, store, path, count, features)


def _read_npy(store: Store, path: str, count: int, features: int) -> tuple[np.ndarray, int | None]:
    from ..storage.formats.npy import read_header
    from ..storage.source import open_source

    with open_source(store, path, "weight file") as f:
        shape, fortran, dtype, offset = read_header(f, path)
        if dtype != np.dtype("<f4") or fortran or tuple(shape) != (count, features):
            raise DataError(
                f"expected a C-order <f4 array of shape ({count}, {features}), found {'Fortran-order ' if fortran else ''}{dtype.str} {tuple(shape)}",
                Location(path),
            )
        data = _rest(f)
    if len(data) != count * features * 4:
        raise DataError(f"file holds {len(data)} data bytes, expected {count * features * 4}", Location(path))
    return np.frombuffer(data, "<f4").reshape(count, features).copy(), None


_READERS = {"DenseTXT": _read_dense_text, "SparseTXT": _read_sparse_text, "DenseNPY": _read_npy}


#: a SparseTXT file may become a dense array of at most this many bytes per byte on disk (or MAX_DENSE_FLOOR), as
#: for Angel's sparse row types: beyond that the model is very sparse, and a dense array of it a memory bomb
DENSE_PER_STORED_BYTE = 64
MAX_DENSE_FLOOR = 256 << 20


def _rest(f: Any) -> bytes:
    """The rest of an open file, from where it stands."""
    parts = []
    while True:
        b = f.read(1 << 24)
        if not b:
            return b"".join(parts)
        parts.append(b)


def _check_dense_size(store: Store, path: str, wf: WeightFile, features: int) -> None:
    size = store.size(path)
    if size is None:
        return  # the reader says why
    need = wf.count * features * 4
    if need > max(MAX_DENSE_FLOOR, DENSE_PER_STORED_BYTE * size):
        raise DataError(f"{wf.count} labels of {features} features in a SparseTXT file of {size} bytes would take {need} bytes "
                        "as the dense matrix xser imports; refused before allocating (a very sparse model, or a wrong "
                        "num-features)", Location(path))


@takes_storage_options
def read_dismec(meta_path: str | os.PathLike, partial: bool = False, *, storage_options: dict | None = None
                ) -> tuple[dict, list[tuple[WeightFile, np.ndarray]]]:
    """The metadata and each weight file's rows, checked (``partial``: label ranges may be missing); each text
    file's ``WeightFile`` has the precision it was written with. ``meta_path`` may be a URL (``storage_options``
    go to its filesystem)."""
    meta_path = os.fspath(meta_path)
    return _read_dismec(store_for(meta_path), meta_path, partial)


def _read_dismec(store: Store, meta_path: str, partial: bool) -> tuple[dict, list[tuple[WeightFile, np.ndarray]]]:
    meta, files = _meta(store, meta_path, partial)
    out = []
    for wf in files:
        path = _resolve(store, meta_path, wf.file)
        if not store.exists(path):
            raise DataError(f"weight file {wf.file!r} not found (resolved relative to the metadata file)", Location(path))
        if wf.format == "SparseTXT":
            _check_dense_size(store, path, wf, meta["num-features"])
        rows, precision = _READERS[wf.format](store, path, wf.count, meta["num-features"])
        out.append((attrs.evolve(wf, precision=precision), rows))
    return meta, out


@takes_storage_options
def import_dismec(meta_path: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, durable: bool = True,
                  partial: bool = False, storage_options: dict | None = None) -> str:
    """Make an xser model (one ``!DismecModel``) of a DiSMEC++ model; returns its subcollection name.

    ``partial`` imports the label ranges present in a metadata file that misses some (a checkpoint of an
    unfinished training run, which DiSMEC++'s partial loader reads): the model holds those rows only and
    records which labels they are (``present``), and the missing ranges are listed in its metadata. ``meta_path``
    may be a URL (``s3://``, ``memory://``, ...; ``storage_options`` go to its filesystem)."""
    from ..checkpoints.newmodel import write_new_model
    from ..checkpoints.saver import SaveOptions
    from ..checkpoints.snapshot import Snapshot
    from ..spec import Tagged, dump
    from ..spec.saved import SPEC_FORMAT, spec_header

    from . import where_from

    meta_path, out = os.fspath(meta_path), os.fspath(out)
    store = store_for(meta_path)
    meta, parts = _read_dismec(store, meta_path, partial)
    name = fresh_name(DismecModel)
    present = [[wf.first, wf.count] for wf, _ in parts]
    gaps = sum(c for _, c in present) != meta["num-labels"]
    weights = np.empty((sum(c for _, c in present) if gaps else meta["num-labels"], meta["num-features"]), np.float32)
    blocks, at = [], 0
    for wf, rows in parts:
        weights[at : at + wf.count] = rows
        blocks.append((at, wf.count))
        at += wf.count
    args = {"num_labels": meta["num-labels"], "num_features": meta["num-features"]}
    if gaps:
        args["present"] = present
    tree = Tagged("!DismecModel", {**args, "xser_subcol_name": name})
    text = spec_header(out) + dump({"xser_format": SPEC_FORMAT, "name": store.basename(meta_path), "experiment": tree})
    extra = {k: v for k, v in meta.items() if k not in ("files", "num-labels", "num-features")}
    meta_out = {
        "training": {"imported_from": where_from(meta_path), "dismec_files": [attrs.asdict(wf) for wf, _ in parts]},
        "custom": extra.pop("custom", {}) if isinstance(extra.get("custom", {}), dict) else {},
    }
    meta_out["training"]["dismec_metadata"] = extra
    if gaps:
        missing, nxt = [], 0
        for first, count in present + [[meta["num-labels"], 0]]:
            if first > nxt:
                missing.append([nxt, first - nxt])
            nxt = first + count
        meta_out["training"]["dismec_partial"] = {"present": present, "missing": missing}
    write_new_model(
        out, [Snapshot(text, {name: {"weights": (weights, True)}}, meta_out)],
        SaveOptions(durable, blocks={f"{name}/weights": blocks} if len(blocks) > 1 and all(c for _, c in blocks) else None), force=force,
    )
    return name


# ---------------------------------------------------------------- writing


def _recorded(model: Any, checkpoint: int, labels: int) -> tuple[list[dict] | None, dict]:
    """The weight files recorded when the model was imported from DiSMEC++ (if they still cover its labels),
    and the metadata's other keys (the date aside)."""
    from ..api import retrying
    from ..storage.listing import open_checkpoint

    def once() -> Any:
        with open_checkpoint(model, checkpoint) as data:
            return (data.meta.get("training") or {})

    training = retrying(os.fspath(model), once)
    files = training.get("dismec_files")
    extra = {k: v for k, v in (training.get("dismec_metadata") or {}).items() if k != "date"}
    if not isinstance(files, list) or not files:
        return None, extra
    try:
        recs = sorted(({"first": int(f["first"]), "count": int(f["count"]), "file": str(f["file"]), "format": str(f["format"]),
                        "precision": _recorded_precision(f.get("precision"))} for f in files), key=lambda f: f["first"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None, extra
    partial = training.get("dismec_partial") is not None
    contiguous = [r["first"] for r in recs] == [sum(x["count"] for x in recs[:i]) for i in range(len(recs))]
    if (not contiguous and not partial) or sum(r["count"] for r in recs) != labels or any(r["format"] not in FORMATS for r in recs):
        return None, extra  # the matrix changed shape since: the recorded layout no longer fits
    if partial:
        extra["num-labels"] = sum(c for _, c in training["dismec_partial"]["present"]) + sum(
            c for _, c in training["dismec_partial"]["missing"])
    return recs, extra


def _recorded_precision(p: Any) -> int | None:
    """A recorded precision, if it is one (models imported before xser recorded it have none)."""
    return p if isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 17 else None


def _check_ranges(ranges: Any, labels: int) -> list[tuple[int, int]]:
    out = [(int(a), int(b)) for a, b in ranges]
    at = 0
    for first, count in out:
        if first != at or count < 1:
            raise DataError(f"ranges must be contiguous (first, count) pairs from label 0 with count >= 1, got {list(ranges)}")
        at += count
    if at != labels:
        raise DataError(f"ranges cover {at} labels, the matrix has {labels}")
    return out


@takes_storage_options
@writes_files
def export_dismec(
    model: str | os.PathLike,
    param: str,
    meta_out: str | os.PathLike,
    *,
    format: str | None = None,
    precision: int | None = None,
    culling: float = 0.0,
    split_files: int = 4096,
    checkpoint: int = 0,
    date: str | None = None,
    layout: str = "auto",
    ranges: list[tuple[int, int]] | None = None,
    force: bool = False,
    storage_options: dict | None = None,
) -> list[str]:
    """Write ``param`` (``"<subcollection>/<parameter>"`` or its component path, a 2-D float matrix) as DiSMEC++ files.
    Existing files are an error unless ``force``.

    Returns the paths written (metadata last). ``date`` defaults to now, UTC, as DiSMEC++ writes it.
    ``format`` (DenseTXT, SparseTXT, DenseNPY) defaults to the recorded formats, else DenseTXT. ``layout``: ``"auto"`` gives back the file names, label ranges and formats recorded when the model was
    imported from DiSMEC++ (else ``"split"``); ``"split"`` is ``save_model``'s naming (``<meta>.weights`` or
    ``-K-of-N`` by ``split_files``); ``"cli"`` the ``train`` command's (``<meta>.weights-<first>-<last>``, last
    inclusive). ``ranges=[(first, count), ...]`` sets the label ranges explicitly (with "split" or "cli" naming).

    ``precision`` (significant digits of the text formats) defaults to the precision each file was found to have
    when it was imported (so the files come back byte for byte), else DiSMEC++'s default 6. A precision given
    explicitly that changes a value (lower than the imported files had, or than the float32 values need) warns.

    ``meta_out`` may be a URL (``s3://``, ``memory://``, ...; ``storage_options`` go to its filesystem): the files are
    uploaded, the metadata last (not atomic as a set there: see docs/interop.md).
    """
    import warnings

    from ..storage.formats.text import DISMEC_PRECISION

    from . import read_param, refuse_existing

    meta_out = os.fspath(meta_out)
    store = store_for(meta_out)
    if layout not in ("auto", "split", "cli"):
        raise DataError(f"layout must be auto, split or cli, got {layout!r}")
    if format is not None and format not in FORMATS:
        raise DataError(f"unknown DiSMEC++ format {format!r} (known: {', '.join(FORMATS)}){did_you_mean(format, FORMATS)}")
    if split_files < 1 or (precision is not None and not 1 <= precision <= 17):
        raise DataError(f"split-files must be >= 1 and precision from 1 to 17, got {split_files} and {precision}")
    if not (math.isfinite(culling) and culling >= 0):
        raise DataError(f"culling must be a finite number >= 0, got {culling}")
    w = read_param(model, param, checkpoint)
    if w.ndim != 2 or w.dtype.kind != "f":
        raise DataError(f"{param} is {w.dtype} of shape {tuple(w.shape)}; DiSMEC++ stores a 2-D float matrix", Location(os.fspath(model)))
    if not np.all(np.isfinite(w)):
        raise DataError(f"{param} holds non-finite values, which DiSMEC++ cannot read back", Location(os.fspath(model)))
    labels, features = w.shape
    base = store.basename(meta_out)
    recorded, extra = _recorded(model, checkpoint, labels) if layout == "auto" and ranges is None else (None, {})
    if recorded is not None:
        ranges = [(wf["first"], wf["count"]) for wf in recorded]
        names = [wf["file"] for wf in recorded]
        formats = [format or wf["format"] for wf in recorded]  # a format given explicitly wins
        found = [wf["precision"] for wf in recorded]
    else:
        if ranges is not None:
            ranges = _check_ranges(ranges, labels)
            names = [f"{base}.weights"] if len(ranges) == 1 else [f"{base}.weights-{k + 1}-of-{len(ranges)}" for k in range(len(ranges))]
        else:
            files = save_model_files(base, labels, split_files)
            ranges, names = [(first, count) for first, count, _ in files], [name for _, _, name in files]
        if layout == "cli":
            names = [f"{base}.weights-{first}-{first + count - 1}" for first, count in ranges]
        formats = [format or "DenseTXT"] * len(ranges)
        found = [None] * len(ranges)
    precisions = [precision or p or DISMEC_PRECISION for p in found]
    if culling and any(f != "SparseTXT" for f in formats):
        raise DataError(f"culling applies to SparseTXT only; this export writes {', '.join(sorted(set(formats)))}")
    parent = store.parent(meta_out)
    for name in [base, *names]:
        refuse_existing(store.join(parent, name), force, store)
    written = []
    row = 0
    # each file written beside its name, then put in place; the metadata, which names the others, last
    with replaced_outputs([store.join(parent, n) for n in names] + [meta_out], [False] * (len(names) + 1), store) as staged, \
            progress(w.nbytes, "exporting"):
        for (first, count), fname, format, digits, had in zip(ranges, names, formats, precisions, found):
            rows = w[row : row + count].astype(np.float32)  # a partial model's rows follow each other whatever the labels
            if precision is not None and format != "DenseNPY":
                lost = lost_values(rows, precision, np.ones(rows.shape, bool) if format == "DenseTXT" else np.abs(rows) > culling)
                if lost is not None:
                    n, r, c, text = lost
                    need = f"the imported file had {had} digits" if had else "9 keep every float32 value"
                    warnings.warn(f"export dismec: precision {precision} changes {n} of {rows.size} values of {fname} (label {first + r}, feature "
                                  f"{c}: {float(rows[r, c])!r} is written as {text}); {need}", UserWarning, stacklevel=3)
            row += count
            data = {"DenseTXT": lambda: dense_text(rows, digits), "SparseTXT": lambda: sparse_text(rows, digits, culling),
                    "DenseNPY": lambda: dismec_npy(rows)}[format]()
            path = store.join(parent, fname)
            with staged_file(staged[len(written)]) as f:
                f.write(data)
            written.append(path)
            advance(rows.nbytes)
        meta = {
            **extra,
            "date": date if date is not None else datetime.now(timezone.utc).strftime("%Y-%m-%d - %H:%M:%S"),
            "files": [{"count": c, "file": n, "first": s, "weight-format": f} for (s, c), n, f in zip(ranges, names, formats)],
            "num-features": features,
            "num-labels": extra.pop("num-labels", labels),
        }
        with staged_file(staged[-1], text=True) as f:
            f.write(json.dumps(meta, indent=4, sort_keys=True) + "\n")
    written.append(meta_out)
    return written
