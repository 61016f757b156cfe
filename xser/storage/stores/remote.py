"""``FsspecStore``: the byte store of URLs (``s3://``, ``gs://``, ``hdfs://``, ``memory://``, ``file://``, ...).

fsspec and its backends are imported here only, inside functions, on the first URL (``import xser``
never imports them). URLs go in and come out whole, as the caller spelled them. docs/design.md
("Byte stores") says what each verb does on which store; in short:

- **One funnel**: every request to the filesystem passes through ``FsspecStore._call``, once per
  attempt: it calls the hook ``FsspecStore.on_request(op, url)``, retries transient failures
  (``RETRIES`` attempts, backoff from ``BACKOFF`` with jitter) and turns the rest into ``StorageError``
  (``remote_errors.py``). ``FileNotFoundError`` (a missing object) passes through for the verbs.
- **Conditional writes**: ``put(create_only=True)`` is atomic on S3 (``If-None-Match``), memory://
  (a lock), file:// (a link) and GCS where gcsfs supports it; a check then a write elsewhere.
- **Reads** are ranged GETs of exactly the bytes asked (``remote_files.RemoteFile``); ``put_file``
  holds at most ``PART_SIZE * PART_CONCURRENCY`` bytes; ``open_write`` publishes on a clean close only.
"""

from __future__ import annotations

import builtins
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, BinaryIO, ClassVar

from ...errors import DataError, Location, StorageError, XserError
from .local import LOCAL, AlreadyExists
from .remote_errors import CREDENTIAL_HELP, INSTALL, kind_of, missing_package, reason
from .remote_files import MemoryWriter, RemoteFile, Writer, read_limited

__all__ = ["BACKOFF", "PART_CONCURRENCY", "PART_SIZE", "RETRIES", "FsspecStore", "RemoteFile", "fsspec_store"]

#: attempts in all for a request that fails transiently (network, 5xx, throttling)
RETRIES = 4
#: seconds before the second attempt; doubles each time, times a random factor in [0.5, 1.5)
BACKOFF = 0.1
#: parallel uploads (``put_file`` on S3): parts of this many bytes ...
PART_SIZE = 16 * 2**20
#: ... this many at a time: at most ``PART_SIZE * PART_CONCURRENCY`` bytes of one upload in memory
PART_CONCURRENCY = 8

#: schemes whose filesystem caches listings: off, since other processes write the same prefixes
_LISTING_CACHE = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl"}
_BUCKETS = {"s3", "s3a", "gs", "gcs"}

_STORES: dict[Any, FsspecStore] = {}
_STORES_LOCK = threading.Lock()

if hasattr(os, "register_at_fork"):  # a forked child makes its own stores: s3fs filesystems belong to one process
    os.register_at_fork(after_in_child=_STORES.clear)
#: memory:// is one dict per process: create_only checks and writes under this lock
_MEMORY_LOCK = threading.Lock()


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    hash(value)
    return value


def fsspec_store(url: str, storage_options: dict[str, Any]) -> FsspecStore:
    """The ``FsspecStore`` of ``url``'s scheme built with ``storage_options`` (one per scheme and options)."""
    scheme = url.partition("://")[0].lower()
    try:
        key: Any = (scheme, _freeze(storage_options))
    except TypeError:
        key = None  # unhashable options: no cache
    if key is not None:
        with _STORES_LOCK:
            store = _STORES.get(key)
        if store is not None:
            return store
    try:
        from fsspec.registry import get_filesystem_class, known_implementations, registry  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        raise StorageError(f"{scheme}:// URLs need fsspec: {INSTALL}", Location(url)) from None
    unknown = StorageError(f"unknown storage scheme '{scheme}://' (fsspec knows no such protocol)", Location(url))
    if scheme not in known_implementations and scheme not in registry:
        raise unknown
    try:
        cls = get_filesystem_class(scheme)
    except ImportError as e:
        raise StorageError(missing_package(scheme, e), Location(url)) from None
    except ValueError:
        raise unknown from None
    options = dict(storage_options)
    if scheme in _LISTING_CACHE:
        options.setdefault("use_listings_cache", False)
    if scheme in ("file", "local"):
        options.setdefault("auto_mkdir", True)
    try:
        fs = cls(**options)
    except ImportError as e:  # a class that imports its package when made (hdfs: pyarrow)
        raise StorageError(missing_package(scheme, e), Location(url)) from None
    except Exception as e:  # bad options: the filesystem's own message
        raise StorageError(f"cannot open the {scheme}:// filesystem with these storage_options: {e}", Location(url)) from None
    store = FsspecStore(fs, scheme, storage_options)
    if key is not None:
        with _STORES_LOCK:
            store = _STORES.setdefault(key, store)
    return store


