"""Writing data directories all-or-nothing: staging, publishing, the saver lock, cleanup.

A data directory is first *staged* complete (arrays, then the manifest, fsynced) under a
temporary name, then *published* by rename. ``docs/format.md`` section 3 lists what a
crash between any two steps leaves behind and how the next save recovers.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fnmatch
import itertools
import json
import os
import secrets
import shutil
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import attrs
import numpy as np

from . import _version
from .errors import CheckpointError, DataError, Location, did_you_mean
from .formats import FORMATS, get_format
from .formats.npy import DEFAULT_CHECKSUM, describe_dtype
from .store import FORMAT_VERSION, MANIFEST, OLD_MARK, TMP_MARK, DataDir, ParamEntry, pool, siblings

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: no lock
    fcntl = None  # type: ignore[assignment]

__all__ = ["FromFile", "FromFiles", "block_size_for", "from_entry", "ModelLock", "Staged", "Stream", "clean_temporaries", "link_or_copy", "publish", "stage", "write_text_atomic"]

#: {subcollection: {param: (array or FromFile or Stream, trainable)}}
Arrays = Mapping[str, Mapping[str, tuple[Any, bool]]]


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def plain_json(value: Any, where: str) -> Any:
    """Check that caller metadata is JSON data; return a deep copy of it."""
    try:
        return json.loads(json.dumps(value, allow_nan=True))
    except (TypeError, ValueError) as e:
        raise DataError(f"{where} must be JSON data (dicts, lists, str, numbers, bool, None): {e}") from None


def temp_name(target: str, mark: str = TMP_MARK) -> str:
    return f"{target}{mark}{os.getpid()}-{secrets.token_hex(4)}"


@attrs.frozen
class FromFile:
    """An array (or one block of it) that exists as a published file: hard-linked (or copied)."""

    path: str
    dtype: np.dtype
    shape: tuple  # the block's shape
    bytes: int
    checksum: tuple[str, str]
    start: tuple | None = None  # where the block sits in the parameter (None: it is the parameter)
    format: str = "npy"


@attrs.frozen
class FromFiles:
    """A parameter stored in several published files (blocks)."""

    dtype: np.dtype
    shape: tuple
    blocks: tuple  # of FromFile, each with its start


def from_entry(data: DataDir, entry: ParamEntry) -> FromFile | FromFiles:
    """A published parameter as files to link."""
    files = tuple(
        FromFile(data.file_path(b.file), entry.dtype, b.box(entry.shape)[1], b.bytes, b.checksum, b.start, b.format)
        for b in entry.blocks
    )
    if len(files) == 1 and files[0].start is None:
        return files[0]
    return FromFiles(entry.dtype, entry.shape, files)


def _pieces(sub: str, name: str, item: Any, block: tuple | None, fmt: str) -> list[tuple[str, tuple | None, tuple | None, Any]]:
    """(relative file, start, block shape, payload) for each file a parameter is stored in."""
    base = f"{sub}/{name}"
    if isinstance(item, FromFiles):
        return [(f"{base}@{k}{FORMATS[f.format].suffix}", f.start, f.shape, f) for k, f in enumerate(item.blocks)]
    if isinstance(item, FromFile):
        return [(f"{base}{FORMATS[item.format].suffix}", None, None, item)]
    suffix = FORMATS[fmt].suffix
    if not isinstance(item, np.ndarray) or block is None or item.ndim == 0:
        return [(f"{base}{suffix}", None, None, item)]
    if block and isinstance(block[0], tuple):  # explicit row ranges [(first, count), ...]
        out = []
        for k, (first, count) in enumerate(block):
            shape = (count,) + item.shape[1:]
            out.append((f"{base}@{k}{suffix}", (first,) + (0,) * (item.ndim - 1), shape, item[first : first + count]))
        return out
    steps = tuple(block) + tuple(item.shape[len(block):])
    ranges = [range(0, max(n, 1), max(step, 1)) for n, step in zip(item.shape, steps)]
    out = []
    for k, start in enumerate(itertools.product(*ranges)):
        shape = tuple(min(step, n - a) for a, step, n in zip(start, steps, item.shape))
        view = item[tuple(slice(a, a + n) for a, n in zip(start, shape))]
        out.append((f"{base}@{k}{suffix}", tuple(start), shape, view))
    return out


def format_for(formats: Mapping[str, Any] | None, key: str) -> tuple[str, dict]:
    """(format name, write options) the ``formats`` patterns give ``sub/param``; npy by default."""
    for pattern, spec in (formats or {}).items():
        if fnmatch.fnmatchcase(key, pattern):
            name, options = (spec, {}) if isinstance(spec, str) else (spec[0], dict(spec[1]))
            if get_format(name) is None:
                raise DataError(f"unknown weight format {name!r} for {pattern!r} (known: {', '.join(sorted(FORMATS))}){did_you_mean(str(name), FORMATS)}")
            return name, options
    return "npy", {}


def block_size_for(blocks: Mapping[str, Any] | None, key: str) -> tuple | None:
    """The block size (rows, or rows and columns, ...) the ``blocks`` patterns give ``sub/param``."""
    if not blocks:
        return None
    for pattern, size in blocks.items():
        if fnmatch.fnmatchcase(key, pattern):
            if isinstance(size, list):  # explicit row ranges: [(first, count), ...], contiguous from 0
                ranges = [tuple(int(x) for x in r) for r in size]
                if not ranges or any(len(r) != 2 or r[1] < 1 for r in ranges) or any(
                    b[0] != a[0] + a[1] for a, b in zip(ranges, ranges[1:])
                ) or ranges[0][0] != 0:
                    raise DataError(f"row ranges for {pattern!r} must be contiguous (first, count) pairs from row 0, got {size!r}")
                return tuple(ranges)
            size = (size,) if isinstance(size, int) else tuple(size)
            if not size or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in size):
                raise DataError(f"block size for {pattern!r} must be an int >= 1 or a tuple of them, got {size!r}")
            return size
    return None


@attrs.frozen
class Stream:
    """An array produced chunk by chunk (``chunks()`` yields bytes in memory order)."""

    dtype: np.dtype
    shape: tuple
    fortran: bool
    chunks: Any  # () -> Iterable[bytes-like]


@attrs.define
class Staged:
    """A complete data directory under a temporary name, not yet published."""

    path: str
    manifest: dict
    written: int = 0
    linked: int = 0

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    @contextlib.contextmanager
    def discarded_on_error(self, what: str, where: str):
        """Remove the staging directory if the block fails; OS errors become a ``DataError``."""
        try:
            yield self
        except OSError as e:
            self.discard()
            raise DataError(f"{what}: {e.strerror or e}", Location(e.filename or where)) from None
        except BaseException:
            self.discard()
            raise


def link_or_copy(src: str, dst: str) -> bool:
    """Hard-link ``src`` to ``dst``; copy where links are impossible. True if linked."""
    try:
        os.link(src, dst)
        return True
    except OSError as e:
        if e.errno == errno.ENOENT and not os.path.exists(src):
            raise
    shutil.copyfile(src, dst)
    return False


def _store_array(
    path: str, arr: Any, prev: tuple[Any, str] | None, durable: bool, fmt: str = "npy", options: dict | None = None
) -> tuple[int, tuple[str, str], bool]:
    """Write one array, or hard-link it from the previous checkpoint if its bytes are unchanged."""
    npy = FORMATS["npy"]
    if isinstance(arr, FromFile):
        linked = link_or_copy(arr.path, path)
        if durable and not linked:
            _fsync_file(path)
        return arr.bytes, arr.checksum, linked
    if fmt != "npy" and isinstance(arr, np.ndarray):
        size, digest = FORMATS[fmt].write(path, arr, **(options or {}))
        if durable:
            _fsync_file(path)
        return size, (DEFAULT_CHECKSUM, digest), False
    if isinstance(arr, Stream):
        from .formats.npy import header_for

        size, digest = npy.write_stream(path, header_for(arr.dtype, arr.shape, arr.fortran), arr.chunks())
        if durable:
            _fsync_file(path)
        return size, (DEFAULT_CHECKSUM, digest), False
    if prev is not None:
        block, prev_file = prev
        known = npy.digest(arr)
        if block.checksum == (DEFAULT_CHECKSUM, known[1]) and block.bytes == known[0]:
            try:
                os.link(prev_file, path)
                return known[0], (DEFAULT_CHECKSUM, known[1]), True
            except OSError:
                pass  # no hard links here (or the file vanished): write it
        size, digest = npy.write(path, arr, known)
    else:
        size, digest = npy.write(path, arr)
    if durable:
        _fsync_file(path)
    return size, (DEFAULT_CHECKSUM, digest), False


def _previous(
    prev: DataDir | None, sub: str, name: str, arr: Any, start: tuple | None, shape: tuple | None
) -> tuple[Any, str] | None:
    """The previous checkpoint's block with the same place and shape, if any (a link candidate)."""
    if prev is None or not isinstance(arr, np.ndarray):
        return None
    entry = prev.subcollections.get(sub, {}).get(name)
    if entry is None or entry.dtype != arr.dtype:
        return None
    for b in entry.blocks:
        if b.format == "npy" and b.start == start and b.box(entry.shape)[1] == (shape if shape is not None else arr.shape):
            return b, os.path.join(prev.path, b.file)
    return None


