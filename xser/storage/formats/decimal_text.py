"""Plain decimal numbers separated by single spaces, parsed as arrays: what C's ``strtod`` gives, many times faster.

Tokens of the form ``-?[0-9]+(\\.[0-9]+)?(E-?[0-9]+)?`` (``e`` too): Java's ``Float/Double.toString`` and
``String.valueOf`` of ints and longs, DecimalFormat's ``#.######``, C's ``%g``. Every byte is classified and
the grammar checked by position; each token's digits are summed with their powers of ten in exact integers
(at most 18 of them), and ``m * 10**k`` (or ``m / 10**-k``) is one correctly rounded operation when ``m < 2**53``
and ``|k| <= 22``: the double ``strtod`` returns. Other tokens in that form (more digits, farther exponents) go
through Python's ``float``, also correctly rounded; anything else in the text makes the parse give None, and
the caller's general parser (which names what is wrong) takes over.
"""

from __future__ import annotations

import numpy as np

__all__ = ["parse_decimals"]

_CLASS = np.zeros(256, np.uint8)  # 0 other, 1 digit, 2 '.', 3 'E'/'e', 4 '-', 5 ' '
_CLASS[48:58] = 1
_CLASS[ord(".")] = 2
_CLASS[[ord("E"), ord("e")]] = 3
_CLASS[ord("-")] = 4
_CLASS[ord(" ")] = 5
_POW_INT = np.array([10**i for i in range(19)], np.int64)
_POW_F = np.array([10.0**i for i in range(23)])  # exact
_CHUNK = 1 << 20  # bytes per chunk (whole tokens)


def parse_decimals(text: bytes) -> np.ndarray | None:
    """The numbers of ``text`` (tokens separated by single spaces, none at either end) as float64; None if a
    token has another form."""
    raw = np.frombuffer(text, np.uint8)
    if not raw.size:
        return np.empty(0)
    parts = []
    at = 0
    while at < raw.size:
        end = raw.size if raw.size - at <= _CHUNK else text.rfind(b" ", at, at + _CHUNK)
        if end <= at:
            end = text.find(b" ", at + _CHUNK)
            end = raw.size if end < 0 else end
        part = _parse(raw[at:end], text, at)
        if part is None:
            return None
        parts.append(part)
        at = end + 1
        if end < raw.size and at == raw.size:  # a trailing space
            return None
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _parse(b: np.ndarray, text: bytes, offset: int) -> np.ndarray | None:
    n = b.size
    cls = _CLASS[b]
    if not n or cls[0] == 5 or cls[-1] != 1 or (cls == 0).any():
        return None  # empty, a leading blank, a token not ending in a digit, a byte outside the form
    blank = np.flatnonzero(cls == 5)
    if blank.size and (np.diff(blank) == 1).any():
        return None  # two blanks together
    ntok = blank.size + 1
    starts = np.empty(ntok, np.int64)
    starts[0] = 0
    starts[1:] = blank + 1
    ends = np.empty(ntok, np.int64)  # one past each token's last byte
    ends[:-1] = blank
    ends[-1] = n
    prev = np.empty(n, np.uint8)
    prev[0] = 5
    prev[1:] = cls[:-1]
    nxt = np.empty(n, np.uint8)
    nxt[:-1] = cls[1:]
    nxt[-1] = 5
    minus = cls == 4
    if (minus & ~(((prev == 5) | (prev == 3)) & (nxt == 1))).any():
        return None  # '-' only first or after E, and before a digit
    dot, exp = cls == 2, cls == 3
    if ((dot | exp) & (prev != 1)).any() or (dot & (nxt != 1)).any() or (exp & (nxt != 1) & (nxt != 4)).any():
        return None  # '.' between digits, E after a digit and before a digit or '-'
    tokidx = np.cumsum(cls == 5, dtype=np.int32)  # the token of each byte
    dot_at = np.flatnonzero(dot)
    exp_at = np.flatnonzero(exp)
    dot_tok = tokidx[dot_at]
    exp_tok = tokidx[exp_at]
    if (np.diff(dot_tok) == 0).any() or (np.diff(exp_tok) == 0).any():
        return None  # two dots or two exponents in a token
    e_pos = ends.copy()  # where each token's mantissa ends
    e_pos[exp_tok] = exp_at
    d_pos = np.full(ntok, -1, np.int64)
    d_pos[dot_tok] = dot_at
    if (d_pos > e_pos).any():
        return None  # a '.' in the exponent
    digits = np.flatnonzero(cls == 1)
    dtok = tokidx[digits]
    in_mant = digits < e_pos[dtok]
    md, mtok = digits[in_mant], dtok[in_mant]
    cnt = np.bincount(mtok, minlength=ntok)
    if cnt.max() > 18:
        return _slow(text, offset, starts, ends)
    first = np.cumsum(cnt) - cnt
    rank = np.arange(md.size) - first[mtok]
    m = np.add.reduceat((b[md] - 48).astype(np.int64) * _POW_INT[cnt[mtok] - rank - 1], first)
    neg = cls[starts] == 4
    frac = np.where(d_pos >= 0, e_pos - d_pos - 1, 0)
    k = -frac
    if exp_at.size:
        ed, etok = digits[~in_mant], dtok[~in_mant]
        ecnt = np.bincount(etok, minlength=ntok)
        has = ecnt > 0
        if ecnt.max() > 6:
            return _slow(text, offset, starts, ends)
        efirst = np.cumsum(ecnt) - ecnt
        erank = np.arange(ed.size) - efirst[etok]
        ev = np.zeros(ntok, np.int64)
        ev[has] = np.add.reduceat((b[ed] - 48).astype(np.int64) * _POW_INT[ecnt[etok] - erank - 1], efirst[has])
        eneg = np.zeros(ntok, bool)
        eneg[exp_tok] = cls[exp_at + 1] == 4
        k += np.where(eneg, -ev, ev)
    exact = (m < 2**53) & (np.abs(k) <= 22)
    kk = np.where(exact, k, 0)
    mf = m.astype(np.float64)
    out = np.where(kk >= 0, mf * _POW_F[np.abs(kk)], mf / _POW_F[np.abs(kk)])
    if not exact.all():
        for i in np.flatnonzero(~exact).tolist():
            out[i] = abs(float(text[offset + starts[i] : offset + ends[i]]))
    return np.where(neg, -out, out)


def _slow(text: bytes, offset: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Tokens already known to be in the form, one by one (long mantissas or exponents)."""
    return np.array([float(text[offset + a : offset + z]) for a, z in zip(starts.tolist(), ends.tolist())])