class FsspecStore:
    """The byte store of one fsspec filesystem (one scheme, one set of ``storage_options``)."""

    remote = True
    #: called as ``on_request(op, url)`` before every request to the filesystem (every attempt), when set
    on_request: ClassVar[Callable[[str, str], None] | None] = None

    def __init__(self, fs: Any, scheme: str, storage_options: dict[str, Any] | None = None) -> None:
        self.fs = fs
        self.scheme = scheme
        self.storage_options = dict(storage_options or {})
        self._local = scheme in ("file", "local")
        self._memory = scheme == "memory"
        self._s3 = scheme in ("s3", "s3a")
        self._native_create = self._s3 or (scheme in ("gs", "gcs") and _pipe_has_mode(fs))
        self.conditional = self._native_create or self._memory or self._local

    def __repr__(self) -> str:
        return f"FsspecStore({self.scheme}://)"

    # -- the funnel

    def _call(self, op: str, url: str, fn: Callable[..., Any], *args: Any, retry: bool = True, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``: one request to the filesystem, retried, with failures as ``StorageError``.

        ``FileNotFoundError`` (a missing object), ``FileExistsError`` (a create_only write that lost)
        and xser's own errors pass through."""
        attempts = RETRIES if retry else 1
        attempt = 1
        while True:
            hook = FsspecStore.on_request
            if hook is not None:
                hook(op, url)
            try:
                return fn(*args, **kwargs)
            except (XserError, FileExistsError):
                raise
            except Exception as e:
                kind = kind_of(e)
                if isinstance(e, FileNotFoundError) and kind != "bucket":
                    raise
                if kind == "transient" and attempt < attempts:
                    time.sleep(BACKOFF * 2 ** (attempt - 1) * (0.5 + random.random()))
                    attempt += 1
                    continue
                raise self._error(op, url, e, kind, attempt) from e

    def _error(self, op: str, url: str, e: BaseException, kind: str, attempts: int) -> StorageError:
        where = Location(url)
        if kind == "credentials":
            help = CREDENTIAL_HELP.get(self.scheme, "see the filesystem's documentation for its credentials")
            return StorageError(f"cannot {op}: no credentials found for {self.scheme}:// ({help})", where)
        if kind == "bucket":
            return StorageError(f"cannot {op}: bucket {self._bucket(url)!r} does not exist", where)
        if kind == "denied":
            return StorageError(f"cannot {op}: access denied ({reason(e)})", where)
        if kind == "transient":
            return StorageError(f"cannot {op}: failed after {attempts} attempts: {reason(e)}", where)
        return StorageError(f"cannot {op}: {reason(e)}", where)

    def _bucket(self, url: str) -> str:
        return self._path(url).lstrip("/").split("/", 1)[0]

    def _path(self, url: str) -> str:
        """The filesystem's own path of ``url`` (no scheme)."""
        return self.fs._strip_protocol(url)

    def _missing(self, url: str, what: str) -> XserError:
        """A missing object: ``DataError``, unless its bucket is what is missing (one more request)."""
        if self.scheme in _BUCKETS:
            bucket = self._bucket(url)
            try:
                there = self._call("stat", url, self.fs.exists, bucket)
            except StorageError:
                there = True
            if not there:
                return StorageError(f"cannot read: bucket {bucket!r} does not exist", Location(url))
        return DataError(f"{what} not found", Location(url))

    # -- names

    def join(self, base: str, *parts: str) -> str:
        out = base
        for p in parts:
            if not p:
                continue
            if out.endswith("://") or out.endswith("/"):
                out += p.lstrip("/")
            else:
                out += "/" + p.lstrip("/")
        return out

    def _split(self, path: str) -> tuple[str, str]:
        head, sep, rest = path.partition("://")
        return (head + sep, rest) if sep else ("", path)

    def parent(self, path: str) -> str:
        head, rest = self._split(path)
        rest = rest.rstrip("/")
        return head + (rest.rsplit("/", 1)[0] if "/" in rest else "")

    def basename(self, path: str) -> str:
        return self._split(path)[1].rstrip("/").rsplit("/", 1)[-1]

    def local_path(self, path: str) -> str | None:
        return self._path(path) if self._local else None

    # -- reading

    def _info(self, url: str, op: str = "stat") -> dict[str, Any]:
        return self._call(op, url, self.fs.info, self._path(url))

    def open_read(self, path: str, what: str, *, size: int | None = None, head: int = 0, missing: Any = None) -> RemoteFile:
        if size is not None:  # known (a manifest's): no HEAD, see RemoteFile
            return RemoteFile(self, path, size, what, known=True, head=head, missing=missing)
        try:
            info = self._info(path, "read")
        except FileNotFoundError:
            raise (missing() if missing is not None else self._missing(path, what)) from None
        if info.get("type") == "directory":
            raise DataError(f"{what} is not a file", Location(path))
        return RemoteFile(self, path, int(info.get("size") or 0), what, head=head, missing=missing)

    def read_bytes(self, path: str, what: str, *, limit: int | None = None) -> bytes:
        if limit is not None:
            return read_limited(self, path, what, limit)
        try:
            return self._call("read", path, self.fs.cat_file, self._path(path))
        except (FileNotFoundError, IsADirectoryError):
            raise self._missing(path, what) from None

    def read_range(self, path: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        try:
            return self._call("read", path, self.fs.cat_file, self._path(path), start=start, end=end)
        except FileNotFoundError:
            raise self._missing(path, "file") from None

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        ranges = list(ranges)
        todo = [i for i, (s, e) in enumerate(ranges) if e > s]
        out = [b""] * len(ranges)
        if not todo:
            return out
        p = self._path(path)
        try:
            got = self._call(
                "read",
                path,
                self.fs.cat_ranges,
                [p] * len(todo),
                [ranges[i][0] for i in todo],
                [ranges[i][1] for i in todo],
                on_error="raise",
            )
        except FileNotFoundError:
            raise self._missing(path, "file") from None
        for i, data in zip(todo, got):
            if isinstance(data, BaseException):  # a filesystem that returns errors in place
                raise self._missing(path, "file") if isinstance(data, FileNotFoundError) else data
            out[i] = data
        return out

    def size(self, path: str) -> int | None:
        try:
            info = self._info(path)
        except FileNotFoundError:
            return None
        return None if info.get("type") == "directory" else int(info.get("size") or 0)

    def exists(self, path: str) -> bool:
        try:
            self._info(path)
        except FileNotFoundError:
            return False
        return True

    def is_file(self, path: str) -> bool:
        """An object at ``path`` (every object is a file)."""
        return self.size(path) is not None

    def isdir(self, path: str) -> bool:
        try:
            return bool(self._call("list", path, self.fs.isdir, self._path(path)))
        except FileNotFoundError:
            return False

    def list(self, prefix: str) -> dict[str, int]:
        base = self._path(prefix).rstrip("/")
        try:
            found = self._call("list", prefix, self.fs.find, base, detail=True)
        except FileNotFoundError:
            return {}
        out: dict[str, int] = {}
        root = prefix.rstrip("/")
        for p in sorted(found):
            info = found[p]
            if info.get("type") == "directory":
                continue
            p = p.rstrip("/")
            if p == base:
                out[prefix] = int(info.get("size") or 0)
            elif p.startswith(base + "/"):
                out[root + "/" + p[len(base) + 1 :]] = int(info.get("size") or 0)
        return out

    def listdir(self, path: str) -> builtins.list[str]:
        base = self._path(path).rstrip("/")
        try:
            found = self._call("list", path, self.fs.ls, base, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = set()
        for p in found:
            p = (p if isinstance(p, str) else p["name"]).rstrip("/")
            if p.startswith(base + "/"):
                names.add(p[len(base) + 1 :].split("/", 1)[0])
        return sorted(n for n in names if n)

    # -- writing

    def put(self, path: str, data: bytes, *, create_only: bool = False, durable: bool = True) -> None:
        if self._local:
            self._call("write", path, self._put_local, path, data, create_only, durable)
            return
        p = self._path(path)
        try:
            if self._memory:
                self._call("write", path, self._put_memory, p, bytes(data), create_only)
            elif create_only and self._native_create:
                self._create(path, p, data)
            else:
                if create_only and self.exists(path):  # check then write: not atomic (conditional is False)
                    raise FileExistsError(path)
                self._call("write", path, self.fs.pipe_file, p, data)
        except FileExistsError:
            raise AlreadyExists("the object exists already (another writer was first)", Location(path)) from None
        except FileNotFoundError as e:
            raise StorageError(f"cannot write: {reason(e)}", Location(path)) from None

    def _create(self, url: str, p: str, data: bytes) -> None:
        """A conditional create. A retry after a lost reply finds the object: ours if its bytes are ours."""
        tries = []

        def create() -> None:
            tries.append(1)
            self.fs.pipe_file(p, data, mode="create")

        try:
            self._call("write", url, create)
        except FileExistsError:
            if len(tries) < 2 or self._call("read", url, self.fs.cat_file, p) != bytes(data):
                raise

    def _put_memory(self, p: str, data: bytes, create_only: bool) -> None:
        with _MEMORY_LOCK:
            if create_only and self.fs.exists(p):
                raise FileExistsError(p)
            self.fs.pipe_file(p, data)

    def _put_local(self, url: str, data: bytes, create_only: bool, durable: bool) -> None:
        try:
            LOCAL.put(self._path(url), data, create_only=create_only, durable=durable)
        except AlreadyExists:
            raise AlreadyExists("the object exists already (another writer was first)", Location(url)) from None
        except StorageError as e:
            raise StorageError(e.message, Location(url)) from None

    def put_file(self, local: str, path: str) -> None:
        p = self._path(path)
        kwargs: dict[str, Any] = {}
        if self._s3:
            kwargs = {"chunksize": PART_SIZE, "max_concurrency": PART_CONCURRENCY}
        try:
            self._call("write", path, self.fs.put_file, local, p, **kwargs)
        except FileNotFoundError as e:
            raise StorageError(f"cannot write: {reason(e)}", Location(path)) from None

    def open_write(self, path: str) -> BinaryIO:
        if self._memory:
            return MemoryWriter(self, path)  # type: ignore[return-value]
        p = self._path(path)
        kwargs = {"autocommit": False} if self._local else {}
        try:
            f = self._call("write", path, self.fs.open, p, "wb", **kwargs)
        except FileNotFoundError as e:
            raise StorageError(f"cannot write: {reason(e)}", Location(path)) from None
        return Writer(self, path, f, commit=self._local)  # type: ignore[return-value]

    def copy(self, src: str, dst: str) -> None:
        try:
            self._call("copy", dst, self.fs.copy, self._path(src), self._path(dst))
        except FileNotFoundError:
            raise StorageError("cannot copy: the source does not exist", Location(src)) from None

    def delete(self, paths: Iterable[str]) -> None:
        paths = list(paths)
        if self._s3:  # one DeleteObjects request per 1,000 keys; missing keys are no error
            for i in range(0, len(paths), 1000):
                batch = paths[i : i + 1000]
                try:
                    self._call("delete", batch[0], self.fs.rm, [self._path(u) for u in batch])
                except FileNotFoundError:
                    pass
            return
        for u in paths:
            try:
                self._call("delete", u, self._rm_one, self._path(u))
            except FileNotFoundError:
                pass

    def _rm_one(self, p: str) -> None:
        try:
            self.fs.rm_file(p)
        except IsADirectoryError:
            self.fs.rm(p, recursive=True)

    def delete_prefix(self, prefix: str) -> None:
        self.delete(self.list(prefix))
        if not self._s3:  # directories left behind (file://) or memory's pseudo-directories
            try:
                self._call("delete", prefix, self.fs.rm, self._path(prefix).rstrip("/"), recursive=True)
            except FileNotFoundError:
                pass


def _pipe_has_mode(fs: Any) -> bool:
    import inspect

    for name in ("_pipe_file", "pipe_file"):
        fn = getattr(type(fs), name, None)
        if fn is not None and type(fs).__module__.split(".")[0] != "fsspec":
            try:
                return "mode" in inspect.signature(fn).parameters and name in type(fs).__dict__
            except (TypeError, ValueError):
                return False
    return False
