"""The ``<model>.data`` directory: layout, manifest, atomic commit, eager and lazy reads.

Layout (``docs/format.md`` is the specification)::

    model.yaml.data/
        manifest.json            # written last: the commit point
        Linear.98dc700f/         # one entry per subcollection, named exactly after it
            W.npy
            b.npy
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import attrs
import numpy as np

from . import _version
from .errors import DataError, Location, did_you_mean
from .formats import FORMATS, get_format
from .formats.npy import CHECKSUMS, parse_dtype

__all__ = ["DataDir", "ParamEntry", "data_dir_of", "read_manifest"]

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
TMP_MARK = ".tmp-"
OLD_MARK = ".old-"

_POOL: ThreadPoolExecutor | None = None


def pool() -> ThreadPoolExecutor:
    """A shared pool for file I/O (numpy and zlib release the GIL while copying and hashing)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="xser-io")
    return _POOL


def data_dir_of(spec_path: str | os.PathLike, checkpoint: int = 0) -> str:
    base = os.fspath(spec_path) + ".data"
    return base if checkpoint == 0 else f"{base}.{checkpoint}"


def siblings(spec_path: str | os.PathLike) -> tuple[str, str, list[str]]:
    """(parent directory, spec file name, names in the parent) for a model's spec path."""
    spec_path = os.fspath(spec_path)
    parent = os.path.dirname(os.path.abspath(spec_path))
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        names = []
    return parent, os.path.basename(spec_path), names


