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
import os
from json.encoder import encode_basestring
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np

from ...errors import DataError, Location, shape_str
from ..checksums import CHECKSUMS, DEFAULT_CHECKSUM, digest_stream
from ..checksums import verify as check_digest
from ..dtypes import DTYPES, dtype_problem, find, from_safetensors, storage_of
from ..fsutil import file_size, mappable
from ..jsonlimit import loads_limited
from .npy import _read_exactly, byte_view, map_fd

__all__ = ["SAFETENSORS", "SafetensorsFormat", "layout", "parse_header", "read_at", "render_header", "safetensors_tag"]

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


#: dtype -> (safetensors tag, little-endian storage dtype, item size, whether an array of it is written as it is)
_INFO: dict[np.dtype, tuple[str, np.dtype, int, bool]] = {}


def _info(dtype: Any, name: str, where: str) -> tuple[str, np.dtype, int, bool]:
    """What writing a tensor of ``dtype`` needs, worked out once per dtype (a dtype that cannot be written is
    refused, naming the tensor, every time)."""
    got = _INFO.get(dtype)
    if got is None:
        dtype = np.dtype(dtype)
        why = dtype_problem(dtype)
        if why is not None:
            raise DataError(f"{name}: {why}", Location(where))
        st = storage_of(dtype).newbyteorder("<")
        got = (safetensors_tag(dtype, where), st, dtype.itemsize, st == dtype and dtype.byteorder != ">")
        _INFO[dtype] = got
    return got


def layout(arrays: Mapping[str, Any], metadata: Mapping[str, str] | None, where: str) -> tuple[bytes, list[str], dict]:
    """The file ``write_bundle`` writes for ``{name: array or Lazy}``, worked out once: (header bytes with its
    length prefix, the order the tensors' bytes follow in, ``{name: (offset in the file, length)}``). The header is
    the JSON ``render_header`` writes (compact, ``ensure_ascii=False``), made in one pass."""
    info = [(name, _info(a.dtype, name, where), a.shape) for name, a in arrays.items()]
    if len({i[1][2] for i in info}) > 1:  # stable: same size keeps the caller's order
        info.sort(key=lambda i: -i[1][2])
    parts = []
    if metadata:
        parts.append('"__metadata__":' + json.dumps({str(k): str(v) for k, v in metadata.items()}, separators=(",", ":"),
                                                    ensure_ascii=False))
    offset = 0
    spans = []
    for name, (tag, _, size, _), shape in info:
        n = math.prod(shape) * size
        parts.append(f'{encode_basestring(name)}:{{"dtype":"{tag}","shape":[{",".join(str(int(x)) for x in shape)}],'
                     f'"data_offsets":[{offset},{offset + n}]}}')
        spans.append((name, offset, n))
        offset += n
    text = ("{" + ",".join(parts) + "}").encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    start = 8 + len(text)
    return len(text).to_bytes(8, "little") + text, [i[0] for i in info], {k: (start + o, n) for k, o, n in spans}


_IOV = 1024  # buffers per writev (Linux IOV_MAX)
_BATCH = 8 << 20  # bytes gathered before one writev


def _emit(arrays: Mapping[str, Any], order: list[str], where: str, out: Any) -> None:
    """Each tensor's bytes, in ``order``, little-endian, to ``out(list of buffers)``: small tensors gathered into one
    call, large ones in pieces of ``CHUNK`` (hashed while in the CPU cache). A ``Lazy`` is made when its turn comes."""
    batch: list = []
    held = 0
    for name in order:
        a = arrays[name]
        if not isinstance(a, np.ndarray):
            a = a.take()
        tag, st, size, as_is = _info(a.dtype, name, where)
        if not as_is or not a.flags.c_contiguous:
            a = np.ascontiguousarray(a).view(storage_of(a.dtype)).astype(st, copy=False)
        n = a.size * size
        if not n:
            continue
        if n >= CHUNK:
            if batch:
                out(batch)
                batch, held = [], 0
            data = byte_view(a)
            for s in range(0, n, CHUNK):
                out([data[s : s + CHUNK]])
            continue
        batch.append(a if a.ndim == 1 else a.reshape(-1))
        held += n
        if held >= _BATCH or len(batch) >= _IOV:
            out(batch)
            batch, held = [], 0
    if batch:
        out(batch)


def _writev(fd: int, bufs: list) -> None:
    """Every byte of ``bufs`` to ``fd``: one ``writev``, then the rest of a short write buffer by buffer."""
    done = os.writev(fd, bufs)
    total = sum(memoryview(b).nbytes for b in bufs) if done else -1
    if done == total:
        return
    for b in bufs:
        m = memoryview(b).cast("B")
        if done >= m.nbytes:
            done -= m.nbytes
            continue
        m = m[done:]
        done = 0
        while m.nbytes:
            m = m[os.write(fd, m):]


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
        return layout(arrays, metadata, "<bundle>")[2]

    def layout(self, arrays: Mapping[str, Any], metadata: Mapping[str, str] | None = None, where: str = "<bundle>") -> tuple:
        """(header, order, spans) of the file for these arrays (``layout``), to hand to ``write_bundle``."""
        return layout(arrays, metadata, where)

    def write_bundle(self, path: str, arrays: Mapping[str, Any], metadata: Mapping[str, str] | None = None,
                     known: tuple[int, str] | None = None, planned: tuple | None = None) -> tuple[int, str]:
        """Write ``{name: array or Lazy}`` as one file; a ``Lazy`` is made when its turn comes, then let go.
        ``planned``: this file's ``layout`` (worked out by the caller already)."""
        header, order, _ = planned if planned is not None else layout(arrays, metadata, path)
        h = CHECKSUMS[DEFAULT_CHECKSUM]() if known is None else None
        size = len(header)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            if h is not None:
                h.update(header)
            _writev(fd, [header])

            def out(bufs: list) -> None:
                nonlocal size
                if h is not None:
                    for b in bufs:
                        h.update(b)
                _writev(fd, bufs)
                size += sum(b.nbytes for b in bufs)

            _emit(arrays, order, path, out)
        finally:
            os.close(fd)
        return known if known is not None else (size, h.hexdigest())

    def digest_bundle(self, arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None,
                      planned: tuple | None = None) -> tuple[int, str]:
        """(size, checksum) of the file ``write_bundle`` would write, without writing it (host arrays only)."""
        header, order, _ = planned if planned is not None else layout(arrays, metadata, "<bundle>")
        h = CHECKSUMS[DEFAULT_CHECKSUM]()
        h.update(header)
        size = len(header)

        def out(bufs: list) -> None:
            nonlocal size
            for b in bufs:
                h.update(b)
                size += b.nbytes

        _emit(arrays, order, "<bundle>", out)
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
