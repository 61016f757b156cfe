"""The ``safetensors`` weight format: one file per subcollection, readable by ``safetensors.safe_open``.

Layout (the safetensors specification): 8 bytes little-endian header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``, padded
with spaces so the data starts 8-byte aligned), then the tensors' bytes back to back, C order,
little-endian. xser writes it itself (no library needed, no copy of the arrays): tensors are
ordered by decreasing element size, so each starts aligned for its dtype and maps without a
copy; the file is hashed while it is written. Reading parses the header (size-capped, every
offset checked against the file), then reads only the bytes of the tensor asked for, or of its
rows. The manifest records each parameter's ``key`` in the file.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np

from ...errors import DataError, Location, shape_str
from ..checksums import CHECKSUMS, DEFAULT_CHECKSUM, HashingWriter, digest_stream
from ..checksums import verify as check_digest
from ..dtypes import DTYPES, dtype_problem, find, from_safetensors, storage_of
from ..fsutil import file_size, mappable
from ..jsonlimit import loads_limited
from .npy import _read_exactly, byte_view, map_fd

__all__ = ["SAFETENSORS", "SafetensorsFormat", "parse_header", "read_at", "render_header", "safetensors_tag"]

MAX_HEADER = 100_000_000  # the safetensors library's MAX_HEADER_SIZE (bytes, decimal: not 100 MiB)
CHUNK = 8 << 20


def safetensors_tag(dtype: np.dtype, where: str | None = None) -> str:
    """The safetensors header's dtype of a numpy dtype; a ``DataError`` for dtypes safetensors has none for."""
    d = find(dtype)
    if d is None or d.safetensors is None:
        raise DataError(f"safetensors has no dtype for {dtype} (it stores: {', '.join(_STORABLE)})", Location(where) if where else None)
    return d.safetensors


_STORABLE = sorted(d.safetensors for d in DTYPES.values() if d.safetensors)


