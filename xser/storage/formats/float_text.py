"""Vectorised float32 text: ``%+.8e`` both ways, and sparse-text's ``j:%+.8e `` lines, as numpy arrays of bytes.

9 significant digits, so every finite float32 reads back bit for bit. Shared by the dense-text,
sparse-text and DyNet text codecs.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CHUNK_VALUES", "format_float32", "parse_float32"]

CHUNK_VALUES = 1 << 18  # values per formatting chunk: small enough to stay in the CPU cache (measured)


_LUT4 = np.array([int.from_bytes(f"{i:04d}".encode(), "little") for i in range(10000)], np.uint32)
_LUT2 = np.array([int.from_bytes(f"{i:02d}".encode(), "little") for i in range(100)], np.uint32)
_P10 = np.array([10.0**k for k in range(-60, 61)])  # 10.0**k, correctly rounded by Python


def format_float32(values: np.ndarray, sep: int = ord(" ")) -> np.ndarray:
    """Fixed-width ``%+.8e`` text of finite float32 values plus a separator: an (n, 16) uint8 array.

    9 significant digits, so parsing the text gives the same float32. Vectorised over uint32
    words (four characters each), which is what makes it many times faster than ``%`` formatting.
    """
    flat = values.reshape(-1)
    v = np.abs(flat.astype(np.float64))
    zero = v == 0
    v[zero] = 1.0
    _, b = np.frexp(v)  # v = f * 2**b, 0.5 <= f < 1
    e = ((b - 1) * 0.30102999566398120).astype(np.int32)  # decimal exponent (truncated), maybe 1 off
    e -= (b < 1) & (e * 3.3219280948873626 > b - 1)  # floor for negative exponents
    e += v >= _P10[e + 61]
    e -= v < _P10[e + 60]
    m = np.rint(v * _P10[68 - e]).astype(np.int32)  # 9 digits: v * 10**(8 - e)
    carry = m >= 1_000_000_000  # rounding up to 10.00000000
    m[carry] //= 10
    e += carry
    m[zero] = 0
    e[zero] = 0
    hi, lo = np.divmod(m, 10000)
    d0, mid = np.divmod(hi, 10000)
    a, b4 = _LUT4[mid], _LUT4[lo]  # four digit characters each, little-endian
    words = np.empty((flat.size, 4), np.uint32)
    sign = np.signbit(flat).view(np.uint8).astype(np.uint32) * 2 + ord("+")  # '+' 43, '-' 45
    w0 = a << 24
    w0 |= sign
    w0 |= d0.view(np.uint32) << 8
    w0 |= (ord(".") << 16) | (ord("0") << 8)
    words[:, 0] = w0
    words[:, 1] = (a >> 8) | ((b4 & 0xFF) << 24)
    words[:, 2] = (b4 >> 8) | (ord("e") << 24)
    esign = (e < 0).view(np.uint8).astype(np.uint32) * 2 + ord("+")
    words[:, 3] = esign | (_LUT2[np.abs(e)] << 8) | (sep << 24)
    return words.view(np.uint8).reshape(flat.size, 16)


def parse_float32(chars: np.ndarray) -> np.ndarray | None:
    """Inverse of ``format_float32`` for an (n, 15+) uint8 array; None if any entry has another form."""
    out = np.empty(len(chars), np.float32)
    for start in range(0, len(chars), CHUNK_VALUES):
        part = _parse_chunk(chars[start : start + CHUNK_VALUES])
        if part is None:
            return None
        out[start : start + len(part)] = part
    return out


def _parse_chunk(chars: np.ndarray) -> np.ndarray | None:
    c = chars[:, :15].astype(np.int16) - ord("0")
    ok = (
        ((chars[:, 0] == ord("+")) | (chars[:, 0] == ord("-")))
        & (chars[:, 2] == ord(".")) & (chars[:, 11] == ord("e"))
        & ((chars[:, 12] == ord("+")) | (chars[:, 12] == ord("-")))
    )
    digits = np.concatenate([c[:, 1:2], c[:, 3:11], c[:, 13:15]], axis=1)
    if not (ok.all() and ((digits >= 0) & (digits <= 9)).all()):
        return None
    m = np.zeros(len(chars), np.int64)
    for k in range(9):
        m = m * 10 + digits[:, k]
    e = digits[:, 9].astype(np.int64) * 10 + digits[:, 10]
    e = np.where(chars[:, 12] == ord("-"), -e, e)
    value = m.astype(np.float64) * _P10[e - 8 + 60]
    return np.where(chars[:, 0] == ord("-"), -value, value).astype(np.float32)


def decimal_digits(v: np.ndarray) -> np.ndarray:
    """How many decimal digits each non-negative integer has (int64 array)."""
    n = np.ones(v.size, np.int64)
    for k in range(1, 19):
        more = v >= 10**k
        if not more.any():
            break
        n += more
    return n


def _sparse_block(block: np.ndarray, threshold: float) -> bytes:
    """sparse-text lines of finite float32 rows: ``j:%+.8e `` per kept value, ``\\n`` per row, built as one byte array."""
    keep = (np.abs(block) > threshold) if threshold else ((block != 0) | np.signbit(block))
    r, c = np.nonzero(keep)
    digits = decimal_digits(c)
    width = digits + 17  # "j" + ":" + 15 characters of the value + " "
    per_row = np.bincount(r, weights=width, minlength=block.shape[0]).astype(np.int64) + 1
    out = np.empty(int(per_row.sum()), np.uint8)
    row_end = np.cumsum(per_row)
    out[row_end - 1] = ord("\n")
    row_start = row_end - per_row
    first = np.r_[True, r[1:] != r[:-1]] if r.size else np.empty(0, bool)
    within = np.cumsum(width) - width  # offset of each token from the first token of all rows
    base = within - within[np.flatnonzero(first)[np.cumsum(first) - 1]] if r.size else within
    pos = row_start[r] + base
    for k in range(int(digits.max()) if c.size else 0):  # digit k from the left, where the index has it
        has = digits > k
        p = pos[has] + k
        out[p] = ord("0") + (c[has] // 10 ** (digits[has] - 1 - k)) % 10
    out[pos + digits] = ord(":")
    text = format_float32(block[r, c]) if c.size else np.empty((0, 16), np.uint8)
    cols = pos + digits + 1
    out[cols[:, None] + np.arange(16)[None, :]] = text
    return out.tobytes()


def _sparse_fast(lines: list[bytes], rows: int, cols: int, dtype: np.dtype) -> np.ndarray | None:
    """sparse-text in the form xser writes (``j:%+.8e `` tokens), parsed as arrays; None for any other form."""
    if dtype != np.float32 or not lines:
        return None
    data = np.frombuffer(b"\n".join(lines) + b"\n", np.uint8)
    colon = np.flatnonzero(data == ord(":"))
    ends = np.flatnonzero(data == ord("\n"))
    if ends.size != rows:
        return None
    out = np.zeros((rows, cols), np.float32)
    if not colon.size:
        return out if ends.size == rows and (data == ord("\n")).sum() == data.size else None
    if colon[-1] + 16 >= data.size:
        return None
    gaps = np.flatnonzero((data == ord(" ")) | (data == ord("\n")))
    start = np.searchsorted(gaps, colon)
    begin = np.where(start > 0, gaps[np.maximum(start - 1, 0)] + 1, 0)
    ndig = colon - begin
    if (ndig < 1).any() or (ndig > 18).any():
        return None
    idx = np.zeros(colon.size, np.int64)
    for k in range(int(ndig.max())):
        has = ndig > k
        d = data[begin[has] + k].astype(np.int64) - ord("0")
        if ((d < 0) | (d > 9)).any():
            return None
        idx[has] = idx[has] * 10 + d
    vals = parse_float32(data[colon[:, None] + 1 + np.arange(16)[None, :]])
    if vals is None:
        return None
    row = np.searchsorted(ends, colon)
    # every byte must be accounted for: tokens of digits + 17 bytes, then a newline per row
    if int((ndig + 17).sum()) + rows != data.size or (idx >= cols).any():
        return None
    same_row = row[1:] == row[:-1]
    if (same_row & (idx[1:] <= idx[:-1])).any():
        return None
    out[row, idx] = vals
    return out
