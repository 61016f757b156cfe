"""The default weight format: ``.npy`` (numpy's own, 64-byte aligned headers, mmap-able).

Files are readable with ``numpy.load(path, allow_pickle=False)`` alone. Writes hash the whole
file while writing, chunk by chunk, so the data is hashed while it is still in the CPU cache.
Reads take an open file (the data directory opened it relative to its descriptor) and check
the header against the manifest and the file size *before* allocating anything.
"""

from __future__ import annotations

import ast
import math
import mmap
import re
import struct
from collections.abc import Iterator
from typing import Any, BinaryIO, Protocol

import numpy as np
import numpy.lib.format as npf


from ...errors import DataError, Location, shape_str
from ..checksums import CHECKSUMS, DEFAULT_CHECKSUM, HashingWriter, digest_stream
from ..checksums import verify as check_digest
from ..dtypes import dtype_problem, entry_of, storage_of, tag_of
from ..fsutil import file_size, mappable

__all__ = ["NPY", "Format", "NpyFormat", "byte_view", "describe_dtype", "parse_dtype"]

CHUNK = 8 << 20
MAX_HEADER = 1 << 20  # numpy's default is 10,000 bytes; record dtypes we wrote can be larger


class Format(Protocol):
    """A weight format: writes one array to a new file, reads it back from an open file.

    ``where`` is the file's path for messages; readers never open anything by name.
    """

    name: str
    suffix: str

    def write(self, path: str, array: np.ndarray, known: tuple[int, str] | None = None, **options) -> tuple[int, str]:
        """Write ``array`` to a new file ``path``; return (file size, xxh3_64 hex digest of the file)."""
        ...

    def read(
        self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, *, mmap: bool, verify: tuple[str, str] | None
    ) -> np.ndarray:
        """Read the array back, checking it against the manifest's dtype, shape and size."""
        ...

    def read_rows(
        self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, rows: tuple[int, int], *, verify: tuple[str, str] | None
    ) -> np.ndarray:
        """Rows ``first:stop`` of the array (only their bytes where the layout allows)."""
        ...

    def chunks(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, elements: int) -> Iterator[np.ndarray]:
        """The array's elements in C order, as flat arrays of at most ``elements`` each, streamed."""
        ...


def describe_dtype(dtype: np.dtype):
    """The manifest's dtype: numpy's ``.npy`` descr (``'<f4'``, or a list for records), or the tag of an
    extension dtype (``"bfloat16"``, stored as its bits)."""
    dtype = np.dtype(dtype)
    return tag_of(dtype) or npf.dtype_to_descr(dtype)


def _from_json(descr):
    """JSON turns the tuples of a record descr into lists; turn them back."""
    if not isinstance(descr, list):
        return descr
    fields = []
    for item in descr:
        if not isinstance(item, (list, tuple)) or len(item) not in (2, 3):
            raise ValueError(f"bad record field {item!r}")
        name = tuple(item[0]) if isinstance(item[0], list) else item[0]
        field = (name, _from_json(item[1]))
        if len(item) == 3:
            field += (tuple(item[2]),)
        fields.append(field)
    return fields


def parse_dtype(descr) -> np.dtype:
    """Inverse of ``describe_dtype``; raises ``ValueError``/``TypeError`` on junk (and an ``ImportError``
    naming the package for an extension dtype when ml_dtypes is missing)."""
    ext = entry_of(descr)
    if ext is not None:
        return ext
    try:
        dt = npf.descr_to_dtype(_from_json(descr))
    except (ValueError, TypeError):
        raise
    except Exception as e:  # numpy parses comma strings as Python (",i4": SyntaxError) and recurses into records
        raise ValueError(f"not a dtype: {str(descr)[:80]!r} ({type(e).__name__})") from None
    why = dtype_problem(dt)
    if why is not None:
        raise ValueError(why)
    return dt


def byte_view(array: np.ndarray) -> np.ndarray:
    """The array's bytes in memory order, as a flat uint8 view (no copy)."""
    flat = array.reshape(-1, order="A")
    return flat.view(np.uint8)


def _read_header_3_0(f: Any) -> tuple[tuple, bool, np.dtype]:
    """A version 3.0 header (utf-8 text, else as 2.0), parsed as a literal and checked like numpy's public readers."""
    (n,) = struct.unpack("<I", f.read(4))
    if n > MAX_HEADER:
        raise ValueError(f"header of {n} bytes is longer than {MAX_HEADER}")
    text = f.read(n)
    if len(text) != n:
        raise ValueError("header is truncated")
    d = ast.literal_eval(text.decode("utf-8"))
    if not isinstance(d, dict) or set(d) != {"descr", "fortran_order", "shape"}:
        raise ValueError(f"header does not describe an array: {text[:80]!r}")
    shape, fortran = d["shape"], d["fortran_order"]
    if not isinstance(shape, tuple) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape):
        raise ValueError(f"bad shape {shape!r}")
    if not isinstance(fortran, bool):
        raise ValueError(f"bad fortran_order {fortran!r}")
    return shape, fortran, npf.descr_to_dtype(d["descr"])