def _param_entry(arr: Any, trainable: bool, blocks: list[tuple[str, tuple | None, tuple | None, int, tuple[str, str], str]]) -> dict:
    out = []
    for rel, start, shape, size, checksum, fmt in blocks:
        b: dict[str, Any] = {"file": rel, "format": fmt, "bytes": size, checksum[0]: checksum[1]}
        if start is not None:
            b["start"], b["shape"] = list(start), list(shape)
        out.append(b)
    return {"dtype": describe_dtype(arr.dtype), "shape": list(arr.shape), "trainable": bool(trainable), "blocks": out}


def stage(
    target: str,
    subcols: Arrays,
    *,
    durable: bool = True,
    previous: DataDir | None = None,
    meta: Mapping[str, Any] | None = None,
    training_state: Any = None,
    blocks: Mapping[str, Any] | None = None,
    formats: Mapping[str, Any] | None = None,
) -> Staged:
    """Write everything for ``target`` into a temporary directory beside it; manifest last.

    Arrays whose bytes equal ``previous``'s are hard-linked from it instead of written
    (files are never modified after they are published, so sharing them is safe).
    """
    meta = dict(meta or {})
    parent = os.path.dirname(os.path.abspath(target))
    tmp = temp_name(target)
    staged = Staged(tmp, {})
    with staged.discarded_on_error("cannot write data directory", target):
        os.makedirs(parent, exist_ok=True)
        os.mkdir(tmp)
        jobs = []
        for sub, params in subcols.items():
            os.mkdir(os.path.join(tmp, sub))
            for pname, (arr, trainable) in params.items():
                futs = []
                key = f"{sub}/{pname}"
                fmt, options = format_for(formats, key)
                for rel, start, shape, payload in _pieces(sub, pname, arr, block_size_for(blocks, key), fmt):
                    pfmt = payload.format if isinstance(payload, FromFile) else fmt
                    prev = _previous(previous, sub, pname, payload, start, shape) if pfmt == "npy" else None
                    fut = pool().submit(_store_array, os.path.join(tmp, rel), payload, prev, durable, pfmt, options)
                    futs.append((rel, start, shape, pfmt, fut))
                jobs.append((sub, pname, arr, trainable, futs))
        state = None
        if training_state is not None:
            state = _stage_training_state(tmp, training_state, durable)
        manifest: dict[str, Any] = {
            "format": "xser",
            "format_version": FORMAT_VERSION,
            "xser_version": _version.__version__,
            "created": now(),
            "step": meta.get("step"),
            "metrics": meta.get("metrics") or {},
            "training": meta.get("training") or {},
            "custom": meta.get("custom") or {},
            "subcollections": {sub: {} for sub in subcols},
        }
        for sub, pname, arr, trainable, futs in jobs:
            done = []
            for rel, start, shape, pfmt, fut in futs:
                size, checksum, linked = fut.result()
                staged.linked += linked
                staged.written += not linked
                done.append((rel, start, shape, size, checksum, pfmt))
            manifest["subcollections"][sub][pname] = _param_entry(arr, trainable, done)
        if state is not None:
            manifest["training_state"] = state
        with open(os.path.join(tmp, MANIFEST), "x", encoding="utf-8") as f:
            f.write(render_manifest(manifest))
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if durable:
            for sub in subcols:
                fsync_dir(os.path.join(tmp, sub))
            if state is not None:
                fsync_dir(os.path.join(tmp, "training_state"))
            fsync_dir(tmp)
        staged.manifest = manifest
    return staged


