"""Vectorised float32 text: ``%+.8e`` both ways, and sparse-text's ``j:%+.8e `` lines, as numpy arrays of bytes.

9 significant digits, so every finite float32 reads back bit for bit. Shared by the dense-text,
sparse-text and DyNet text codecs.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from ..pool import cpu_pool

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


def _word(chars: list[int]) -> np.uint64:
    return np.uint64(int.from_bytes(bytes(chars), "little"))


# ``%+.8e`` and a separator, as two little-endian uint64 words: byte 0 sign, 1 digit, 2 '.', 3-10 digits, 11 'e',
# 12 sign, 13-14 digits, 15 separator (not looked at). XOR with _X makes every digit its value and every fixed
# character 0 ('+' 0, '-' 6). A word is in the form when (y & _H) == 0 (digits below 16, fixed bytes 0, signs 0 to 6)
# and ((y + _A) & _B) == 0 (digits below 10: +6 does not reach 16; signs 0 or 6: +2 sets bit 2 for 2 and 4 only).
_X = (_word([0x2B, 0x30, 0x2E, 0x30, 0x30, 0x30, 0x30, 0x30]), _word([0x30, 0x30, 0x30, 0x65, 0x2B, 0x30, 0x30, 0]))
_H = (_word([0xF9, 0xF0, 0xFF, 0xF0, 0xF0, 0xF0, 0xF0, 0xF0]), _word([0xF0, 0xF0, 0xF0, 0xFF, 0xF9, 0xF0, 0xF0, 0]))
_A = (_word([2, 6, 0, 6, 6, 6, 6, 6]), _word([6, 6, 6, 0, 2, 6, 6, 0]))
_B = (_word([4, 0xF0, 0, 0xF0, 0xF0, 0xF0, 0xF0, 0xF0]), _word([0xF0, 0xF0, 0xF0, 0, 4, 0xF0, 0xF0, 0]))
# the value is m * 10**(e - 8), signed: by exponent digits + 100 (exponent negative) + 200 (value negative)
_SCALE = np.array([s * 10.0 ** (es * e - 8) for s in (1, -1) for es in (1, -1) for e in range(100)])
_PARSE_STEP = 1 << 15  # values per parsing chunk (in cache)
_PARSE_BAND = 1 << 21  # values per task on the CPU threads


def parse_float32(chars: np.ndarray, sep: int | None = None) -> np.ndarray | None:
    """Inverse of ``format_float32`` for an (n, 15+) uint8 array; None if any entry has another form.

    Byte 15 (the separator) must be ``sep``, or is not looked at (None). Each value is two uint64 words,
    checked and turned into its 9 digits by word arithmetic (SWAR), chunk by chunk.
    """
    n = len(chars)
    if chars.ndim != 2 or chars.shape[1] < 15:
        return None
    if chars.shape[1] != 16 or not chars.flags.c_contiguous:
        if sep is not None:
            return None
        whole = np.zeros((n, 16), np.uint8)
        whole[:, :15] = chars[:, :15]
        chars = whole
    words = chars.view(np.uint64)
    out = np.empty(n, np.float32)
    form = (_X[0], _X[1], _H[0], _H[1]) if sep is None else (_X[0], _X[1] | np.uint64(sep << 56), _H[0], _H[1] | np.uint64(0xFF << 56))
    bands = [(a, min(n, a + _PARSE_BAND)) for a in range(0, n, _PARSE_BAND)]
    if len(bands) > 1 and not threading.current_thread().name.startswith("xser-cpu"):  # numpy drops the GIL: bands on the CPU threads
        rest = [cpu_pool().submit(_parse_band, words, out, a, b, form) for a, b in bands[1:]]
        ok = _parse_band(words, out, *bands[0], form)
        return out if all([ok] + [f.result() for f in rest]) else None
    return out if all(_parse_band(words, out, a, b, form) for a, b in bands) else None


def _parse_band(words: np.ndarray, out: np.ndarray, a: int, b: int, form: tuple) -> bool:
    with np.errstate(over="ignore"):  # exponents beyond float32 give inf, as a parser would
        for start in range(a, b, _PARSE_STEP):
            if not _parse_words(words[start : min(b, start + _PARSE_STEP)], out[start : min(b, start + _PARSE_STEP)], *form):
                return False
    return True


def _parse_words(words: np.ndarray, out: np.ndarray, x0: np.uint64, x1: np.uint64, h0: np.uint64, h1: np.uint64) -> bool:
    U = np.uint64
    y0 = words[:, 0] ^ x0
    y1 = words[:, 1] ^ x1
    bad = y0 & h0
    t = y0 + _A[0]
    t &= _B[0]
    bad |= t
    np.bitwise_and(y1, h1, out=t)
    bad |= t
    np.add(y1, _A[1], out=t)
    t &= _B[1]
    bad |= t
    if bad.any():
        return False
    z = y0 >> U(24)  # the 8 digits after the point, first digit in the low byte
    np.left_shift(y1, U(40), out=t)
    z |= t
    z *= U(2561)  # pairs of digits
    z >>= U(8)
    z &= U(0x00FF00FF00FF00FF)
    z *= U(6553601)  # fours
    z >>= U(16)
    z &= U(0x0000FFFF0000FFFF)
    z *= U(42949672960001)  # eight
    z >>= U(32)
    np.right_shift(y0, U(8), out=t)  # the digit before the point
    t &= U(0xFF)
    t *= U(100_000_000)
    z += t
    e = y1 >> U(40)  # exponent digits, then the scale's index
    e &= U(0x0F0F)
    e *= U(2561)
    e >>= U(8)
    e &= U(0xFF)
    np.right_shift(y1, U(33), out=t)
    t &= U(1)
    t *= U(100)
    e += t
    np.right_shift(y0, U(1), out=t)
    t &= U(1)
    t *= U(200)
    e += t
    np.multiply(z.astype(np.float64), _SCALE[e.view(np.int64)], out=out, casting="same_kind")
    return True


def decimal_digits(v: np.ndarray) -> np.ndarray:
    """How many decimal digits each non-negative integer has (int64 array)."""
    n = np.ones(v.size, np.int64)
    for k in range(1, 19):
        more = v >= 10**k
        if not more.any():
            break
        n += more
    return n


@functools.cache
def _full_row(cols: int) -> tuple[int, list[tuple[int, int, int, int, np.ndarray]]]:
    """The layout of a sparse-text row that keeps all ``cols`` values: its length, and per run of column indices
    with the same number of digits (start in the row, first column, columns, digits, their ``j:`` texts)."""
    runs, at, j = [], 0, 0
    while j < cols:
        w = len(str(j))
        end = min(cols, 10**w)
        text = np.frombuffer("".join(f"{k}:" for k in range(j, end)).encode(), np.uint8).reshape(end - j, w + 1)
        runs.append((at, j, end - j, w, text))
        at += (end - j) * (w + 17)
        j = end
    return at + 1, runs


def _full_rows(block: np.ndarray) -> bytes:
    """sparse-text of rows that keep every value: each run of same-width indices is a strided view (no per-digit work)."""
    rows, cols = block.shape
    length, runs = _full_row(cols)
    out = np.empty((rows, length), np.uint8)
    chars = format_float32(block).reshape(rows, cols, 16)
    for at, j, n, w, text in runs:
        cells = out[:, at : at + n * (w + 17)].reshape(rows, n, w + 17)
        cells[:, :, : w + 1] = text
        cells[:, :, w + 1 :] = chars[:, j : j + n]
    out[:, -1] = 10
    return out.tobytes()


def _full_parse(raw: np.ndarray, rows: int, cols: int) -> np.ndarray | None:
    """Inverse of ``_full_rows`` for (rows, row length) bytes; None if any byte differs from that form."""
    length, runs = _full_row(cols)
    if raw.shape != (rows, length) or not (raw[:, -1] == 10).all():
        return None
    chars = np.empty((rows, cols, 16), np.uint8)
    for at, j, n, w, text in runs:
        cells = raw[:, at : at + n * (w + 17)].reshape(rows, n, w + 17)
        if not (cells[:, :, : w + 1] == text).all():
            return None
        chars[:, j : j + n] = cells[:, :, w + 1 :]
    values = parse_float32(chars.reshape(-1, 16), sep=32)
    return None if values is None else values.reshape(rows, cols)


def _sparse_block(block: np.ndarray, threshold: float) -> bytes:
    """sparse-text lines of finite float32 rows: ``j:%+.8e `` per kept value, ``\\n`` per row, built as one byte array."""
    keep = (np.abs(block) > threshold) if threshold else ((block != 0) | np.signbit(block))
    if keep.all() and block.size:
        return _full_rows(block)
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
    if cols and all(len(line) == len(lines[0]) for line in lines) and len(lines[0]) == _full_row(cols)[0] - 1:  # every value kept
        full = _full_parse(np.frombuffer(b"\n".join(lines) + b"\n", np.uint8).reshape(rows, -1), rows, cols)
        if full is not None:
            return full
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