def _header(array: np.ndarray) -> bytes:
    """numpy's own header: version 1.0, or 2.0/3.0 when a record dtype needs them."""
    return header_for(array.dtype, array.shape, bool(array.flags.f_contiguous and not array.flags.c_contiguous))


def header_for(dtype: np.dtype, shape: tuple, fortran: bool) -> bytes:
    """The ``.npy`` header numpy writes for an array of this dtype, shape and memory order."""
    d = {"descr": npf.dtype_to_descr(storage_of(np.dtype(dtype))), "fortran_order": bool(fortran), "shape": tuple(shape)}
    return wrap_header(d)


#: spaces numpy leaves after the header's dict so that the growing axis can get longer in place
GROWTH_AXIS_DIGITS = 21


def wrap_header(d: dict) -> bytes:
    """The ``.npy`` header of the dict ``d`` as numpy writes it (its published format, written here rather than
    through numpy's private helpers): the dict literal with sorted keys, spare room for the growing axis,
    spaces up to a multiple of 64 bytes and a newline; version 1.0 when the text is latin-1 and short, 2.0 when
    long, 3.0 when a field name needs utf-8."""
    text = "{" + "".join(f"'{k}': {v!r}, " for k, v in sorted(d.items())) + "}"
    shape = d["shape"]
    if shape:
        text += " " * (GROWTH_AXIS_DIGITS - len(repr(shape[-1 if d["fortran_order"] else 0])))
    try:
        raw = text.encode("latin-1")
        versions = [((1, 0), "<H"), ((2, 0), "<I")]
    except UnicodeEncodeError:
        raw = text.encode("utf-8")
        versions = [((3, 0), "<I")]
    for (major, minor), fmt in versions:
        size = struct.calcsize(fmt)
        pad = 64 - (8 + size + len(raw) + 1) % 64
        total = len(raw) + pad + 1
        if total < 1 << (8 * size):
            return b"\x93NUMPY" + bytes([major, minor]) + struct.pack(fmt, total) + raw + b" " * pad + b"\n"
    raise DataError(f"an .npy header of {len(raw)} bytes is too long")


_FAST_HEADER = re.compile(
    rb"\{'descr': '([<>|][a-zA-Z][0-9]{1,2})', 'fortran_order': (True|False), 'shape': \(((?:[0-9]+, )*[0-9]*,?)\), \} *\n"
)


_DTYPES: dict[bytes, np.dtype] = {}


def header_from_bytes(head: bytes) -> tuple[tuple, bool, np.dtype, int] | None:
    """The common header (a plain dtype, version 1.0, as numpy writes it) parsed by one regex; None otherwise.

    ``head`` is the file's first bytes (enough to hold the header). numpy's own parser evaluates
    the header as a Python literal, which costs tens of microseconds per file: most of a lazy
    open of many small arrays.
    """
    if len(head) < 10 or head[:8] != b"\x93NUMPY\x01\x00":
        return None
    n = int.from_bytes(head[8:10], "little")
    m = _FAST_HEADER.fullmatch(head, 10, 10 + n) if len(head) >= 10 + n else None
    if m is None:
        return None
    dtype = _DTYPES.get(m.group(1))
    if dtype is None:
        try:
            dtype = _DTYPES.setdefault(m.group(1), np.dtype(m.group(1).decode()))
        except TypeError:
            return None
    if dtype.hasobject or dtype.kind in "OV":
        return None
    dims = m.group(3).replace(b" ", b"").strip(b",")
    shape = tuple(int(x) for x in dims.split(b",")) if dims else ()
    return shape, m.group(2) == b"True", dtype, 10 + n


def _fast_header(f) -> tuple[tuple, bool, np.dtype, int] | None:
    head = f.read(10)
    if len(head) == 10 and head[:8] == b"\x93NUMPY\x01\x00":
        head += f.read(int.from_bytes(head[8:10], "little"))
        fast = header_from_bytes(head)
        if fast is not None:
            return fast
    f.seek(0)
    return None


