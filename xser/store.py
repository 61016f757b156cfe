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
from .errors import DataError, Location, shape_str
from .formats import FORMATS
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
    """One file holding (part of) a parameter. ``start``/``shape`` are reserved for partitioned layouts."""

    file: str
    format: str
    bytes: int
    checksum: tuple[str, str]  # (algorithm, hex digest)


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

    def _file(self, rel: str) -> str:
        full = os.path.join(self.path, rel)
        real = os.path.realpath(full)
        if not real.startswith(self._real + os.sep):
            raise DataError(f"file {rel!r} resolves outside the data directory", Location(os.path.join(self.path, MANIFEST)))
        return full

    def read(self, entry: ParamEntry, *, mmap: bool = False, verify: bool = False) -> np.ndarray:
        (block,) = entry.blocks
        fmt = FORMATS[block.format]
        full = self._file(block.file)
        try:
            return fmt.read(full, entry.dtype, entry.shape, block.bytes, mmap=mmap, verify=block.checksum if verify else None)
        except FileNotFoundError:
            raise DataError(
                f"file of param {entry.name!r} of {entry.subcol} is missing", Location(full)
            ) from None
        except OSError as e:
            raise DataError(f"cannot read: {e.strerror or e}", Location(full)) from None

    def read_many(
        self, entries: Iterable[ParamEntry], *, mmap: bool = False, verify: bool = False
    ) -> dict[tuple[str, str], Future]:
        """Start reading several parameters at once; returns futures keyed by (subcol, name)."""
        out: dict[tuple[str, str], Future] = {}
        for e in entries:
            if mmap and not verify:
                fut: Future = Future()
                try:
                    fut.set_result(self.read(e, mmap=True))
                except DataError as err:
                    fut.set_exception(err)
                out[(e.subcol, e.name)] = fut
            else:
                out[(e.subcol, e.name)] = pool().submit(self.read, e, mmap=mmap, verify=verify)
        return out

    def read_all(self, *, mmap: bool = False, verify: bool = False) -> dict[str, dict[str, np.ndarray]]:
        futs = self.read_many((e for s in self.subcollections.values() for e in s.values()), mmap=mmap, verify=verify)
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


def _bad(msg: str, mpath: str) -> DataError:
    return DataError(f"corrupt manifest: {msg}", Location(mpath))


def _check_name(rel: Any, mpath: str) -> str:
    if not isinstance(rel, str) or not rel:
        raise _bad(f"file name must be a non-empty string, got {rel!r}", mpath)
    parts = rel.split("/")
    if rel.startswith("/") or os.path.isabs(rel) or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise DataError(f"unsafe file name {rel!r} (must be a relative path inside the data directory)", Location(mpath))
    return rel


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
                if not isinstance(blocks, list) or len(blocks) != 1:
                    raise ValueError("this xser reads exactly one block per parameter")
                b = blocks[0]
                sums = [k for k in CHECKSUMS if k in b]
                if set(b) - {"file", "format", "bytes"} - set(CHECKSUMS):
                    raise ValueError(f"block fields not understood by this xser: {sorted(set(b))}")
                if len(sums) != 1 or not isinstance(b[sums[0]], str):
                    raise ValueError(f"a block needs exactly one checksum ({' or '.join(CHECKSUMS)})")
                int(b[sums[0]], 16)
                if b["format"] not in FORMATS:
                    raise ValueError(f"unknown weight format {b['format']!r} (known: {', '.join(sorted(FORMATS))})")
                if not isinstance(b["bytes"], int) or b["bytes"] < 0:
                    raise ValueError(f"bad byte size {b['bytes']!r}")
                block = Block(_check_name(b["file"], mpath), b["format"], b["bytes"], (sums[0], b[sums[0]].lower()))
                trainable = e.get("trainable", True)
            except DataError:
                raise
            except KeyError as err:
                raise _bad(f"{where}: missing field {err.args[0]!r}", mpath) from None
            except (TypeError, ValueError) as err:
                raise _bad(f"{where}: {err}", mpath) from None
            entries[sub][pname] = ParamEntry(sub, pname, dtype, shape, bool(trainable), (block,))
    meta = {k: v for k, v in m.items() if k != "subcollections"}
    return meta, entries


def describe(entry: ParamEntry) -> str:
    return f"{shape_str(entry.shape)} {entry.dtype}"
