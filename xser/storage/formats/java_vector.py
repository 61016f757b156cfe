"""Java 8's number text for arrays: vectorised ``Float.toString`` and ``DecimalFormat("#.######")``, as Angel's bytes.

float32 values are worked out in float64 (FloatingDecimal's digit loop as interval tests, its int
arithmetic redone with Java's wrap-around); every value whose decision lies within the float64 error,
and every value this does not model (integers from 2^24 to 2^63, long arithmetic near 2^63, doubles for
``Double.toString``), goes through the exact emulation in ``java_text``. Results are (n, width) uint8
characters with lengths, which ``join_records`` turns into lines.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .float_text import decimal_digits
from .java_text import decimal6, java_string, scales

__all__ = ["decimal6_chars", "int_chars", "java_chars", "join_records", "long_chars"]

@functools.cache
def _float_scales() -> tuple[np.ndarray, np.ndarray]:
    """Arithmetic width and 10 S (a float64: exact below 2**53) of FloatingDecimal for floats, by
    [binary exponent + 149, significant bits - 1, decimal-exponent estimate - floor(binary exponent * log10 2) + 1]."""
    width = np.zeros((277, 24, 3), np.int64)
    log_tens = np.zeros((277, 24, 3))
    for bin_exp in range(-149, 128):
        for nfract in range(1, 25):
            ntiny = max(0, nfract - bin_exp - 1)
            for k in range(3):
                dec_exp = math.floor(bin_exp * 0.30102999566398120) + k - 1
                _, _, s5, s2, _, _, w, _ = scales(dec_exp, bin_exp, nfract, ntiny, min(24, bin_exp + 150))
                width[bin_exp + 149, nfract - 1, k] = w
                log_tens[bin_exp + 149, nfract - 1, k] = float(10 * 5**s5 << s2) if w else math.inf
    return width, log_tens



_P10 = np.array([float(f"1e{k}") for k in range(-340, 341)])  # 10**k correctly rounded (inf past 1e308); index k + 340
_GUARD = 2.0**-20  # |error| bound of the float64 scaled values below (they stay under 1e9 < 2**30), with room


def _p10(k: np.ndarray) -> np.ndarray:
    return _P10[k + 340]


_ndigits = decimal_digits


_POW10_INT = np.array([10**i for i in range(19)], np.int64)


def _digits_at(out: np.ndarray, rows: np.ndarray, col: np.ndarray, value: np.ndarray, width: np.ndarray) -> None:
    """Write ``value`` as ``width`` zero-padded digits at ``out[rows, col:col + width]`` (vectorised over rows)."""
    for k in range(int(width.max()) if width.size else 0):
        has = width > k
        out[rows[has], col[has] + k] = 48 + (value[has] // _POW10_INT[width[has] - 1 - k]) % 10


def int_chars(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decimal text of non-negative int64s: (n, width) uint8 characters, left-aligned, and their lengths."""
    v = np.asarray(values, np.int64).reshape(-1)
    n = _ndigits(v)
    out = np.zeros((v.size, int(n.max()) if v.size else 1), np.uint8)
    _digits_at(out, np.arange(v.size), np.zeros(v.size, np.int64), v, n)
    return out, n