# ---------------------------------------------------------------- training state

_ARRAY_KEY = "$array"


def _stage_training_state(tmp: str, state: Any, durable: bool) -> dict:
    """Arrays go to training_state/<n>.npy; everything else is JSON with {"$array": n} markers."""
    os.mkdir(os.path.join(tmp, "training_state"))
    arrays: dict[str, dict] = {}

    def walk(value: Any, where: str) -> Any:
        if isinstance(value, (np.ndarray, FromFile)):
            key = str(len(arrays))
            rel = f"training_state/{key}.npy"
            size, checksum, _ = _store_array(os.path.join(tmp, rel), value, None, durable)
            arrays[key] = _param_entry(value, False, [(rel, None, None, size, checksum, getattr(value, "format", "npy"))])
            return {_ARRAY_KEY: key}
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, Mapping):
            out = {}
            for k, v in value.items():
                if not isinstance(k, str) or k.startswith("$"):
                    raise DataError(f"training_state{where}: keys must be strings not starting with '$', got {k!r}")
                out[k] = walk(v, f"{where}.{k}")
            return out
        if isinstance(value, (list, tuple)):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise DataError(f"training_state{where}: cannot store a {type(value).__name__} (arrays and JSON data only)")

    tree = walk(state, "")
    return {"tree": tree, "arrays": arrays}