@attrs.frozen
class Block:
    """One file holding a parameter, or the box ``start``..``start + shape`` of it."""

    file: str
    format: str
    bytes: int
    checksum: tuple[str, str]  # (algorithm, hex digest)
    start: tuple[int, ...] | None = None  # None: the block is the whole parameter
    shape: tuple[int, ...] | None = None

    def box(self, full: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (self.start, self.shape) if self.start is not None else ((0,) * len(full), full)


@attrs.frozen
class ParamEntry:
    subcol: str
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    trainable: bool
    blocks: tuple[Block, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


# ---------------------------------------------------------------- reading


class DataDir:
    """A published data directory, opened by reading and checking its manifest."""

    def __init__(self, path: str, meta: dict, entries: dict[str, dict[str, ParamEntry]]) -> None:
        self.path = path
        self.meta = meta
        self.subcollections = entries
        self._real = os.path.realpath(path)

    @classmethod
    def open(cls, path: str | os.PathLike) -> DataDir:
        path = os.fspath(path)
        return cls(path, *read_manifest(path))

    def entry(self, subcol: str, name: str) -> ParamEntry:
        return self.subcollections[subcol][name]

    def file_path(self, rel: str) -> str:
        """The full path of a file named in the manifest, refused if it resolves outside the directory."""
        full = os.path.join(self.path, rel)
        real = os.path.realpath(full)
        if not real.startswith(self._real + os.sep):
            raise DataError(f"file {rel!r} resolves outside the data directory", Location(os.path.join(self.path, MANIFEST)))
        return full

    def read(
        self, entry: ParamEntry, *, mmap: bool = False, verify: bool = False, rows: tuple[int, int] | None = None
    ) -> np.ndarray:
        """The parameter's array, or only ``rows`` (first, stop) of it.

        A row range reads only the blocks that overlap it and, inside each, only the bytes of
        those rows (unless ``verify`` needs the whole file for its checksum). A parameter
        stored in several blocks is assembled in memory (``mmap`` applies to single files).
        """
        if rows is not None:
            first, stop = check_rows(entry, rows)
        elif len(entry.blocks) == 1 and entry.blocks[0].start is None:
            return self._read_block(entry, entry.blocks[0], None, mmap=mmap, verify=verify)
        else:
            first, stop = 0, (entry.shape[0] if entry.shape else 1)
        if not entry.shape:
            return self._read_block(entry, entry.blocks[0], None, mmap=False, verify=verify)
        out = np.empty((stop - first,) + entry.shape[1:], entry.dtype)
        for block in entry.blocks:
            start, bshape = block.box(entry.shape)
            lo, hi = max(first, start[0]), min(stop, start[0] + bshape[0])
            if lo >= hi:
                continue
            part = self._read_block(entry, block, (lo - start[0], hi - start[0]), mmap=False, verify=verify)
            index = (slice(lo - first, hi - first),) + tuple(slice(a, a + n) for a, n in zip(start[1:], bshape[1:]))
            out[index] = part
        return out

    def _read_block(self, entry: ParamEntry, block: Block, rows: tuple[int, int] | None, *, mmap: bool, verify: bool) -> np.ndarray:
        fmt = FORMATS[block.format]
        full = self.file_path(block.file)
        _, bshape = block.box(entry.shape)
        checksum = block.checksum if verify else None
        try:
            if rows is None:
                return fmt.read(full, entry.dtype, bshape, block.bytes, mmap=mmap, verify=checksum)
            return fmt.read_rows(full, entry.dtype, bshape, block.bytes, rows, verify=checksum)
        except FileNotFoundError:
            raise DataError(
                f"file of param {entry.name!r} of {entry.subcol} is missing", Location(full)
            ) from None
        except OSError as e:
            raise DataError(f"cannot read: {e.strerror or e}", Location(full)) from None

    def read_many(
        self, entries: Iterable[ParamEntry], *, mmap: bool = False, verify: bool = False, rows: dict | None = None
    ) -> dict[tuple[str, str], Future]:
        """Start reading several parameters at once; returns futures keyed by (subcol, name)."""
        out: dict[tuple[str, str], Future] = {}
        rows = rows or {}
        for e in entries:
            r = rows.get(f"{e.subcol}/{e.name}")
            if mmap and not verify and r is None:
                fut: Future = Future()
                try:
                    fut.set_result(self.read(e, mmap=True))
                except DataError as err:
                    fut.set_exception(err)
                out[(e.subcol, e.name)] = fut
            else:
                out[(e.subcol, e.name)] = pool().submit(self.read, e, mmap=mmap, verify=verify, rows=r)
        return out

    def check_row_keys(self, rows: dict | None) -> dict:
        """Every key of a ``rows`` mapping must name a parameter ("subcol/param")."""
        rows = dict(rows or {})
        known = [f"{s}/{n}" for s, ps in self.subcollections.items() for n in ps]
        for key in rows:
            sub, _, name = str(key).partition("/")
            if name not in self.subcollections.get(sub, {}):
                raise DataError(f"rows: no parameter {key!r}{did_you_mean(str(key), known)}", Location(self.path))
        return rows

    def read_all(
        self, *, mmap: bool = False, verify: bool = False, rows: dict | None = None
    ) -> dict[str, dict[str, np.ndarray]]:
        rows = self.check_row_keys(rows)
        futs = self.read_many(
            (e for s in self.subcollections.values() for e in s.values()), mmap=mmap, verify=verify, rows=rows
        )
        result: dict[str, dict[str, np.ndarray]] = {s: {} for s in self.subcollections}
        for (sub, name), fut in futs.items():
            result[sub][name] = fut.result()
        return result


def read_manifest(path: str) -> tuple[dict, dict[str, dict[str, ParamEntry]]]:
    """(metadata, entries) of the data directory ``path``; ``DataError`` if it is not a valid one."""
    if not os.path.isdir(path):
        raise DataError("data directory not found (was the model saved with xser.save?)", Location(path))
    mpath = os.path.join(path, MANIFEST)
    try:
        with open(mpath, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise DataError("manifest.json is missing: not a complete xser data directory", Location(path)) from None
    except OSError as e:
        raise DataError(f"cannot read manifest: {e.strerror}", Location(mpath)) from None
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(f"corrupt manifest: not UTF-8 ({e.reason} at byte {e.start})", Location(mpath)) from None
    except json.JSONDecodeError as e:
        raise DataError(f"corrupt manifest: {e.msg}", Location(mpath, e.lineno, e.colno)) from None
    return _check_manifest(manifest, mpath)


def check_rows(entry: ParamEntry, rows: Any) -> tuple[int, int]:
    """Validate a (first, stop) row range against a parameter."""
    where = Location(path=f"{entry.subcol}/{entry.name}")
    if not entry.shape:
        raise DataError("a row range needs a parameter with at least one dimension, this one is a scalar", where)
    try:
        first, stop = (int(x) for x in rows)
    except (TypeError, ValueError):
        raise DataError(f"rows must be (first, stop), got {rows!r}", where) from None
    if not 0 <= first < stop <= entry.shape[0]:
        raise DataError(f"rows ({first}, {stop}) are outside the parameter's {entry.shape[0]} rows", where)
    return first, stop


def _bad(msg: str, mpath: str) -> DataError:
    return DataError(f"corrupt manifest: {msg}", Location(mpath))


def _check_name(rel: Any, mpath: str) -> str:
    if not isinstance(rel, str) or not rel:
        raise _bad(f"file name must be a non-empty string, got {rel!r}", mpath)
    parts = rel.split("/")
    if rel.startswith("/") or os.path.isabs(rel) or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise DataError(f"unsafe file name {rel!r} (must be a relative path inside the data directory)", Location(mpath))
    return rel


def _check_block(b: Any, shape: tuple, mpath: str) -> Block:
    if not isinstance(b, dict):
        raise ValueError("a block must be a mapping")
    sums = [k for k in CHECKSUMS if k in b]
    if set(b) - {"file", "format", "bytes", "start", "shape"} - set(CHECKSUMS):
        raise ValueError(f"block fields not understood by this xser: {sorted(set(b))}")
    if len(sums) != 1 or not isinstance(b[sums[0]], str):
        raise ValueError(f"a block needs exactly one checksum ({' or '.join(CHECKSUMS)})")
    int(b[sums[0]], 16)
    if get_format(b["format"]) is None:
        near = did_you_mean(str(b["format"]), FORMATS)
        raise ValueError(f"unknown weight format {b['format']!r} (known: {', '.join(sorted(FORMATS))}){near}")
    if not isinstance(b["bytes"], int) or isinstance(b["bytes"], bool) or b["bytes"] < 0:
        raise ValueError(f"bad byte size {b['bytes']!r}")
    start = bshape = None
    if "start" in b or "shape" in b:
        start, bshape = _ints(b.get("start"), "start"), _ints(b.get("shape"), "shape")
        if len(start) != len(shape) or len(bshape) != len(shape):
            raise ValueError(f"block start {list(start)} and shape {list(bshape)} must have {len(shape)} dimensions")
        if any(a + n > full for a, n, full in zip(start, bshape, shape)):
            raise ValueError(f"block at {list(start)} of shape {list(bshape)} reaches outside shape {list(shape)}")
    return Block(_check_name(b["file"], mpath), b["format"], b["bytes"], (sums[0], b[sums[0]].lower()), start, bshape)


def _ints(v: Any, what: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise ValueError(f"block {what} must be a list of non-negative ints, got {v!r}")
    return tuple(v)


def _check_tiling(blocks: tuple[Block, ...], shape: tuple) -> None:
    """Blocks must cover the parameter exactly: no gaps, no overlaps."""
    if len(blocks) == 1 and blocks[0].start is None:
        return
    if any(b.start is None for b in blocks):
        raise ValueError("when a parameter has several blocks, each needs start and shape")
    total = int(np.prod(shape, dtype=np.int64))
    covered = sum(int(np.prod(b.shape, dtype=np.int64)) for b in blocks)
    boxes = sorted((b.start, b.shape) for b in blocks)
    for i, (a, an) in enumerate(boxes):
        for c, cn in boxes[i + 1 :]:
            if c[0] >= a[0] + an[0]:
                break
            if all(x < y + yn and y < x + xn for x, xn, y, yn in zip(a, an, c, cn)):
                raise ValueError(f"blocks at {list(a)} and {list(c)} overlap")
    if covered != total:
        raise ValueError(f"blocks cover {covered} of {total} elements: rows or columns are missing")


def _check_manifest(m: Any, mpath: str) -> tuple[dict, dict[str, dict[str, ParamEntry]]]:
    if not isinstance(m, dict) or m.get("format") != "xser":
        raise _bad("not an xser manifest (no \"format\": \"xser\")", mpath)
    version = m.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _bad(f"format_version must be an int, got {version!r}", mpath)
    if version > FORMAT_VERSION:
        raise DataError(
            f"format_version {version} was written by a newer xser (this is {_version.__version__}, reads <= {FORMAT_VERSION})",
            Location(mpath),
        )
    subs = m.get("subcollections")
    if not isinstance(subs, dict):
        raise _bad("\"subcollections\" must be a mapping", mpath)
    for key in ("training", "custom"):
        if not isinstance(m.get(key, {}), dict):
            raise _bad(f"{key!r} must be a mapping", mpath)
    entries: dict[str, dict[str, ParamEntry]] = {}
    for sub, params in subs.items():
        _check_name(sub, mpath)
        if "/" in sub or not isinstance(params, dict):
            raise _bad(f"subcollection {sub!r} must map parameter names to entries", mpath)
        entries[sub] = {}
        for pname, e in params.items():
            where = f"{sub}/{pname}"
            if not isinstance(e, dict):
                raise _bad(f"{where}: entry must be a mapping", mpath)
            try:
                dtype = parse_dtype(e["dtype"])
                shape = tuple(e["shape"])
                if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
                    raise ValueError(f"bad shape {e['shape']!r}")
                blocks = e["blocks"]
                if not isinstance(blocks, list) or not blocks:
                    raise ValueError("blocks must be a non-empty list")
                parsed = tuple(_check_block(b, shape, mpath) for b in blocks)
                _check_tiling(parsed, shape)
                trainable = e.get("trainable", True)
            except DataError:
                raise
            except KeyError as err:
                raise _bad(f"{where}: missing field {err.args[0]!r}", mpath) from None
            except (TypeError, ValueError) as err:
                raise _bad(f"{where}: {err}", mpath) from None
            entries[sub][pname] = ParamEntry(sub, pname, dtype, shape, bool(trainable), parsed)
    meta = {k: v for k, v in m.items() if k != "subcollections"}
    return meta, entries
