"""DyNet's text records (``#Parameter# /sub/name {dims} bytes ZERO_GRAD`` + column-major values).

A pure codec (bytes <-> records), used by the ``dynet-text`` weight format and by ``xser
import/export xnmt``. Grammar in ``docs/research/xnmt.md`` section 4.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import numpy as np

from ...errors import DataError, Location
from ..pool import cpu_pool
from .float_text import CHUNK_VALUES, format_float32, parse_float32

__all__ = ["dynet_text_pieces", "parse_dynet_text", "write_dynet_text"]

_HEADER = re.compile(r"#(Parameter|LookupParameter)# (\S+) \{([0-9,]+)(?:X([0-9]+))?\} ([0-9]+)(?: (ZERO_GRAD|FULL_GRAD))?")


def parse_dynet_text(data: bytes, path: str) -> list[dict]:
    """The records of one DyNet text file's bytes: kind, key, name, dims, grad flag and float32 values."""
    records = []
    pos = 0
    line_no = 1
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:
            raise DataError("record header without a newline", Location(path, line_no))
        header = data[pos:end].decode("ascii", "replace")
        m = _HEADER.fullmatch(header)
        if not m:
            raise DataError(f"not a DyNet record header: {header[:80]!r}", Location(path, line_no))
        kind, key, dims, batch, nbytes, grad = m.groups()
        if batch is not None and batch != "1":
            raise DataError(f"batched parameters are not supported ({header[:80]!r})", Location(path, line_no))
        shape = tuple(int(d) for d in dims.split(","))
        n = math.prod(shape)
        nbytes = int(nbytes)
        full = grad in (None, "FULL_GRAD")
        expected = (16 * n + 1) * (2 if full else 1)
        if nbytes != expected:
            raise DataError(f"byte count {nbytes} does not match {n} values ({expected})", Location(path, line_no))
        if len(data) - (end + 1) < nbytes:
            raise DataError(f"file ends inside the values of {key}", Location(path, line_no + 1))
        values = _values(data, end + 1, n, key, path, line_no + 1)
        grads = _values(data, end + 1 + 16 * n + 1, n, key, path, line_no + 2) if full else None
        name = key.rsplit("/", 1)[-1]
        records.append({"kind": kind, "key": key, "name": name, "dims": list(shape), "grad": grad,
                        "array": values.reshape(shape, order="F"),
                        "grad_array": None if grads is None else grads.reshape(shape, order="F")})
        pos = end + 1 + nbytes
        line_no += 2 + (1 if full else 0)
    return records


def _values(data: bytes, at: int, n: int, key: str, path: str, line_no: int) -> np.ndarray:
    """The ``n`` values of the line of ``16 n + 1`` bytes at ``at`` (the header counted them)."""
    end = at + 16 * n
    if n and data[end] == 10:  # maybe DyNet's own form, 16 characters a value
        fast = parse_float32(np.frombuffer(data, np.uint8, 16 * n, at).reshape(n, 16), sep=32)
        if fast is not None:
            return fast
    line = data[at : end + 1]
    tokens = line.split()
    if len(tokens) != n or not line.endswith(b"\n"):
        raise DataError(f"{key}: {len(tokens)} values on the line, the header says {n}", Location(path, line_no))
    try:
        with np.errstate(over="ignore"):  # beyond float32: inf, refused just below
            values = np.array([float(t) for t in tokens], np.float32)
    except ValueError:
        raise DataError(f"{key}: a value is not a number", Location(path, line_no)) from None
    if not np.all(np.isfinite(values)):
        raise DataError(f"{key}: non-finite value", Location(path, line_no))
    return values


def write_dynet_text(records: list[dict]) -> bytes:
    """DyNet's TextFileSaver output for these records (values as ``%+.8e``). ``grad`` is the record's flag:
    ``ZERO_GRAD`` (the default), ``FULL_GRAD`` or None (old files: no flag) with ``grad_array`` as the gradient line."""
    return b"".join(dynet_text_pieces(records))


def dynet_text_pieces(records: list[dict]) -> Iterator[bytes]:
    """``write_dynet_text``'s bytes in pieces of at most a few MiB (for writing and hashing as they come)."""
    checked = []
    for r in records:  # every record checked before the first byte
        a = np.asarray(r["array"], np.float32)
        flag = r.get("grad", "ZERO_GRAD")
        full = flag in (None, "FULL_GRAD")
        g = r.get("grad_array")
        if full and (g is None or np.shape(g) != a.shape):
            raise DataError(f"{r['key']}: {flag or 'an old-style'} record needs its gradient values")
        checked.append((r, a, flag, full, g))
    for r, a, flag, full, g in checked:
        n = a.size
        dims = ",".join(str(d) for d in r["dims"])
        size = (16 * n + 1) * (2 if full else 1)
        yield (f"#{r['kind']}# {r['key']} {{{dims}}} {size}" + (f" {flag}" if flag else "") + "\n").encode("ascii")
        yield from _line(a)
        if full:
            yield from _line(np.asarray(g, np.float32))


def _line(a: np.ndarray) -> Iterator[bytes]:
    """DyNet's value line: each value as ``%+.8e`` and a space, column-major, then a newline (vectorised)."""
    t = np.asarray(a, np.float32).T  # column-major order is the row-major order of the transpose
    flat = t.reshape(-1) if t.flags.c_contiguous else None
    if a.size and not np.isfinite(a).all():  # as C's printf writes them (DyNet's reader refuses them: so does xser's)
        yield ("".join(f"{v:+.8e} " for v in np.ascontiguousarray(t).reshape(-1).tolist()) + "\n").encode("ascii")
        return
    if t.ndim < 2 or flat is not None:
        flat = np.ascontiguousarray(t).reshape(-1)
        bands = [flat[i : i + CHUNK_VALUES] for i in range(0, flat.size, CHUNK_VALUES)]
    else:  # rows of the transpose, a band at a time (its copy stays small)
        lead = t.shape[0]
        per = max(1, CHUNK_VALUES // max(1, t[0].size))
        bands = (t[i : i + per] for i in range(0, lead, per))
    # format the next bands on the CPU threads while this one is written (numpy drops the GIL)
    pending: list = []
    for band in bands:
        pending.append(cpu_pool().submit(_format_band, band))
        if len(pending) > 2:
            yield pending.pop(0).result()
    for fut in pending:
        yield fut.result()
    yield b"\n"


def _format_band(band: np.ndarray) -> bytes:
    if band.ndim == 2 and not band.flags.c_contiguous:  # rows of a transpose: copied in tiles that stay in the cache
        out = np.empty(band.shape, np.float32)
        tile = max(1, (1 << 14) // max(1, band.shape[0]))
        for c in range(0, band.shape[1], tile):
            out[:, c : c + tile] = band[:, c : c + tile]
        band = out
    return format_float32(np.ascontiguousarray(band)).tobytes()