def read_header(f, path: str) -> tuple[tuple, bool, np.dtype, int]:
    """(shape, fortran_order, dtype, data offset) of an open ``.npy`` file."""
    fast = _fast_header(f)
    if fast is not None:
        return fast
    try:
        version = npf.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npf.read_array_header_1_0(f, max_header_size=MAX_HEADER)
        elif version == (2, 0):
            shape, fortran, dtype = npf.read_array_header_2_0(f, max_header_size=MAX_HEADER)
        elif version == (3, 0):
            shape, fortran, dtype = _read_header_3_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version[0]}.{version[1]}")
    except Exception as e:  # numpy evaluates the header as a literal: any failure there means "not an .npy"
        raise DataError(f"not a valid .npy file: {type(e).__name__}: {e}", _where(path)) from None
    if dtype.hasobject:
        raise DataError("object arrays need pickle and are never loaded", _where(path))
    return shape, fortran, dtype, f.tell()


def _where(path: str) -> Location:
    return Location(path)


def _read_exactly(f, view: np.ndarray, path: str) -> None:
    pos = 0
    while pos < view.size:
        n = f.readinto(view[pos:])
        if not n:
            raise DataError(f"file ended after {pos} of {view.size} data bytes", _where(path))
        pos += n


def _map(f, dtype: np.dtype, offset: int, shape: tuple, order: str) -> np.memmap:
    """A copy-on-write ``np.memmap`` of the file's data (what ``np.memmap(mode="c")`` gives, at half its cost)."""
    return map_fd(f.fileno(), dtype, offset, shape, order)


def map_fd(fd: int, dtype: np.dtype, offset: int, shape: tuple, order: str = "C") -> np.memmap:
    """``_map`` for a raw descriptor (the caller checked size and header)."""
    mm = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
    arr = np.ndarray.__new__(np.memmap, tuple(shape), dtype, buffer=mm, offset=offset, order=order)
    arr._mmap, arr.offset, arr.mode, arr.filename = mm, offset, "c", None
    return arr