def long_chars(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``String.valueOf`` of Java ints or longs (signed int64s) in the (n, width) form."""
    v = np.asarray(values, np.int64).reshape(-1)
    if not v.size or v.min() >= 0:
        return int_chars(v)
    return _text_chars([str(x) for x in v.tolist()])


def join_records(fields: list[tuple[np.ndarray, np.ndarray]], sep: bytes) -> bytes:
    """Lines of text fields joined by ``sep``: each field is (n, width) chars and (n,) lengths, or
    (n, k, width) and (n, k) for k fields in a row (a line of a column format)."""
    if not fields or fields[0][0].shape[0] == 0:
        return b""
    n = fields[0][0].shape[0]
    sep_col = np.frombuffer(sep, np.uint8)
    blocks, masks = [], []
    for chars, lengths in fields:
        if chars.ndim == 2:
            chars, lengths = chars[:, None, :], lengths[:, None]
        k, width = chars.shape[1], chars.shape[2]
        block = np.empty((n, k, width + sep_col.size), np.uint8)
        block[:, :, :width] = chars
        block[:, :, width:] = sep_col
        mask = np.ones(block.shape, bool)
        mask[:, :, :width] = np.arange(width)[None, None, :] < lengths[:, :, None]
        blocks.append(block.reshape(n, -1))
        masks.append(mask.reshape(n, -1))
    masks[-1][:, -sep_col.size :] = False  # no separator after the last field
    blocks.append(np.full((n, 1), 10, np.uint8))
    masks.append(np.ones((n, 1), bool))
    return np.concatenate(blocks, axis=1)[np.concatenate(masks, axis=1)].tobytes()


def _text_chars(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as Angel writes them (``writeBytes``: the low byte of each char) in the (n, width) form."""
    raw = [t.translate(_LOW_BYTE).encode("latin-1") for t in texts]
    lengths = np.array([len(r) for r in raw], np.int64)
    width = int(lengths.max()) if raw else 1
    return np.frombuffer(b"".join(r.ljust(width, b"\0") for r in raw), np.uint8).reshape(len(raw), width).copy(), lengths


_LOW_BYTE = {0xFFFD: 0xFD, 0x221E: 0x1E}


def _merge(fast: tuple[np.ndarray, np.ndarray], slow_at: np.ndarray, slow: list[str]) -> tuple[np.ndarray, np.ndarray]:
    chars, lengths = fast
    if not slow:
        return chars, lengths
    sc, sl = _text_chars(slow)
    if sc.shape[1] > chars.shape[1]:
        chars = np.concatenate([chars, np.zeros((chars.shape[0], sc.shape[1] - chars.shape[1]), np.uint8)], axis=1)
    chars[slow_at] = 0
    chars[slow_at, : sc.shape[1]] = sc
    lengths[slow_at] = sl
    return chars, lengths


def java_chars(values: np.ndarray, is_float: bool) -> tuple[np.ndarray, np.ndarray]:
    """``java_string`` of every value, as (n, width) uint8 characters and lengths.

    float32: vectorised, with the exact emulation for the values it cannot settle; float64: exact emulation.
    """
    flat = np.asarray(values).reshape(-1)
    if not is_float:
        return _text_chars([java_string(x, False) for x in flat.astype(np.float64).tolist()])
    x = flat.astype(np.float32)
    out = np.zeros((x.size, 18), np.uint8)
    out_len = np.zeros(x.size, np.int64)
    slow_at = []
    for start in range(0, x.size, _CHUNK):  # chunks that stay in the CPU cache: several times faster
        part = x[start : start + _CHUNK]
        v = np.abs(part.astype(np.float64))
        regular = np.isfinite(v) & (v != 0) & ~((v >= 2.0**24) & (v < 2.0**63))  # Java prints integers < 2^63 its own way
        idx = np.flatnonzero(regular)
        neg, t, p, X, doubt = _float32_digits(part[idx], v[idx])
        chars, lengths = _render(neg, t, p, X)
        out[start + idx] = chars
        out_len[start + idx] = lengths
        slow_at += [start + np.flatnonzero(~regular), start + idx[doubt]]
    at = np.concatenate(slow_at) if slow_at else np.empty(0, np.int64)
    return _merge((out, out_len), at, [java_string(float(a), True) for a in x[at].tolist()])


_CHUNK = 1 << 15


def _float32_digits(x: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, ...]:
    """FloatingDecimal's digits of finite non-zero float32 values (not integers in [2^24, 2^63)) in float64.

    Returns (negative, digits as an integer, number of digits, decimal exponent, doubtful): the
    digits are ``t`` written with ``p`` digits, the value ``0.<digits> * 10**X``. Doubtful entries are
    within the float64 error of a decision and must go through ``java_string``.
    """
    bits = x.view(np.uint32)
    expf = ((bits >> 23) & 0xFF).astype(np.int64)
    sig = (bits & 0x7FFFFF).astype(np.int64)
    sig = np.where(expf == 0, sig, sig | 0x800000)
    e2 = np.where(expf == 0, -149, expf - 150)  # v = sig * 2**e2
    m = np.ldexp(1.0, e2 - 1 - ((sig & (sig - 1)) == 0))  # half an ulp; a quarter for powers of two
    mant, ex = np.frexp(v)
    bin_exp = ex - 1
    est = np.floor((2 * mant - 1.5) * 0.289529654 + 0.176091259 + bin_exp.astype(np.float64) * 0.301029995663981).astype(np.int64)
    e = np.floor(np.log10(v)).astype(np.int64)
    e += v >= _p10(e + 1)
    e -= v < _p10(e)
    nfract = np.minimum(24, bin_exp + 150) - (np.frexp((sig & -sig).astype(np.float64))[1] - 1)  # bits, less trailing zeros
    doubt = (np.abs(v - _p10(e)) <= v * 2.0**-48) | (np.abs(v - _p10(e + 1)) <= v * 2.0**-48) | (est < e) | (est > e + 1)
    est = np.clip(est, e, e + 1)
    # the estimate one too high and 10**est within the margin: FloatingDecimal's leading '0' rounds up to a power of ten
    gap = _p10(est) - v
    power = (est == e + 1) & (gap < m)
    doubt |= (est == e + 1) & (np.abs(gap - m) <= v * 2.0**-48)
    forced = (est == e) & ((e < -3) | (e >= 8))  # the E form makes two digits, unless the estimate was high
    kmin = np.where(forced, 2, 1)

    def test(p: np.ndarray, v: np.ndarray, m: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, ...]:
        scale = _p10(p - 1 - e)
        y = v * scale
        t = np.floor(y)
        fr = y - t
        mu = m * scale
        low, high = fr < mu, (1 - fr) < mu
        near = (np.abs(fr - mu) < _GUARD) | (np.abs(1 - fr - mu) < _GUARD) | (fr < _GUARD) | (fr > 1 - _GUARD)
        return t, fr, low, high, near

    # the first digit count whose test passes (a monotone test). With mu > 1/2 it surely passes; below,
    # by luck, with odds 2 mu: so start where mu first exceeds 1/2 and step down while the tests pass
    lo = np.clip(np.floor(e + np.log10(0.5 / m)).astype(np.int64) + 2, kmin, 9)
    rows = np.arange(v.size)
    while rows.size:
        cand = lo[rows] - 1
        rows = rows[cand >= kmin[rows]]
        cand = lo[rows] - 1
        _, _, low, high, near = test(cand, v[rows], m[rows], e[rows])
        doubt[rows] |= near
        rows = rows[low | high]
        lo[rows] -= 1
    t, fr, low, high, near = test(lo, v, m, e)
    doubt |= (near | (np.abs(fr - 0.5) < _GUARD) | ~(low | high)) & ~power
    up = high & (~low | (fr > 0.5))
    # FloatingDecimal's int or long arithmetic wraps around. Tests that came out false kept b + m <= 10 S,
    # so only the last step can wrap, where b = fr 10 S and m = mu 10 S (integers). With ints (10 S < 2**31)
    # that step is redone in float64, which holds these integers exactly, with Java's wrap-around: m <= 0
    # passes both tests, b + m can turn negative. ((b << 1) - tens wraps twice or not at all: it is exact.)
    # Long arithmetic near 2**63 is left to the exact emulation.
    k = np.clip(est - np.floor(bin_exp * 0.30102999566398120).astype(np.int64) + 1, 0, 2)
    widths, tens_table = _float_scales()
    w = widths[bin_exp + 149, nfract - 1, k]
    tens = tens_table[bin_exp + 149, nfract - 1, k]
    mu = m * _p10(lo - 1 - e)
    ints = ~power & (w == 32)
    long_top = (w == 64) & (np.log2(tens) + np.log2(fr + mu + 1e-300) >= 62.5)
    tens = np.where(ints, tens, 0.0)
    mm = _wrap32(np.rint(mu * tens))
    bb = np.rint(fr * tens)
    guard = (lo > 1) & (mm <= 0)
    low32 = guard | (bb < mm)
    high32 = guard | (_wrap32(bb + mm) > tens)
    up = np.where(ints, high32 & (~low32 | (2 * bb > tens) | ((2 * bb == tens) & (t % 2 == 1))), up)
    doubt |= ints & ~low32 & ~high32  # Java goes on to another digit
    doubt |= ~power & long_top
    t = t.astype(np.int64) + up
    X = e + 1
    carry = t == _POW10_INT[lo]
    t = np.where(carry, _POW10_INT[lo - 1], t)
    X = X + carry
    # the power-of-ten case: '1' (or '10' in the E form of the estimate), one place up
    forced_est = (est < -3) | (est >= 8)
    t = np.where(power, np.where(forced_est, 10, 1), t)
    p = np.where(power, np.where(forced_est, 2, 1), lo)
    X = np.where(power, est + 1, X)
    return np.signbit(x), t, p, X, doubt


def _wrap32(v: np.ndarray) -> np.ndarray:
    """Java int wrap-around of exact integers held in float64."""
    return (np.mod(v + 2.0**31, 2.0**32) - 2.0**31)


def _render(neg: np.ndarray, t: np.ndarray, p: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float.toString's layout of ``0.<t as p digits> * 10**X`` (and a sign)."""
    n = t.size
    out = np.zeros((n, 18), np.uint8)
    rows = np.arange(n)
    pos = neg.astype(np.int64)
    out[neg, 0] = ord("-")
    plain = (X > 0) & (X < 8)
    small = (X <= 0) & (X > -3)
    sci = ~plain & ~small
    # plain: the integer part (digits, then zeros), '.', the rest or '0'
    r = rows[plain]
    P, XX, T, c = p[plain], X[plain], t[plain], pos[plain]
    whole = np.minimum(P, XX)
    _digits_at(out, r, c, T // _POW10_INT[P - whole], whole)
    zeros = XX - whole
    _digits_at(out, r, c + whole, np.zeros(r.size, np.int64), zeros)
    out[r, c + XX] = ord(".")
    frac = P - whole
    _digits_at(out, r, c + XX + 1, np.where(frac > 0, T % _POW10_INT[frac], 0), np.maximum(frac, 1))
    length_plain = c + XX + 1 + np.maximum(frac, 1)
    # small: '0.', -X zeros, the digits
    r = rows[small]
    P, XX, T, c = p[small], X[small], t[small], pos[small]
    out[r, c] = ord("0")
    out[r, c + 1] = ord(".")
    _digits_at(out, r, c + 2, T, P - XX)  # leading zeros come from the padding
    length_small = c + 2 + P - XX
    # sci: d '.' rest-or-0 'E' exponent
    r = rows[sci]
    P, XX, T, c = p[sci], X[sci], t[sci], pos[sci]
    _digits_at(out, r, c, T // _POW10_INT[P - 1], np.ones(r.size, np.int64))
    out[r, c + 1] = ord(".")
    rest = np.maximum(P - 1, 1)
    _digits_at(out, r, c + 2, np.where(P > 1, T % _POW10_INT[P - 1], 0), rest)
    at = c + 2 + rest
    out[r, at] = ord("E")
    ee = XX - 1
    minus = ee < 0
    out[r[minus], at[minus] + 1] = ord("-")
    at = at + 1 + minus
    ne = _ndigits(np.abs(ee))
    _digits_at(out, r, at, np.abs(ee), ne)
    length = np.zeros(n, np.int64)
    length[plain], length[small], length[sci] = length_plain, length_small, at + ne
    return out, length


def decimal6_chars(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``decimal6`` of every float64, as (n, width) uint8 characters (Angel's bytes) and lengths.

    Below 2^22 the value times 1e6 is rounded half-even in float64 (its error is far below the
    guard that sends near-ties to the exact emulation); larger values, NaN and infinities use it always.
    """
    x = np.asarray(values, np.float64).reshape(-1)
    v = np.abs(x)
    fast = np.isfinite(v) & (v < 2.0**22)
    y = np.where(fast, v, 0) * 1e6
    r = np.rint(y)
    doubt = fast & (np.abs(np.abs(y - np.floor(y)) - 0.5) <= y * 2.0**-50 + 2.0**-40)
    r = r.astype(np.int64)
    neg = np.signbit(x)
    whole, frac = np.divmod(r, 1_000_000)
    nz = np.zeros(x.size, np.int64)  # trailing zeros of the 6 decimals
    f = frac.copy()
    for _ in range(6):
        z = (f % 10 == 0) & (f > 0)
        nz += z
        f = np.where(z, f // 10, f)
    out = np.zeros((x.size, 24), np.uint8)
    rows = np.arange(x.size)
    out[neg, 0] = ord("-")
    c = neg.astype(np.int64)
    nw = _ndigits(whole)
    _digits_at(out, rows, c, whole, nw)
    has = frac > 0
    out[rows[has], (c + nw)[has]] = ord(".")
    _digits_at(out, rows[has], (c + nw + 1)[has], f[has], (6 - nz)[has])
    length = c + nw + np.where(has, 7 - nz, 0)
    slow_at = np.flatnonzero(~fast | doubt)
    return _merge((out, length), slow_at, [decimal6(a) for a in x[slow_at].tolist()])