def render_header(tensors: Mapping[str, tuple[np.dtype, tuple]], metadata: Mapping[str, str] | None, where: str) -> tuple[bytes, list[str]]:
    """The header bytes (length prefix included) and the order the tensors' bytes follow in."""
    order = sorted(tensors, key=lambda k: -tensors[k][0].itemsize)  # stable: same size keeps the caller's order
    head: dict[str, Any] = {}
    if metadata:
        head["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name in order:
        dtype, shape = tensors[name]
        n = math.prod(shape) * dtype.itemsize
        head[name] = {"dtype": safetensors_tag(dtype, where), "shape": [int(s) for s in shape], "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    return len(text).to_bytes(8, "little") + text, order


def parse_header(f: BinaryIO, where: str, size: int | None = None, aliases: dict | None = None) -> tuple[dict, int]:
    """``({name: (dtype, shape, begin, end)}, data start)`` of an open file, every field checked; metadata under
    ``"__metadata__"`` as a dict of strings."""
    size = file_size(f) if size is None else size
    f.seek(0)
    raw = f.read(8)
    if len(raw) != 8:
        raise DataError("not a safetensors file: shorter than its 8-byte header length", Location(where))
    n = int.from_bytes(raw, "little")
    if n > MAX_HEADER or 8 + n > size:
        raise DataError(f"not a safetensors file: header length {n} (file has {size} bytes, limit {MAX_HEADER})", Location(where))
    head = loads_limited(f.read(n), where, "safetensors header")
    if not isinstance(head, dict):
        raise DataError("safetensors header is not a JSON object", Location(where))
    start, data = 8 + n, size - 8 - n
    out: dict[str, Any] = {}
    spans = []
    for name, t in head.items():
        if name == "__metadata__":
            if not isinstance(t, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in t.items()):
                raise DataError("safetensors __metadata__ must map strings to strings", Location(where))
            out[name] = t
            continue
        try:
            d = from_safetensors((aliases or {}).get(t["dtype"], t["dtype"]))
            shape = tuple(t["shape"])
            begin, end = t["data_offsets"]
            if d is None:
                raise ValueError(f"dtype {t['dtype']!r} is not one xser reads")
            if not all(type(s) is int and s >= 0 for s in shape) or type(begin) is not int or type(end) is not int:
                raise ValueError("shape and data_offsets must be non-negative ints")
            if not 0 <= begin <= end <= data or end - begin != math.prod(shape) * d.storage.itemsize:
                raise ValueError(f"data_offsets {[begin, end]} do not hold shape {shape_str(shape)} {d.tag} in {data} data bytes")
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"safetensors tensor {name!r}: {e}", Location(where)) from None
        dtype = d.storage if not d.extension else _extension(d.tag)
        out[name] = (dtype, shape, begin, end)
        spans.append((begin, end, name))
    spans.sort()
    for (_, e1, a), (b2, _, b) in zip(spans, spans[1:]):
        if b2 < e1:
            raise DataError(f"safetensors tensors {a!r} and {b!r} overlap", Location(where))
    # as the safetensors library: the tensors' bytes follow each other from the start of the data to its end
    at = 0
    for b1, e1, a in spans:
        if b1 != at:
            raise DataError(f"safetensors tensor {a!r} starts at data byte {b1}, not {at} where the tensor before it ends "
                            "(the tensors' bytes must follow each other without gaps)", Location(where))
        at = e1
    if at != data:
        raise DataError(f"safetensors tensors end at data byte {at} but the file holds {data} data bytes", Location(where))
    return out, start


def read_at(path: str, offset: int, dtype: np.dtype, shape: tuple, rows: tuple[int, int] | None = None, name: str = "",
            store: Any = None) -> np.ndarray:
    """A tensor whose bytes start at ``offset`` of the file ``path`` (or only rows ``first:stop`` of it), in memory;
    ``store`` holds the file (``store_for(path)`` when None): on a remote one only those bytes are fetched."""
    from ..stores import store_for

    if rows is not None:
        offset += rows[0] * math.prod(shape[1:]) * dtype.itemsize
        shape = (rows[1] - rows[0],) + tuple(shape[1:])
    out = np.empty(shape, dtype)
    with contextlib.closing((store or store_for(path)).open_read(path, "the data file")) as f:
        f.seek(offset)
        _read_exactly(f, byte_view(out) if out.size else np.empty(0, np.uint8), path)
    return out


def _extension(tag: str) -> np.dtype:
    from ..dtypes import ml_dtype

    try:
        return ml_dtype(tag)
    except ImportError as e:
        raise DataError(str(e)) from None


class SafetensorsFormat:
    name = "safetensors"
    suffix = ".safetensors"
    bundle = True  # one file holds every parameter of a subcollection stored in this format

    def spans(self, arrays: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> dict[str, tuple[int, int]]:
        """``{name: (offset in the file, length)}`` of the file ``write_bundle`` writes for these arrays."""
        header, order = render_header({k: (np.dtype(a.dtype), tuple(a.shape)) for k, a in arrays.items()}, metadata, "<bundle>")
        out, at = {}, len(header)
        for name in order:
            n = math.prod(arrays[name].shape) * np.dtype(arrays[name].dtype).itemsize
            out[name] = (at, n)
            at += n
        return out

    def write_bundle(self, path: str, arrays: Mapping[str, Any], metadata: Mapping[str, str] | None = None,
                     known: tuple[int, str] | None = None) -> tuple[int, str]:
        """Write ``{name: array or Lazy}`` as one file; a ``Lazy`` is made when its turn comes, then let go."""
        for name, a in arrays.items():
            why = dtype_problem(np.dtype(a.dtype))
            if why is not None:
                raise DataError(f"{name}: {why}", Location(path))
        header, order = render_header({k: (np.dtype(a.dtype), tuple(a.shape)) for k, a in arrays.items()}, metadata, path)
        with HashingWriter(path, hash=known is None) as w:
            w.write(header)
            for name in order:
                a = arrays[name]
                a = a if isinstance(a, np.ndarray) else a.take()
                a = np.ascontiguousarray(a).view(storage_of(a.dtype)).astype(storage_of(a.dtype).newbyteorder("<"), copy=False)
                data = byte_view(a) if a.size else np.empty(0, np.uint8)
                for s in range(0, data.size, CHUNK):
                    w.write(data[s : s + CHUNK])
        return known if known is not None else (w.size, w.hexdigest())

    def digest_bundle(self, arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> tuple[int, str]:
        """(size, checksum) of the file ``write_bundle`` would write, without writing it (host arrays only)."""
        header, order = render_header({k: (a.dtype, a.shape) for k, a in arrays.items()}, metadata, "<bundle>")
        h = CHECKSUMS[DEFAULT_CHECKSUM]()
        h.update(header)
        size = len(header)
        for name in order:
            a = np.ascontiguousarray(arrays[name])
            a = a.view(storage_of(a.dtype)).astype(storage_of(a.dtype).newbyteorder("<"), copy=False)
            data = byte_view(a) if a.size else np.empty(0, np.uint8)
            for s in range(0, data.size, CHUNK):
                h.update(data[s : s + CHUNK])
            size += data.size
        return size, h.hexdigest()

    def write(self, path: str, array: np.ndarray, known: Any = None, **options: Any) -> tuple[int, str]:
        """One array alone, under the key ``options["key"]`` (default ``"tensor"``)."""
        key = options.pop("key", "tensor")
        if options:
            raise DataError(f"the safetensors format takes no options, got {sorted(options)}", Location(path))
        return self.write_bundle(path, {key: array}, None, known)

    def _find(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, key: str,
              span: tuple[int, int] | None = None) -> tuple[int, int]:
        actual = file_size(f)
        if actual != size:
            raise DataError(f"file has {actual} bytes, manifest says {size} (truncated or replaced?)", Location(where))
        if span is not None:  # a packed container: the manifest says where (no header parse per tensor)
            nbytes = math.prod(shape) * dtype.itemsize
            if span[1] != nbytes or span[0] + span[1] > actual:
                raise DataError(f"tensor {key!r}: the manifest's {span[1]} bytes at {span[0]} do not hold "
                                f"{shape_str(shape)} {dtype} in a file of {actual}", Location(where))
            return span
        head, start = parse_header(f, where, actual)
        t = head.get(key) if key != "__metadata__" else None
        if t is None:
            raise DataError(f"safetensors file has no tensor {key!r}", Location(where))
        fdtype, fshape, begin, _ = t
        if fdtype != dtype.newbyteorder("=") and fdtype != dtype:
            raise DataError(f"tensor {key!r} is {fdtype} in the file, manifest says {dtype}", Location(where))
        if fshape != tuple(shape):
            raise DataError(f"tensor {key!r} is {shape_str(fshape)} in the file, manifest says {shape_str(shape)}", Location(where))
        return start + begin, math.prod(shape) * dtype.itemsize

    def read(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, *, mmap: bool, verify: Any,
             key: str = "tensor", span: tuple[int, int] | None = None) -> np.ndarray:
        offset, nbytes = self._find(f, where, dtype, shape, size, key, span)
        if verify is not None:
            f.seek(0)
            check_digest(verify, digest_stream(f, verify[0])[1], where)
        native = dtype.newbyteorder("<") if dtype.byteorder in "<>" else dtype
        if mmap and nbytes and offset % max(1, dtype.itemsize) == 0 and mappable(f):
            return map_fd(f.fileno(), native, offset, tuple(shape), "C")
        out = np.empty(tuple(shape), native)
        f.seek(offset)
        _read_exactly(f, byte_view(out) if nbytes else np.empty(0, np.uint8), where)
        return out

    def read_rows(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, rows: tuple[int, int], *,
                  verify: Any, key: str = "tensor", span: tuple[int, int] | None = None) -> np.ndarray:
        """Rows ``first:stop``: only their bytes (offsets from the manifest or the header)."""
        offset, _ = self._find(f, where, dtype, shape, size, key, span)
        if verify is not None:
            f.seek(0)
            check_digest(verify, digest_stream(f, verify[0])[1], where)
        first, stop = rows
        row = math.prod(shape[1:]) * dtype.itemsize
        native = dtype.newbyteorder("<") if dtype.byteorder in "<>" else dtype
        out = np.empty((stop - first,) + tuple(shape[1:]), native)
        f.seek(offset + first * row)
        _read_exactly(f, byte_view(out) if out.size else np.empty(0, np.uint8), where)
        return out

    def chunks(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, elements: int, buffer: Any = None,
               verify: Any = None, key: str = "tensor", span: tuple[int, int] | None = None) -> Iterator[np.ndarray]:
        offset, nbytes = self._find(f, where, dtype, shape, size, key, span)
        if verify is not None:
            f.seek(0)
            check_digest(verify, digest_stream(f, verify[0])[1], where)
        total = math.prod(shape)
        n = max(1, min(elements, total))
        raw = buffer if buffer is not None and buffer.nbytes >= n * dtype.itemsize else np.empty(n * dtype.itemsize, np.uint8)
        f.seek(offset)
        for s in range(0, total, n):
            m = min(n, total - s)
            buf = raw[: m * dtype.itemsize]
            _read_exactly(f, buf, where)
            yield buf.view(dtype)


SAFETENSORS = SafetensorsFormat()
