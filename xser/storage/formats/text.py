"""Text weight formats: ``dense-text`` and ``sparse-text`` (DiSMEC++'s layouts, exact by default).

One line per row (the first dimension; a vector is one value per line, a scalar one line).

- ``dense-text``: every value of the row, separated by one space. float32 values are written in
  a fixed-width scientific form, ``+1.23456791e+06`` (9 significant digits: every float32 reads
  back bit-exactly), by a vectorised formatter many times faster than ``np.savetxt``. Other
  float dtypes use ``repr`` (shortest round-trip). ``nan`` and ``inf`` are written as such.
- Both take ``precision`` (significant digits, ``%.{P}g`` as DiSMEC++ writes it): lossy below 9
  for float32, and written at Python speed; the default (None) is the exact form above.
- ``sparse-text``: ``index:value`` for each value whose magnitude exceeds ``threshold`` (default
  0: only +0.0 is left out, nothing is lost), each followed by a space; an all-zero row is an
  empty line. Indices are 0-based and ascending.

Reading checks every line: the right number of values (dense), indices in range and ascending
(sparse), numbers that parse. Errors name the file and line.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from ...errors import DataError, Location, shape_str
from ..fsutil import file_size
from ..checksums import CHECKSUMS, HashingWriter, digest_stream
from ..checksums import verify as check_digest
from ..pool import cpu_pool
from .whole import load_checked, load_checked_array
from .dismec_codec import dense_text
from .float_text import CHUNK_VALUES, _sparse_block, _sparse_fast, format_float32, parse_float32

__all__ = ["DENSE_TEXT", "SPARSE_TEXT", "format_float32"]

_DIGITS = np.frombuffer(b"0123456789", np.uint8)


def _special(x: float) -> str:
    """Text of a value, with the sign of nan kept (``repr`` drops it)."""
    if x != x:
        return "-nan" if math.copysign(1.0, x) < 0 else "nan"
    return repr(x)


def _g(x: float, precision: int) -> str:
    """``%.{P}g`` (C++ ``ostream`` with ``precision(P)``), with nan's sign kept."""
    return format(x, f".{precision}g") if x == x else _special(x)


def _check_precision(precision: Any) -> None:
    if precision is not None and (not isinstance(precision, int) or isinstance(precision, bool) or not 1 <= precision <= 17):
        raise DataError(f"precision must be an int from 1 to 17, got {precision!r}")


def _rows(shape: tuple) -> tuple[int, int]:
    if len(shape) == 0:
        return 1, 1
    return shape[0], math.prod(shape[1:]) if len(shape) > 1 else 1


def _as_rows(array: np.ndarray) -> np.ndarray:
    r, c = _rows(array.shape)
    return np.ascontiguousarray(array).reshape(r, c)


def _check_float(array: np.ndarray, path: str, name: str) -> None:
    if array.dtype.kind != "f":
        raise DataError(f"the {name} format stores floating-point arrays, not {array.dtype}", Location(path))