def render_manifest(manifest: dict) -> str:
    """JSON with one line per parameter entry: diffable and readable by eye."""
    enc = lambda v: json.dumps(v, ensure_ascii=False, allow_nan=True)  # noqa: E731
    lines = ["{"]
    for key, value in manifest.items():
        if key != "subcollections":
            lines.append(f"  {enc(key)}: {enc(value)},")
    subs = manifest["subcollections"]
    lines.append('  "subcollections": {' + ("" if subs else "}"))
    for i, (sub, params) in enumerate(subs.items()):
        end = "," if i < len(subs) - 1 else ""
        if not params:
            lines.append(f"    {enc(sub)}: {{}}{end}")
            continue
        lines.append(f"    {enc(sub)}: {{")
        for j, (pname, entry) in enumerate(params.items()):
            lines.append(f"      {enc(pname)}: {enc(entry)}" + ("," if j < len(params) - 1 else ""))
        lines.append("    }" + end)
    if subs:
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- publishing


def _load_renameat2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _load_renameat2()
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), b)


def publish(tmp: str, target: str) -> str | None:
    """Put the complete directory ``tmp`` at ``target``; return where the old one went, if any.

    Where the OS can swap two directories atomically, ``target`` is never missing, even
    for a moment. Elsewhere the old directory is renamed aside first, so a crash between
    the two renames leaves ``target`` missing and both complete copies beside it.
    """
    if not os.path.lexists(target):
        os.rename(tmp, target)
        return None
    if _exchange(tmp, target):
        return tmp  # which now holds the old directory
    old = temp_name(target, OLD_MARK)
    os.rename(target, old)
    os.rename(tmp, target)
    return old


def write_text_atomic(path: str, text: str, *, durable: bool = True) -> None:
    """Write a small text file by temporary file + ``os.replace``."""
    parent = os.path.dirname(os.path.abspath(path))
    tmp = temp_name(path)
    try:
        os.makedirs(parent, exist_ok=True)
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(parent)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise DataError(f"cannot write file: {e.strerror or e}", Location(e.filename or path)) from None


def clean_temporaries(spec_path: str) -> list[str]:
    """Remove what interrupted saves of this model left: ``*.tmp-*`` and ``*.old-*`` beside it.

    Call only while holding the model's lock (no live saver is using them then).
    """
    parent, base, names = siblings(spec_path)
    prefixes = (base + TMP_MARK, base + ".data" + TMP_MARK, base + ".data" + OLD_MARK)
    removed = []
    for name in names:
        if name.startswith(prefixes):
            full = os.path.join(parent, name)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full, ignore_errors=True)
            else:
                try:
                    os.unlink(full)
                except FileNotFoundError:
                    pass
            removed.append(full)
    return removed


class ModelLock:
    """An exclusive ``fcntl.flock`` on ``<model>.lock``, held while saving.

    The kernel drops the lock when its holder dies, so a killed saver never blocks the
    next run. The file is removed on release; a process that locked a file which was
    removed meanwhile notices (different inode) and tries again.
    """

    def __init__(self, spec_path: str) -> None:
        self.path = os.path.abspath(spec_path) + ".lock"
        self._fd: int | None = None

    def acquire(self) -> ModelLock:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise CheckpointError(f"cannot create lock file: {e.strerror}", Location(self.path)) from None
            if fcntl is None:  # pragma: no cover - no flock on this platform
                break
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise CheckpointError(
                    f"another process (pid {holder}) is saving this model; wait for it or save elsewhere",
                    Location(self.path),
                ) from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the file was removed by its previous holder: lock the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> ModelLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
