"""Partial saves: write a large parameter in row blocks as they are ready, then commit once.

For long trainings that produce a matrix label by label (DiSMEC++'s ``PartialModelSaver``) and
for several workers each writing its own rows. Blocks go to ``<model>.data.partial/``, each as a
complete ``.npy`` file plus a small JSON note (written after the file, both by rename), so an
interrupted run loses at most the block being written and a new ``PartialSaver`` on the same
path resumes where it stopped (``missing()`` says what is left). ``finalize()`` refuses gaps
and overlaps and publishes one checkpoint with the same all-or-nothing commit as a save.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
from typing import Any

import numpy as np

from ..errors import DataError, Location, did_you_mean, shape_str
from ..model.serialize import to_tree
from ..storage.commit import write_text_atomic
from ..storage.formats import FORMATS
from ..storage.formats.npy import describe_dtype, parse_dtype
from ..storage.fsutil import fsync_dir, makedirs_durable
from ..storage.opened import DirHandle
from ..storage.payloads import FromFile, FromFiles

__all__ = ["PartialSaver"]


LAYOUT = "layout.json"


class _Decl:
    def __init__(self, shape: tuple, dtype: np.dtype) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


class PartialSaver:
    """Collect row blocks of ``obj``'s parameters under ``path``, then ``finalize()``.

    The first ``PartialSaver`` on a path records the parameters' names, shapes and dtypes in
    ``<model>.data.partial/layout.json``. Workers in other processes either pass an object with
    the same subcollection names (built from one saved spec: ``xser.load`` of a model saved
    once before the workers start) or join without an object: ``PartialSaver.join(path)``.
    One process that holds the object calls ``finalize``; parameters that never got a block
    are saved whole from ``obj`` then.
    """

    def __init__(self, path: str | os.PathLike, obj: Any = None, *, worker: str | None = None, durable: bool = True) -> None:
        self.path = os.fspath(path)
        self.obj = obj
        self.durable = durable
        self.worker = worker or f"{socket.gethostname()}-{os.getpid()}"
        self.staging = self.path + ".data.partial"
        recorded = self._read_layout()
        if obj is None:
            if recorded is None:
                raise DataError("no partial save in progress to join (make the first PartialSaver with the model object)", Location(self.staging))
            self.decls = recorded
            return
        _, subcols = to_tree(obj)
        self.decls = {f"{n}/{d.name}": _Decl(d.shape, d.dtype) for n, (sub, _) in subcols.items() for d in sub.decls.values()}
        if recorded is not None:
            mine = {k: (d.shape, d.dtype) for k, d in self.decls.items()}
            theirs = {k: (d.shape, d.dtype) for k, d in recorded.items()}
            if mine != theirs:
                extra, lack = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
                detail = f"this object has {', '.join(extra[:3]) or 'the same names'}, the partial save has {', '.join(lack[:3]) or 'the same names'}"
                raise DataError(
                    f"the object's parameters differ from the partial save in progress ({detail}); build every worker's "
                    "object from one saved spec (xser.load) or use PartialSaver.join(path)",
                    Location(self.staging),
                )
            return
        try:
            makedirs_durable(self.staging, durable=durable)
            for key in self.decls:
                os.makedirs(os.path.join(self.staging, key.split("/")[0]), exist_ok=True)
            layout = {k: {"shape": list(d.shape), "dtype": describe_dtype(d.dtype)} for k, d in self.decls.items()}
            write_text_atomic(os.path.join(self.staging, LAYOUT), json.dumps(layout) + "\n", durable=durable)
        except OSError as e:
            raise DataError(f"cannot start a partial save: {e.strerror or e}", Location(self.staging)) from None

    @classmethod
    def join(cls, path: str | os.PathLike, *, worker: str | None = None, durable: bool = True) -> PartialSaver:
        """A worker's saver for a partial save another process started (no model object needed)."""
        return cls(path, None, worker=worker, durable=durable)

    def _read_layout(self) -> dict | None:
        lpath = os.path.join(self.staging, LAYOUT)
        try:
            with open(lpath, encoding="utf-8") as f:
                raw = json.load(f)
            return {k: _Decl(tuple(v["shape"]), parse_dtype(v["dtype"])) for k, v in raw.items()}
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            raise DataError(f"unreadable partial-save layout: {e}", Location(lpath)) from None

    def _decl(self, key: str) -> Any:
        decl = self.decls.get(key)
        if decl is None:
            raise DataError(f"no parameter {key!r}{did_you_mean(key, self.decls)}", Location(self.path))
        return decl

    def written(self) -> dict[str, list[dict]]:
        """The blocks on disk, per ``"sub/param"``, sorted by first row (from every worker)."""
        out: dict[str, list[dict]] = {}
        for key in self.decls:
            sub, name = key.split("/")
            d = os.path.join(self.staging, sub)
            notes = []
            for f in os.listdir(d) if os.path.isdir(d) else []:
                if f.startswith(name + "@") and f.endswith(".block.json"):
                    try:
                        with open(os.path.join(d, f), encoding="utf-8") as fh:
                            notes.append(json.load(fh))
                    except (OSError, json.JSONDecodeError) as e:
                        raise DataError(f"unreadable block note: {e}", Location(os.path.join(d, f))) from None
            if notes:
                out[key] = sorted(notes, key=lambda n: n["first"])
        return out

    def missing(self) -> dict[str, list[tuple[int, int]]]:
        """Row ranges ``(first, stop)`` not written yet, for every parameter written in blocks."""
        out = {}
        for key, notes in self.written().items():
            gaps, nxt = [], 0
            for n in notes:
                if n["first"] > nxt:
                    gaps.append((nxt, n["first"]))
                nxt = max(nxt, n["first"] + n["count"])
            rows = self.decls[key].shape[0]
            if nxt < rows:
                gaps.append((nxt, rows))
            if gaps:
                out[key] = gaps
        return out

    def write_rows(self, key: str, first: int, rows: Any) -> str:
        """Write rows ``first .. first + len(rows)`` of parameter ``key`` as one block file; returns its path."""
        decl = self._decl(key)
        rows = np.asarray(rows)
        where = Location(self.path, path=key)
        if not decl.shape:
            raise DataError("a scalar parameter has no rows", where)
        if rows.dtype != decl.dtype or rows.shape[1:] != decl.shape[1:] or rows.ndim != len(decl.shape):
            raise DataError(
                f"rows are {shape_str(rows.shape)} {rows.dtype}; the parameter is {shape_str(decl.shape)} {decl.dtype}", where
            )
        stop = first + rows.shape[0]
        if not (0 <= first < stop <= decl.shape[0]):
            raise DataError(f"rows ({first}, {stop}) are outside the parameter's {decl.shape[0]} rows", where)
        for n in self.written().get(key, []):
            if first < n["first"] + n["count"] and n["first"] < stop:
                raise DataError(
                    f"rows ({first}, {stop}) overlap the block ({n['first']}, {n['first'] + n['count']}) written by {n['worker']}", where
                )
        sub, name = key.split("/")
        fname = f"{name}@{first}-{stop}.npy"
        full = os.path.join(self.staging, sub, fname)
        tmp = f"{full}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            size, digest = FORMATS["npy"].write(tmp, rows)
            if self.durable:
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
            os.rename(tmp, full)
            note = {"first": first, "count": stop - first, "file": fname, "bytes": size, "xxh3_64": digest, "worker": self.worker}
            write_text_atomic(full[: -len(".npy")] + ".block.json", json.dumps(note) + "\n", durable=self.durable)
        except OSError as e:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise DataError(f"cannot write block: {e.strerror or e}", Location(e.filename or full)) from None
        return full

    def finalize(self, *, training: dict | None = None, custom: dict | None = None, name: str | None = None) -> None:
        """Check every blocked parameter is covered exactly once, then publish one checkpoint."""
        from .saver import SaveOptions, save_model

        if self.obj is None:
            raise DataError("finalize needs the model object: call it on a PartialSaver made with one", Location(self.staging))
        written = self.written()
        problems = []
        for key, notes in written.items():
            nxt = 0
            for n in notes:
                if n["first"] < nxt:
                    problems.append(f"{key}: blocks overlap at row {n['first']}")
                nxt = max(nxt, n["first"] + n["count"])
        for key, gaps in self.missing().items():
            problems.append(f"{key}: rows {', '.join(f'{a}-{b - 1}' for a, b in gaps)} are missing")
        if problems:
            raise DataError("cannot finalize: " + "; ".join(problems), Location(self.staging))
        replace = {}
        with DirHandle.open_dir(self.staging) as src:
            for key, notes in written.items():
                decl = self.decls[key]
                sub = key.split("/")[0]
                files = []
                for n in notes:
                    rel = f"{sub}/{n['file']}"
                    with src.open_file(rel) as fh:
                        actual = os.fstat(fh.fileno()).st_size
                    if actual != n["bytes"]:
                        raise DataError(f"block file has {actual} bytes, its note says {n['bytes']}", Location(src.where(rel)))
                    files.append(FromFile(src, rel, decl.dtype, (n["count"],) + decl.shape[1:], n["bytes"],
                                          ("xxh3_64", n["xxh3_64"]), (n["first"],) + (0,) * (len(decl.shape) - 1)))
                replace[key] = FromFiles(decl.dtype, decl.shape, tuple(files))
            save_model(self.obj, self.path, SaveOptions(self.durable), name=name, training=training, custom=custom, replace=replace)
        shutil.rmtree(self.staging, ignore_errors=True)
        if self.durable:
            try:
                fsync_dir(os.path.dirname(os.path.abspath(self.path)))
            except OSError as e:
                raise DataError(f"cannot sync the model's directory: {e.strerror or e}", Location(self.path)) from None
