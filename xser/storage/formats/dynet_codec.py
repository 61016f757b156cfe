"""DyNet's text records (``#Parameter# /sub/name {dims} bytes ZERO_GRAD`` + column-major values).

A pure codec (bytes <-> records), used by the ``dynet-text`` weight format and by ``xser
import/export xnmt``. Grammar in ``docs/research/xnmt.md`` section 4.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ...errors import DataError, Location
from .float_text import format_float32, parse_float32

__all__ = ["parse_dynet_text", "write_dynet_text"]

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
        body = data[end + 1 : end + 1 + nbytes]
        if len(body) != nbytes:
            raise DataError(f"file ends inside the values of {key}", Location(path, line_no + 1))
        values = _values(body[: 16 * n + 1], n, key, path, line_no + 1)
        grads = _values(body[16 * n + 1 :], n, key, path, line_no + 2) if full else None
        name = key.rsplit("/", 1)[-1]
        records.append({"kind": kind, "key": key, "name": name, "dims": list(shape), "grad": grad,
                        "array": values.reshape(shape, order="F"),
                        "grad_array": None if grads is None else grads.reshape(shape, order="F")})
        pos = end + 1 + nbytes
        line_no += 2 + (1 if full else 0)
    return records


def _values(line: bytes, n: int, key: str, path: str, line_no: int) -> np.ndarray:
    if len(line) == 16 * n + 1 and line.endswith(b"\n") and n:  # DyNet's own form, 16 characters a value: vectorised
        chars = np.frombuffer(line, np.uint8, 16 * n).reshape(n, 16)
        if (chars[:, 15] == ord(" ")).all():
            fast = parse_float32(chars)
            if fast is not None:
                return fast
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
    out = []
    for r in records:
        a = np.asarray(r["array"], np.float32)
        n = a.size
        dims = ",".join(str(d) for d in r["dims"])
        flag = r.get("grad", "ZERO_GRAD")
        full = flag in (None, "FULL_GRAD")
        g = r.get("grad_array")
        if full and (g is None or np.shape(g) != a.shape):
            raise DataError(f"{r['key']}: {flag or 'an old-style'} record needs its gradient values")
        size = (16 * n + 1) * (2 if full else 1)
        out.append((f"#{r['kind']}# {r['key']} {{{dims}}} {size}" + (f" {flag}" if flag else "") + "\n").encode("ascii"))
        out.append(_line(a))
        if full:
            out.append(_line(np.asarray(g, np.float32)))
    return b"".join(out)


def _line(a: np.ndarray) -> bytes:
    """DyNet's value line: each value as ``%+.8e`` and a space, column-major, then a newline (vectorised)."""
    flat = np.ascontiguousarray(a.reshape(-1, order="F"), np.float32)
    if flat.size and not np.isfinite(flat).all():  # as C's printf writes them (DyNet's reader refuses them: so does xser's)
        return ("".join(f"{v:+.8e} " for v in flat.tolist()) + "\n").encode("ascii")
    step = 1 << 20  # in chunks: the formatter's temporaries stay in cache (4x faster than all at once)
    return b"".join(format_float32(flat[i : i + step]).tobytes() for i in range(0, flat.size, step)) + b"\n"