class _TextFormat:
    name = ""
    suffix = ".txt"
    limits = "floating-point arrays; a NaN is written as nan (its sign kept, its payload not)"

    def write(self, path: str, array: np.ndarray, known: Any = None, **options: Any) -> tuple[int, str]:
        _check_float(array, path, self.name)
        with HashingWriter(path) as w:
            for chunk in self._chunks(_as_rows(array), **options):
                w.write(chunk)
        return w.size, w.hexdigest()

    def digest(self, array: np.ndarray) -> tuple[int, str]:
        h = CHECKSUMS["xxh3_64"]()
        size = 0
        for chunk in self._chunks(_as_rows(array)):
            h.update(chunk)
            size += len(chunk)
        return size, h.hexdigest()

    def read(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, *, mmap: bool, verify: Any) -> np.ndarray:
        return self._read_data(load_checked(f, where, size, verify), where, dtype, shape)

    def _read_data(self, data: bytes, where: str, dtype: np.dtype, shape: tuple) -> np.ndarray:
        rows, cols = _rows(shape)
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        if len(lines) != rows:
            raise DataError(f"{len(lines)} lines, {rows} rows expected for shape {shape_str(shape)}", Location(where, min(len(lines), rows) + 1))
        out = self._parse(lines, rows, cols, dtype, where)
        return out.reshape(shape)

    def read_rows(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, rows: tuple[int, int], *, verify: Any) -> np.ndarray:
        if verify is not None:
            return self.read(f, where, dtype, shape, size, mmap=False, verify=verify)[rows[0] : rows[1]]
        first, stop = rows
        parts = []
        for line0, block in self._row_blocks(f, where, shape, size, max(1, stop - first), skip=first):
            parts.append(block)
            if line0 + len(block) >= stop:
                break
        n_rows, cols = _rows(shape)
        out = self._parse(_take(parts, stop - first), stop - first, cols, dtype, where, first)
        return out.reshape((stop - first,) + tuple(shape[1:]))

    def chunks(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, elements: int, verify: Any = None) -> Iterator[np.ndarray]:
        """Row bands of about ``elements`` values, parsed as the file is read (bounded memory).

        With ``verify`` the file's checksum is checked first (one more pass over the file, not its values)."""
        if verify is not None:
            f.seek(0)
            check_digest(verify, digest_stream(f, verify[0])[1], where)
        rows, cols = _rows(shape)
        step = max(1, elements // max(1, cols))
        seen = 0
        for line0, lines in self._row_blocks(f, where, shape, size, step):
            yield self._parse(lines, len(lines), cols, dtype, where, line0).reshape(-1)
            seen += len(lines)
        if seen != rows:
            raise DataError(f"{seen} lines, {rows} rows expected for shape {shape_str(shape)}", Location(where, seen + 1))

    def _row_blocks(self, f: BinaryIO, where: str, shape: tuple, size: int, step: int, skip: int = 0) -> Iterator[tuple[int, list[bytes]]]:
        """(first line index, lines) in groups of ``step`` lines, after skipping ``skip`` lines."""
        actual = file_size(f)
        if actual != size:
            raise DataError(f"file has {actual} bytes, manifest says {size} (truncated or replaced?)", Location(where))
        f.seek(0)
        rows, _ = _rows(shape)
        rest = b""
        line = 0
        pending: list[bytes] = []
        while True:
            piece = f.read(8 << 20)
            if not piece:
                break
            lines = (rest + piece).split(b"\n")
            rest = lines.pop()
            for ln in lines:
                if line >= skip:
                    pending.append(ln)
                    if len(pending) == step:
                        yield line - step + 1, pending
                        pending = []
                line += 1
                if line > rows:
                    raise DataError(f"more than {rows} lines for shape {shape_str(shape)}", Location(where, line))
        if rest:
            raise DataError("the last line has no newline", Location(where, line + 1))
        if pending:
            yield line - len(pending), pending


def _take(parts: list[list[bytes]], n: int) -> list[bytes]:
    out = [ln for p in parts for ln in p][:n]
    if len(out) != n:
        raise DataError(f"the file ends after {len(out)} of the {n} rows asked for")
    return out


def _number(token: bytes, path: str, line: int) -> float:
    try:
        return float(token)
    except ValueError:
        raise DataError(f"not a number: {token.decode('ascii', 'replace')!r}", Location(path, line)) from None


def _dense_rows(block: np.ndarray) -> bytes:
    """Dense text of float32 rows: values, spaces, a newline after each row."""
    flat = block.reshape(-1)
    finite = np.isfinite(flat)
    chars = format_float32(flat if finite.all() else np.where(finite, flat, 0).astype(np.float32))
    for i in np.flatnonzero(~finite):
        chars[i, :15] = np.frombuffer(_special(float(flat[i])).rjust(15).encode(), np.uint8)
    text = chars.reshape(block.shape[0], block.shape[1], 16)
    text[:, -1, 15] = ord("\n")
    return text.tobytes()


def _dense_fast(raw: np.ndarray, rows: int, cols: int) -> np.ndarray | None:
    """float32 rows in the form xser writes (``%+.8e``, one space between values, a newline after each row),
    ``rows * cols * 16`` bytes in a writable array (each row's newline is made a space here); None for any other form."""
    cells = raw.reshape(rows, cols, 16)
    if not (cells[:, -1, 15] == 10).all():
        return None
    cells[:, -1, 15] = 32
    out = parse_float32(cells.reshape(-1, 16), sep=32)
    cells[:, -1, 15] = 10
    return out


class DenseText(_TextFormat):
    name = "dense-text"

    def exact_for(self, array: np.ndarray, options: dict) -> bool:
        """Finite float32 at full precision is written as %+.8e: 9 significant digits read back exactly, so the
        writer's read-back check can be skipped (it is what made a save cost a load)."""
        return not options and array.dtype == np.float32 and bool(np.isfinite(array).all())

    def _chunks(self, rows: np.ndarray, precision: int | None = None, **options: Any):
        if options:
            raise DataError(f"dense-text takes only precision, got {sorted(options)}")
        _check_precision(precision)
        r, c = rows.shape
        if precision is not None:  # DiSMEC++'s lossy %.{P}g: one % over a batch of rows (value by value where a nan's sign is kept)
            for start in range(0, r, 4096):
                part = rows[start : start + 4096]
                if np.isnan(part).any():
                    yield "".join(" ".join(_g(x, precision) for x in row) + "\n" for row in part.tolist()).encode()
                else:
                    yield dense_text(part, precision)
        elif rows.dtype == np.float32 and c:
            step = max(1, CHUNK_VALUES // c)
            # format the next chunks on other threads while this one is written (numpy drops the GIL)
            pending: list = []
            starts = iter(range(0, r, step))
            for start in starts:
                pending.append(cpu_pool().submit(_dense_rows, rows[start : start + step]))
                if len(pending) > 2:
                    yield pending.pop(0).result()
            for fut in pending:
                yield fut.result()
        else:
            for start in range(0, r, 4096):
                yield "".join(" ".join(_special(x) for x in row) + "\n" for row in rows[start : start + 4096].tolist()).encode()

    def read(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, *, mmap: bool, verify: Any) -> np.ndarray:
        rows, cols = _rows(shape)
        if dtype == np.float32 and cols and size == 16 * rows * cols:  # maybe xser's own form: parsed in place, no lines
            raw = load_checked_array(f, where, size, verify)
            fast = _dense_fast(raw, rows, cols)
            if fast is not None:
                return fast.reshape(shape)
            return self._read_data(raw.tobytes(), where, dtype, shape)
        return super().read(f, where, dtype, shape, size, mmap=mmap, verify=verify)

    def _parse(self, lines: list[bytes], rows: int, cols: int, dtype: np.dtype, path: str, line0: int = 0) -> np.ndarray:
        if dtype == np.float32 and cols and all(len(line) == 16 * cols - 1 for line in lines):
            fast = _dense_fast(np.frombuffer(bytearray(b"\n".join(lines) + b"\n"), np.uint8), rows, cols)
            if fast is not None:
                return fast
        for i, line in enumerate(lines):
            n = len(line.split())
            if n != cols:
                raise DataError(f"{n} values on the line, {cols} expected", Location(path, line0 + i + 1))
        try:
            values = np.array(b" ".join(lines).split(), dtype=np.float64)
        except ValueError:
            for i, line in enumerate(lines):
                for tok in line.split():
                    _number(tok, path, line0 + i + 1)
            raise
        with np.errstate(over="ignore"):  # a value beyond the dtype becomes inf; importers then refuse it
            return values.astype(dtype)


class SparseText(_TextFormat):
    name = "sparse-text"

    def exact_for(self, array: np.ndarray, options: dict) -> bool:
        """Finite float32 at full precision and no threshold reads back exactly: no read-back check needed."""
        return not options and array.dtype == np.float32 and bool(np.isfinite(array).all())

    def _chunks(self, rows: np.ndarray, threshold: float = 0.0, precision: int | None = None, **options: Any):
        if options:
            raise DataError(f"sparse-text takes only threshold and precision, got {sorted(options)}")
        _check_precision(precision)
        if not (isinstance(threshold, (int, float)) and threshold >= 0 and math.isfinite(threshold)):
            raise DataError(f"sparse-text threshold must be a number >= 0, got {threshold!r}")
        f32 = rows.dtype == np.float32
        if precision is None and f32 and np.isfinite(rows).all():  # the common case, vectorised
            step = max(1, CHUNK_VALUES // max(1, rows.shape[1]))
            for start in range(0, rows.shape[0], step):
                yield _sparse_block(rows[start : start + step], threshold)
            return
        for start in range(0, rows.shape[0], 4096):
            out = []
            for row in rows[start : start + 4096]:
                # at threshold 0 only +0.0 is left out: -0.0 keeps its sign, nan is kept
                idx = np.flatnonzero(np.abs(row) > threshold) if threshold else np.flatnonzero((row != 0) | np.signbit(row))
                if precision is not None:
                    out.append("".join(f"{j}:{_g(float(row[j]), precision)} " for j in idx.tolist()) + "\n")
                elif f32 and idx.size and np.isfinite(row[idx]).all():
                    vals = format_float32(row[idx]).tobytes().decode()
                    out.append("".join(f"{j}:{vals[16 * k:16 * k + 16]}" for k, j in enumerate(idx.tolist())) + "\n")
                else:
                    out.append("".join(f"{j}:{_special(float(row[j]))} " for j in idx.tolist()) + "\n")
            yield "".join(out).encode()

    def _parse(self, lines: list[bytes], rows: int, cols: int, dtype: np.dtype, path: str, line0: int = 0) -> np.ndarray:
        with np.errstate(over="ignore"):  # a value beyond the dtype becomes inf; importers then refuse it
            return self._parse_lines(lines, rows, cols, dtype, path, line0)

    def _parse_lines(self, lines: list[bytes], rows: int, cols: int, dtype: np.dtype, path: str, line0: int) -> np.ndarray:
        if dtype == np.float32 and rows:
            out = np.empty((rows, cols), dtype)
            step = max(1, (CHUNK_VALUES // 4) // max(1, cols))  # bands of about a quarter million values: in cache
            for a in range(0, rows, step):
                band = _sparse_fast(lines[a : a + step], min(step, rows - a), cols, dtype)
                if band is None:
                    break
                out[a : a + step] = band
            else:
                return out
        out = np.zeros((rows, cols), dtype)  # anything else, or an error to locate: token by token
        for i, line in enumerate(lines):
            last = -1
            for tok in line.split():
                j, sep, v = tok.partition(b":")
                if not sep or not j.isdigit():
                    raise DataError(f"expected index:value, got {tok.decode('ascii', 'replace')!r}", Location(path, line0 + i + 1))
                j = int(j)
                if j >= cols:
                    raise DataError(f"index {j} is outside 0..{cols - 1}", Location(path, line0 + i + 1))
                if j <= last:
                    raise DataError(f"index {j} after {last}: indices must ascend", Location(path, line0 + i + 1))
                out[i, j] = _number(v, path, line0 + i + 1)
                last = j
        return out


DENSE_TEXT = DenseText()
SPARSE_TEXT = SparseText()


#: DiSMEC++'s default text precision (``SaveOption::Precision``)
DISMEC_PRECISION = 6


def g_precision(data: bytes, sparse: bool = False, prefer: int = DISMEC_PRECISION) -> int | None:
    """A precision P with which ``%.{P}g`` (C++ ``ostream << float`` after ``precision(P)``) writes every number of
    ``data`` (dense: whitespace-separated values; ``sparse``: ``index:value`` tokens) as it is; None without numbers.

    Each token bounds P: it needs at least its significant digits (and, written without an exponent, more than its
    exponent: ``100`` needs 3), and a token with an exponent from -4 up was written with P at most that exponent
    (``1e+03``: P <= 3). The result is ``prefer`` moved into those bounds: where a file allows it, DiSMEC++'s
    default 6, which every float32 read from the file writes back the same (FLT_DIG: 6 digits survive a float32,
    in its normal range); else, or when a value lies below that range (a subnormal keeps fewer digits), the
    smallest P the tokens need, which writes every float32 read from them back the same. Vectorised over the
    bytes, in chunks of whole lines.
    """
    lo, hi, seen, tiny = 1, 10**9, False, False
    at, step = 0, 1 << 21
    while at < len(data):
        end = data.find(b"\n", min(at + step, len(data)))
        end = len(data) if end < 0 else end + 1
        bounds = _token_bounds(np.frombuffer(data, np.uint8, end - at, at), sparse)
        at = end
        if bounds is not None:
            seen = True
            lo, hi, tiny = max(lo, bounds[0]), min(hi, bounds[1]), tiny or bounds[2]
    if not seen:
        return None
    return lo if tiny else max(lo, min(prefer, hi))


_CLASS = np.zeros(256, np.uint8)  # byte classes for _token_bounds
_CLASS[[32, 9, 10, 13]] = 1  # blank
_CLASS[ord("0")] = 2
_CLASS[ord("1") : ord("9") + 1] = 3
_CLASS[ord(".")] = 4
_CLASS[[ord("e"), ord("E")]] = 5
_CLASS[ord(":")] = 6


def _token_bounds(raw: np.ndarray, sparse: bool) -> tuple[int, int, bool] | None:
    """(lowest P the tokens need, highest P their exponents allow, whether one is below float32's normal range,
    1.18e-38) of the whitespace-separated numbers in ``raw``
    (their values after ':' if ``sparse``); None if there are none. Positions are byte offsets; a token's
    significant digits run from its first to its last non-zero mantissa digit (less a '.' between them)."""
    cls = _CLASS[raw]
    blank = cls == 1
    start = ~blank
    start[1:] &= blank[:-1]
    starts = np.flatnonzero(start)
    if not starts.size:
        return None
    end = ~blank
    end[:-1] &= blank[1:]
    ends = np.flatnonzero(end)
    n = starts.size
    if sparse:  # one ':' per token (the reader checked it): the value starts after it
        colons = np.flatnonzero(cls == 6)
        if colons.size != n:
            return None
        starts = colons + 1
    token_of = np.cumsum(start, dtype=np.int32) - 1  # the token of each byte (blanks: the one before)
    e_at = np.full(n, len(raw), np.int64)
    e_pos = np.flatnonzero(cls == 5)
    e_at[token_of[e_pos]] = e_pos
    dot_at = np.full(n, -1, np.int64)
    d_pos = np.flatnonzero(cls == 4)
    dot_at[token_of[d_pos]] = d_pos
    nz = np.flatnonzero(cls == 3)
    nz_tok = token_of[nz]
    keep = (nz < e_at[nz_tok]) & (nz >= starts[nz_tok])  # mantissa digits of the value
    nz, nz_tok = nz[keep], nz_tok[keep]
    first = np.full(n, -1, np.int64)
    last = np.full(n, -1, np.int64)
    if nz.size:
        change = np.flatnonzero(nz_tok[1:] != nz_tok[:-1])
        heads = np.concatenate([[0], change + 1])
        tails = np.concatenate([change, [nz.size - 1]])
        first[nz_tok[heads]] = nz[heads]
        last[nz_tok[tails]] = nz[tails]
    has = first >= 0
    k = np.where(has, last - first + 1 - ((dot_at > first) & (dot_at < last)), 0)
    sci = e_at < len(raw)
    whole_end = np.where(dot_at >= 0, dot_at, ends + 1)  # one past the integer part (fixed notation)
    fixed_need = np.where(has & (first < whole_end), whole_end - first, 0)
    need = np.where(sci, k, np.maximum(k, fixed_need))
    lo = int(need.max())
    hi, tiny = 10**9, False
    if sci.any():
        x = np.array([max(-999, min(999, int(raw[e + 1 : t + 1].tobytes()))) for e, t in zip(e_at[sci].tolist(), ends[sci].tolist())]
                     if sci.sum() < 64 else _exponents(raw, e_at[sci], ends[sci]), np.int64)
        bounded = x[x >= -4]
        if bounded.size:
            hi = int(bounded.min())
        tiny = bool((x < -37).any())
    return lo, hi, tiny


def _exponents(raw: np.ndarray, e_at: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The exponents after ``e_at`` (to ``ends``), vectorised for up to 3 digits; others one by one (clipped at 999)."""
    width = ends - e_at  # sign and digits
    out = np.zeros(e_at.size, np.int64)
    short = width <= 4
    for place in range(3):
        at = ends - place
        ok = short & (at > e_at) & (raw[np.minimum(at, len(raw) - 1)] >= 48) & (raw[np.minimum(at, len(raw) - 1)] <= 57)
        out[ok] += (raw[at[ok]].astype(np.int64) - 48) * 10**place
    out[short & (raw[np.minimum(e_at + 1, len(raw) - 1)] == 45)] *= -1
    for i in np.flatnonzero(~short).tolist():
        out[i] = max(-999, min(999, int(raw[e_at[i] + 1 : ends[i] + 1].tobytes())))
    return out