class NpyFormat:
    name = "npy"
    suffix = ".npy"

    def _prepare(self, path: str, array: np.ndarray) -> tuple[bytes, np.ndarray]:
        why = dtype_problem(array.dtype)
        if why is not None:
            raise DataError(why, _where(path))
        if not (array.flags.c_contiguous or array.flags.f_contiguous):
            array = np.ascontiguousarray(array)
        return _header(array), (byte_view(array) if array.size else np.empty(0, np.uint8))

    def digest(self, array: np.ndarray) -> tuple[int, str]:
        """(file size, checksum) of the file ``write`` would produce, without writing it."""
        header, data = self._prepare("<array>", array)
        h = CHECKSUMS[DEFAULT_CHECKSUM]()
        h.update(header)
        for start in range(0, data.size, CHUNK):
            h.update(data[start : start + CHUNK])
        return len(header) + data.size, h.hexdigest()

    def write_stream(self, path: str, header: bytes, chunks) -> tuple[int, str]:
        """Write ``header`` then each chunk (bytes-like) of a new file, hashing as it goes."""
        with HashingWriter(path) as w:
            w.write(header)
            for chunk in chunks:
                w.write(chunk)
        return w.size, w.hexdigest()

    def write(self, path: str, array: np.ndarray, known: tuple[int, str] | None = None, **options) -> tuple[int, str]:
        """Write the file; hash while writing unless the digest is ``known`` already."""
        if options:
            raise DataError(f"the npy format takes no options, got {sorted(options)}", _where(path))
        header, data = self._prepare(path, array)
        with HashingWriter(path, hash=known is None) as w:
            w.write(header)
            for start in range(0, data.size, CHUNK):
                w.write(data[start : start + CHUNK])
        return known if known is not None else (w.size, w.hexdigest())

    def read_rows(
        self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, rows: tuple[int, int], *, verify: tuple[str, str] | None
    ) -> np.ndarray:
        """Rows ``first:stop`` of the array; only their bytes are read (C order, no verify)."""
        first, stop = rows
        offset, fortran = self._check(f, where, dtype, shape, size)
        if not fortran and verify is None:
            row_bytes = math.prod(shape[1:]) * dtype.itemsize
            out = np.empty((stop - first,) + tuple(shape[1:]), dtype)
            view = byte_view(out) if out.size else np.empty(0, np.uint8)
            f.seek(offset + first * row_bytes)
            _read_exactly(f, view, where)
            return out
        f.seek(0)
        return self.read(f, where, dtype, shape, size, mmap=False, verify=verify)[first:stop]

    def chunks(
        self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, elements: int, buffer: np.ndarray | None = None,
        verify: tuple[str, str] | None = None,
    ) -> Iterator[np.ndarray]:
        """Consecutive elements in C order, read into one reused buffer (C-order files: plain reads).

        ``buffer`` (uint8, at least ``elements * itemsize`` bytes) may be shared by callers that use
        each piece before asking for the next one from any reader (averaging does): it stays in cache.
        ``verify`` hashes the file as it is read and raises before the last piece if it does not match.
        """
        offset, fortran = self._check(f, where, dtype, shape, size)
        total = math.prod(shape)
        n = max(1, min(elements, total))
        if fortran and len(shape) > 1:  # rare: read C-order row bands out of a read-only map
            copy = None
            if not mappable(f):  # an object on a store: map a local copy (streamed; gone when the map is)
                f = copy = _local_copy(f)
            try:
                if verify is not None:
                    f.seek(0)
                    check_digest(verify, digest_stream(f, verify[0])[1], where)
                mapped = np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=tuple(shape), order="F")
            finally:
                if copy is not None:
                    copy.close()  # the map holds its own descriptor
            step = max(1, n // max(1, math.prod(shape[1:])))
            for first in range(0, shape[0], step):
                band = np.ascontiguousarray(mapped[first : first + step]).reshape(-1)
                for start in range(0, band.size, n):
                    yield band[start : start + n]
            return
        h = None
        if verify is not None:
            h = CHECKSUMS[verify[0]]()
            f.seek(0)
            h.update(f.read(offset))
        raw = buffer if buffer is not None and buffer.nbytes >= n * dtype.itemsize else np.empty(n * dtype.itemsize, np.uint8)
        f.seek(offset)
        if total == 0 and h is not None:
            check_digest(verify, h.hexdigest(), where)
        for start in range(0, total, n):
            m = min(n, total - start)
            buf = raw[: m * dtype.itemsize]
            _read_exactly(f, buf, where)
            if h is not None:
                h.update(buf)
                if start + m == total:
                    check_digest(verify, h.hexdigest(), where)
            yield buf.view(dtype)

    def _check(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int) -> tuple[int, bool]:
        """Check size and header against the manifest; return (data offset, fortran order)."""
        actual = file_size(f)
        if actual != size:
            raise DataError(f"file has {actual} bytes, manifest says {size} (truncated or replaced?)", _where(where))
        f.seek(0)
        fshape, fortran, fdtype, offset = read_header(f, where)
        if fdtype != storage_of(dtype):
            stored = f"{dtype} (stored as {storage_of(dtype)})" if storage_of(dtype) != dtype else f"{dtype}"
            raise DataError(f"header says dtype {fdtype}, manifest says {stored}", _where(where))
        if tuple(fshape) != tuple(shape):
            raise DataError(f"header says shape {shape_str(fshape)}, manifest says {shape_str(shape)}", _where(where))
        nbytes = math.prod(shape) * dtype.itemsize
        if offset + nbytes != actual:
            raise DataError(
                f"header promises {nbytes} bytes of data for shape {shape_str(shape)} {dtype}, "
                f"the file holds {actual - offset}",
                _where(where),
            )
        return offset, fortran

    def read(
        self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, *, mmap: bool, verify: tuple[str, str] | None
    ) -> np.ndarray:
        offset, fortran = self._check(f, where, dtype, shape, size)
        nbytes = math.prod(shape) * dtype.itemsize
        order = "F" if fortran else "C"
        if mmap and nbytes and mappable(f):
            mapped = _map(f, dtype, offset, shape, order)
            if verify is not None:  # hashed through the map: the page cache's pages, no private copy
                f.seek(0)
                h = CHECKSUMS[verify[0]]()
                h.update(f.read(offset))
                h.update(byte_view(mapped))
                check_digest(verify, h.hexdigest(), where)
            return mapped
        out = np.empty(tuple(shape), dtype=dtype, order=order)
        view = byte_view(out) if nbytes else np.empty(0, np.uint8)
        _read_exactly(f, view, where)
        if verify is not None:
            algo, _ = verify
            f.seek(0)
            h = CHECKSUMS[algo]()
            h.update(f.read(offset))
            h.update(view)
            check_digest(verify, h.hexdigest(), where)
        return out


NPY = NpyFormat()


def _local_copy(f: BinaryIO) -> BinaryIO:
    """A remote file copied into an unlinked local temporary file (8 MiB reads), open for reading: nothing is left
    behind, and memory stays bounded whatever the file's size."""
    import shutil
    import tempfile

    copy = tempfile.TemporaryFile(prefix="xser-copy-")
    f.seek(0)
    shutil.copyfileobj(f, copy, 8 << 20)
    copy.flush()
    copy.seek(0)
    return copy  # type: ignore[return-value]
