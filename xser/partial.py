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

from .commit import FromFile, FromFiles, fsync_dir, write_text_atomic
from .errors import DataError, Location, did_you_mean, shape_str
from .formats import FORMATS
from .serialize import to_tree

__all__ = ["PartialSaver"]


class PartialSaver:
    """Collect row blocks of ``obj``'s parameters under ``path``, then ``finalize()``.

    Every process (worker) makes its own ``PartialSaver`` on the same path and object layout and
    writes the rows it owns with ``write_rows``; one of them (or any process) calls ``finalize``.
    Parameters that never got a block are saved whole from ``obj`` at ``finalize``.
    """

    def __init__(self, path: str | os.PathLike, obj: Any, *, worker: str | None = None, durable: bool = True) -> None:
        self.path = os.fspath(path)
        self.obj = obj
        self.durable = durable
        self.worker = worker or f"{socket.gethostname()}-{os.getpid()}"
        self.staging = self.path + ".data.partial"
        _, subcols = to_tree(obj)
        self.decls = {f"{n}/{d.name}": d for n, (sub, _) in subcols.items() for d in sub.decls.values()}
        for key in self.decls:
            os.makedirs(os.path.join(self.staging, key.split("/")[0]), exist_ok=True)

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
        from .checkpointing import save_checkpoint
        from .commit import ModelLock, clean_temporaries

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
        for key, notes in written.items():
            decl = self.decls[key]
            sub = key.split("/")[0]
            files = tuple(
                FromFile(os.path.join(self.staging, sub, n["file"]), decl.dtype, (n["count"],) + decl.shape[1:], n["bytes"],
                         ("xxh3_64", n["xxh3_64"]), (n["first"],) + (0,) * (len(decl.shape) - 1))
                for n in notes
            )
            for f in files:
                actual = os.path.getsize(f.path)
                if actual != f.bytes:
                    raise DataError(f"block file has {actual} bytes, its note says {f.bytes}", Location(f.path))
            replace[key] = FromFiles(decl.dtype, decl.shape, files)
        with ModelLock(self.path):
            clean_temporaries(self.path)
            save_checkpoint(self.obj, self.path, policy=None, durable=self.durable, name=name, training=training,
                            custom=custom, replace=replace)
        shutil.rmtree(self.staging, ignore_errors=True)
        if self.durable:
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
