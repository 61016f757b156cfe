"""The other systems' layouts as weight formats: DyNet text and Angel's eight formats.

Any parameter can be stored in them (``save(..., formats={"*/W": "colid-value-text"})``); the
manifest records the format and loading needs no further information. Angel formats store 2-D
float32/float64 matrices as one partition; ``dynet-text`` stores one DyNet record per file
(column-major, 9 significant digits: float32 is exact).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from ...errors import DataError, Location, shape_str
from ..checksums import CHECKSUMS, HashingWriter, digest_bytes
from ..checksums import verify as check_digest
from ..fsutil import file_size
from .angel_codec import ANGEL_FORMATS, decode_partition, encode_partition
from .dynet_codec import dynet_text_pieces, parse_dynet_text
from .whole import load_checked
from .whole import DecodedWhole

__all__ = ["EXTERNAL"]


class _BytesFormat(DecodedWhole):
    """A format whose files are produced and parsed whole (they are small or text)."""

    suffix = ".txt"

    def __init__(self, name: str, suffix: str) -> None:
        self.name, self.suffix = name, suffix

    # subclasses define encode(path, array, **options) -> bytes and decode(path, data, dtype, shape)

    def write(self, path: str, array: np.ndarray, known: Any = None, **options: Any) -> tuple[int, str]:
        data = self.encode(path, array, **options)
        with open(path, "xb") as f:
            f.write(data)
        return len(data), digest_bytes(data)

    def read(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, *, mmap: bool, verify: Any) -> np.ndarray:
        data = load_checked(f, where, size, verify)
        out = self.decode(where, data, dtype, tuple(shape))
        if out.shape != tuple(shape):
            raise DataError(f"file holds {shape_str(out.shape)}, manifest says {shape_str(shape)}", Location(where))
        return out.astype(dtype, copy=False)


class DynetText(_BytesFormat):
    limits = "finite floating-point values that float32 holds exactly (DyNet reads every value as float32)"

    def exact_for(self, array: np.ndarray, options: dict) -> bool:
        """Finite float32 is written as %+.8e, which reads back exactly: no read-back check needed."""
        return not options and array.dtype == np.float32 and array.ndim > 0 and bool(np.isfinite(array).all())

    def write(self, path: str, array: np.ndarray, known: Any = None, **options: Any) -> tuple[int, str]:
        """Written and hashed piece by piece, as they are formatted (no whole copy of the text in memory)."""
        pieces = self._pieces(path, array, **options)
        first = next(pieces)  # the checks, before the file is made
        with HashingWriter(path) as w:
            w.write(first)
            for piece in pieces:
                w.write(piece)
        return w.size, w.hexdigest()

    def encode(self, path: str, array: np.ndarray, **options: Any) -> bytes:
        return b"".join(self._pieces(path, array, **options))

    def _pieces(self, path: str, array: np.ndarray, **options: Any) -> Iterator[bytes]:
        if options or array.dtype.kind != "f" or array.ndim == 0:
            raise DataError(f"dynet-text stores float arrays with at least one dimension (no options), got {array.dtype} {shape_str(array.shape)}", Location(path))
        sub = os.path.basename(os.path.dirname(path))
        name = os.path.basename(path)[: -len(self.suffix)]
        return dynet_text_pieces([{"kind": "Parameter", "key": f"/{sub}/{name}", "dims": list(array.shape), "array": array}])

    def decode(self, path: str, data: bytes, dtype: np.dtype, shape: tuple) -> np.ndarray:
        records = parse_dynet_text(data, path)
        if len(records) != 1:
            raise DataError(f"{len(records)} DyNet records in the file, 1 expected", Location(path))
        return records[0]["array"]


class AngelFormat(_BytesFormat):
    @property
    def exact(self) -> bool:
        """Binary layouts hold float32/float64 bits as they are: no read-back check needed after writing."""
        return "binary" in self.name

    @property
    def limits(self) -> str:
        if self.name == "rowid-colid-value-text":
            return "2-D float32 matrices exactly, and float64 only with finite values of at most 6 decimals (Angel's #.######)"
        return "2-D float32 or float64 matrices"

    def exact_for(self, array: np.ndarray, options: dict) -> bool:
        """Java's Float/Double.toString give back every finite value (its contract, and what the emulation
        is tested against); #.###### (double values of the row-id text format) and NaN payloads need the check."""
        if self.name == "rowid-colid-value-text" and array.dtype != np.float32:
            return False
        return array.dtype.kind == "f" and bool(np.isfinite(array).all())

    def encode(self, path: str, array: np.ndarray, sep: str = ",", **options: Any) -> bytes:
        self._check(path, array, options)
        r, c = array.shape
        return encode_partition(array, 0, r, 0, c, self.name, array.dtype.itemsize == 4, sep)

    def _check(self, path: str, array: np.ndarray, options: dict) -> None:
        if set(options) - {"sep"}:
            raise DataError(f"{self.name} takes only sep, got {sorted(options)}", Location(path))
        if array.ndim != 2 or array.dtype.kind != "f" or array.dtype.itemsize not in (4, 8):
            raise DataError(f"{self.name} stores 2-D float32 or float64 matrices, got {array.dtype} {shape_str(array.shape)}", Location(path))

    def _records(self, shape: tuple, itemsize: int) -> np.dtype:
        """The record of a binary layout for a whole dense matrix (int column ids, big-endian)."""
        vt = np.dtype(">f4" if itemsize == 4 else ">f8")
        if self.name == "binary-column":
            return np.dtype([("c", ">i4"), ("v", vt, (shape[0],))])
        return np.dtype({"value-binary": [], "colid-value-binary": [("c", ">i4")],
                         "rowid-colid-value-binary": [("r", ">i4"), ("c", ">i4")]}[self.name] + [("v", vt)])

    def write(self, path: str, array: np.ndarray, known: Any = None, **options: Any) -> tuple[int, str]:
        """Binary layouts are written and hashed in bands of records as they are made (what ``encode`` gives, without
        the whole file in memory); text layouts through ``encode``."""
        if "binary" not in self.name or array.ndim != 2 or 0 in array.shape:
            return super().write(path, array, known, **options)
        self._check(path, array, options)
        with HashingWriter(path) as w:
            for band in self._binary_bands(array):
                w.write(band)
        return w.size, w.hexdigest()

    def _binary_bands(self, a: np.ndarray) -> Iterator[np.ndarray]:
        rows, cols = a.shape
        rec = self._records(a.shape, a.dtype.itemsize)
        if self.name == "binary-column":  # a record per column: the column id, then the column's values
            step = max(1, _BAND // max(1, rows))
            for j in range(0, cols, step):
                band = np.empty(min(step, cols - j), rec)
                band["c"] = np.arange(j, j + band.size)
                _transpose_into(band["v"], a[:, j : j + band.size])
                yield band.view(np.uint8)
            return
        step = max(1, _BAND // cols)
        # one buffer for every band (the writer has copied a band out before it asks for the next), its column ids set once
        buf = np.empty(min(step, rows) * cols, rec)
        if "c" in rec.names:
            buf["c"].reshape(-1, cols)[...] = np.arange(cols)
        for i in range(0, rows, step):
            part = a[i : i + step]
            band = buf[: part.size]
            if "r" in rec.names:
                band["r"].reshape(-1, cols)[...] = np.arange(i, i + part.shape[0])[:, None]
            band["v"].reshape(part.shape)[...] = part
            yield band.view(np.uint8)

    def read(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, *, mmap: bool, verify: Any) -> np.ndarray:
        """A binary layout of a whole matrix in xser's order (ids ascending, every element) is read in bands into
        the result, its ids checked band by band; anything else is decoded record by record (``decode``)."""
        if "binary" in self.name and len(shape) == 2 and 0 not in shape and np.dtype(dtype).kind == "f":
            out = self._read_in_order(f, where, np.dtype(dtype), tuple(shape), size, verify)
            if out is not None:
                return out
        return super().read(f, where, dtype, shape, size, mmap=mmap, verify=verify)

    def _read_in_order(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, verify: Any) -> np.ndarray | None:
        rows, cols = shape
        rec = self._records(shape, dtype.itemsize)
        n = cols if self.name == "binary-column" else rows * cols
        if size != n * rec.itemsize or file_size(f) != size:
            return None  # the general reader names what is wrong
        out = np.empty(shape, dtype.newbyteorder("="))
        h = CHECKSUMS[verify[0]]() if verify is not None else None
        f.seek(0)
        if rec.names == ("v",):  # values only: a band read into one buffer (in cache), hashed, copied swapped into the result
            flat = out.reshape(-1)
            buf = np.empty(min(n, _BAND), rec["v"])
            for i in range(0, n, _BAND):
                part = buf[: min(_BAND, n - i)]
                if not _fill(f, part.view(np.uint8)):
                    return None
                if h is not None:
                    h.update(part)
                np.copyto(flat[i : i + part.size], part)
        else:
            step = max(1, _BAND // (rows if self.name == "binary-column" else 1))
            if self.name != "binary-column":
                step = max(cols, step - step % cols)  # whole rows
            buf = np.empty(step, rec)
            for i in range(0, n, step):
                band = buf[: min(step, n - i)]
                if not _fill(f, band.view(np.uint8)):
                    return None
                if h is not None:
                    h.update(band.view(np.uint8))
                if self.name == "binary-column":
                    if not (band["c"] == np.arange(i, i + band.size)).all():
                        return None
                    _transpose_into(out[:, i : i + band.size], band["v"])
                    continue
                k = band.size // cols
                ids = band["c"].reshape(k, cols)
                if not (ids == np.arange(cols)).all():
                    return None
                if "r" in rec.names and not (band["r"].reshape(k, cols) == np.arange(i // cols, i // cols + k)[:, None]).all():
                    return None
                out.reshape(-1)[i : i + band.size] = band["v"]
        if h is not None:
            check_digest(verify, h.hexdigest(), where)
        return out

    def decode(self, path: str, data: bytes, dtype: np.dtype, shape: tuple) -> np.ndarray:
        if len(shape) != 2:
            raise DataError(f"{self.name} holds a matrix, the manifest says {shape_str(shape)}", Location(path))
        r, c = shape
        column = self.name.endswith("column")
        pm = {"partId": 0, "startRow": 0, "startCol": 0, "saveColNum": c, "saveColElemNum": r,
              "rowMetas": {str(i): {"rowId": i, "elementNum": c} for i in range(r)} if not column else
              {str(i): {"rowId": i, "elementNum": c} for i in range(r)}}
        out = np.zeros(shape, np.dtype(dtype).newbyteorder("="))
        vdtype = np.dtype(">f4") if np.dtype(dtype).itemsize == 4 else np.dtype(">f8")
        decode_partition(out, pm, data, self.name, vdtype, False, path)
        return out


_BAND = 1 << 18  # values per band of a binary layout (in cache)


def _transpose_into(dest: np.ndarray, src: np.ndarray) -> None:
    """``dest[...] = src.T`` in tiles along the long side, whose cache lines stay in the cache (one strided pass
    over a whole tall band reloads every line once per column)."""
    p, q = src.shape
    if p >= q:
        tile = max(1, (1 << 14) // max(1, q))
        for r in range(0, p, tile):
            dest[:, r : r + tile] = src[r : r + tile].T
    else:
        tile = max(1, (1 << 14) // max(1, p))
        for c in range(0, q, tile):
            dest[c : c + tile] = src[:, c : c + tile].T


def _fill(f: BinaryIO, view: np.ndarray) -> bool:
    """Read exactly ``view``'s bytes; False if the file ends first."""
    mv, got = memoryview(view), 0
    while got < view.size:
        k = f.readinto(mv[got:])
        if not k:
            return False
        got += k
    return True


def _external() -> dict[str, Any]:
    ANGEL = ANGEL_FORMATS

    out: dict[str, Any] = {"dynet-text": DynetText("dynet-text", ".dynet")}
    for name in ANGEL:
        out[name] = AngelFormat(name, ".bin" if "binary" in name else ".txt")
    return out


EXTERNAL = _external
