"""Angel's text formats: separators as Angel's reader splits lines (Java's ``String.split``, a regular
expression), finding the separator of a file, and the fields of a partition's lines as numbers."""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np

from ...errors import DataError, Location
from .java_text import parse_java

__all__ = ["detect_sep", "fields", "first_lines", "infer_sep", "java_split", "number_column", "readable_separator", "separator_pattern"]


def java_split(line: str, pattern: re.Pattern) -> list[str]:
    """Java's ``line.split(regex)`` (limit 0), as Angel's text readers split a line at the separator: no leading
    empty string for a zero-width match at the start, trailing empty strings removed."""
    out, index = [], 0
    for m in pattern.finditer(line):
        if index == 0 and m.start() == 0 and m.end() == 0:
            continue
        out.append(line[index : m.start()])
        index = m.end()
    if index == 0:
        return [line]
    out.append(line[index:])
    while out and out[-1] == "":
        out.pop()
    return out


def separator_pattern(sep: str) -> re.Pattern:
    """The regular expression Angel's reader splits at (``text.format.filed.sep`` is used as a Java regex)."""
    try:
        return re.compile(sep)
    except re.error as e:
        raise DataError(f"separator {sep!r} is not a regular expression (Angel's reader splits lines with String.split, "
                        f"which takes one): {e}") from None


_PROBES = [["10", "2", "-1.25E-7"], ["3", "40", "NaN"], ["5", "6", "-Infinity"], ["7", "89", "1234567.0"], ["0", "1", "-0.5"],
           ["11", "12", "\xfd"], ["1", "0", "-\x1e"]]


def readable_separator(sep: str) -> str | None:
    """Why Angel's reader (``line.split(sep)``, a regex) cannot split lines written with ``sep`` back into their
    fields; None if it can. Checked on lines of row ids, column ids and Java's number texts."""
    if not sep or "\n" in sep or "\r" in sep:
        return f"separator {sep!r}: Angel's lines end at a newline, the separator must be one or more other characters"
    try:
        pattern = re.compile(sep)
    except re.error as e:
        return f"Angel's reader splits lines at the regular expression {sep!r}, which Java rejects too ({e})"
    for fields in _PROBES:
        line = sep.join(fields)
        got = java_split(line, pattern)
        if got != fields:
            return (f"Angel's reader splits lines at the regular expression {sep!r} (String.split): {line!r} gives "
                    f"{len(got)} fields, not {len(fields)}; a separator without regex metacharacters works")
    return None


_NUMBER_CHARS = frozenset("0123456789+-.eEInfityNa\xfd\x1e")  # \xfd, \x1e: JDK 8 DecimalFormat NaN, infinity


def detect_sep(line: str) -> str:
    """The separator of an Angel text line: its first character that cannot be part of a number (',' if none)."""
    return next((ch for ch in line if ch not in _NUMBER_CHARS), ",")


_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")  # String.valueOf of an int or long: no leading zeros
_NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?(?:E-?[0-9]+)?|NaN|Infinity|\xfd|\x1e)")


def _splits(line: str, sep: str, fmt: str) -> bool:
    n_ids = 2 if fmt == "rowid-colid-value-text" else 1
    fields = line.split(sep)
    return (len(fields) >= n_ids + 1 and (fmt == "text-column" or len(fields) == n_ids + 1)
            and all(_INT.fullmatch(f) for f in fields[:n_ids]) and all(_NUMBER.fullmatch(f) for f in fields[n_ids:]))


def first_lines(data: bytes, k: int) -> list[str]:
    out, at = [], 0
    while len(out) < k and at < len(data):
        end = data.find(b"\n", at)
        end = len(data) if end < 0 else end
        out.append(data[at:end].decode("latin-1"))
        at = end + 1
    return out


def infer_sep(lines: list[str], fmt: str) -> str:
    """The separator of the lines of an Angel text format: the shortest text after the first line's leading id with
    which each of ``lines`` splits into the format's fields (ids as ``String.valueOf`` writes them, then numbers as
    Java does); ',' when none fits (the field count check then names the line). Any length: Angel's separator is a
    string (``text.format.filed.sep``)."""
    line = lines[0] if lines else ""
    m = _INT.match(line)
    if fmt == "value-text" or m is None:
        return ","
    rest = line[m.end():]
    for size in range(1, len(rest)):
        sep = rest[:size]
        if all(_splits(x, sep, fmt) for x in lines):
            return sep
    return detect_sep(line)


def fields(data: bytes, sep: str, n: int, path: str, expected: str, regex: bool = False) -> np.ndarray:
    """The lines of ``data`` split at ``sep`` into an (lines, n) table: float64 numbers when C's parser
    reads every field exactly (plain numbers, ints below 2^53), else byte strings; wrong field counts are errors.

    ``sep`` is a literal string, or with ``regex`` a regular expression applied as Java's ``String.split``
    (trailing empty fields dropped), the way Angel's reader splits; a literal separator whose lines do not split
    into ``n`` fields is tried that way too (a line ending in the separator is one Angel reads)."""
    if not data:
        return np.empty((0, n))
    body = data[:-1] if data.endswith(b"\n") else data
    sep_b = sep.encode("latin-1")
    if not sep_b:
        raise DataError("the separator is empty", Location(path))
    if not regex:
        raw = np.frombuffer(body, np.uint8)
        if len(sep_b) == 1:
            ends = np.concatenate([np.flatnonzero(raw == 10), [raw.size]])
            at = np.searchsorted(np.flatnonzero(raw == sep_b[0]), ends)  # separators before each line end
            per_line = np.diff(np.concatenate([[0], at])) + 1
        else:
            per_line = np.array([line.count(sep_b) + 1 for line in body.split(b"\n")])
        if (per_line == n).all():
            flat = body.replace(b"\n", sep_b) if n > 1 else body
            return _numbers(flat, body, sep_b, n, per_line.size)
    pattern = separator_pattern(sep if regex else re.escape(sep))
    tokens: list[bytes] = []
    for k, line in enumerate(body.decode("latin-1").split("\n")):
        fields = java_split(line, pattern)
        if len(fields) != n:
            how = f"separated by {sep!r}" + (" (a regular expression, as Angel's reader splits)" if regex else "")
            raise DataError(f"{len(fields)} fields {how}, {expected} expected", Location(path, k + 1))
        tokens += [f.encode("latin-1") for f in fields]
    return np.array(tokens, dtype=object).reshape(-1, n)


def _numbers(flat: bytes, body: bytes, sep_b: bytes, n: int, lines: int) -> np.ndarray:
    if b" " not in flat and b"\t" not in flat:  # C's parser, whitespace-separated (fields with blanks go the slow way)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                numbers = np.fromstring(flat.replace(sep_b, b" ").decode("latin-1"), sep=" ")
            except (ValueError, DeprecationWarning):
                numbers = None
        if numbers is not None and numbers.size == lines * n and not (np.isfinite(numbers) & (np.abs(numbers) >= 2.0**53)).any():
            return numbers.reshape(-1, n)
    tokens = flat.split(sep_b) if n > 1 else body.split(b"\n")
    return np.array(tokens, dtype=object).reshape(-1, n)


def number_column(tokens: np.ndarray, dtype: np.dtype, path: str, field: int) -> np.ndarray:
    """One field of every line as numbers: numpy's parser, then Java's names of NaN and infinity, then the line at
    fault. A number beyond the value type (``1e308`` for a float, ``2147483648`` for an int) is an error with its line,
    never an infinity or a wrapped integer."""
    native = dtype.newbyteorder("=")
    if tokens.dtype != np.float64:
        try:
            parsed = tokens.astype(bytes).astype(np.float64 if native.kind == "f" else np.int64) if tokens.size else np.empty(0, native)
        except (ValueError, OverflowError):
            parsed = None
        if parsed is None or native.kind in "iu":
            return _one_by_one(tokens, native, path, field) if parsed is None else _in_range(parsed, tokens, native, path, field)
        tokens = parsed
    if native.kind in "iu":  # parsed already: integers are exact below 2^53, floats round once
        whole = np.isfinite(tokens) & (tokens == np.floor(tokens)) & (np.abs(tokens) < 2.0**53)
        if not whole.all():
            k = int(np.flatnonzero(~whole)[0])
            raise DataError(f"field {field + 1} is not an integer: {float(tokens[k])!r}", Location(path, k + 1))
        return _in_range(tokens.astype(np.int64), tokens, native, path, field)
    with np.errstate(over="ignore"):
        out = tokens.astype(native)
    _finite(out, tokens, path, field)
    return out


def _in_range(values: np.ndarray, tokens: np.ndarray, native: np.dtype, path: str, field: int) -> np.ndarray:
    info = np.iinfo(native)
    bad = (values < info.min) | (values > info.max)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise DataError(f"field {field + 1}: {_text(tokens[k])} is beyond {native.name}", Location(path, k + 1))
    return values.astype(native)


def _finite(out: np.ndarray, source: np.ndarray, path: str, field: int) -> None:
    """A finite number that became infinite lies beyond the value type."""
    bad = ~np.isfinite(out) & np.isfinite(np.asarray(source, np.float64))
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise DataError(f"field {field + 1}: {_text(source[k])} is beyond {out.dtype.name}", Location(path, k + 1))


def _text(token: Any) -> str:
    """A field as the message shows it: its text, or an integer's digits (the fast path parsed the line already)."""
    if isinstance(token, bytes):
        return repr(token.decode("latin-1"))
    x = float(token)
    return repr(str(int(x))) if x == x and abs(x) < 2.0**63 and x == int(x) and abs(x) >= 2**31 else repr(x)


def _one_by_one(tokens: np.ndarray, native: np.dtype, path: str, field: int) -> np.ndarray:
    out = np.empty(tokens.size, np.int64 if native.kind in "iu" else np.float64)
    for k, tok in enumerate(tokens.tolist()):
        text = tok.decode("latin-1")
        try:
            out[k] = int(text) if native.kind in "iu" else parse_java(text)
        except OverflowError:
            raise DataError(f"field {field + 1}: {text!r} is beyond {native.name}", Location(path, k + 1)) from None
        except ValueError:
            what = "an integer" if native.kind in "iu" else "a number"
            raise DataError(f"field {field + 1} is not {what}: {text!r}", Location(path, k + 1)) from None
    if native.kind in "iu":
        return _in_range(out, tokens, native, path, field)
    with np.errstate(over="ignore"):
        result = out.astype(native)
    _finite(result, out, path, field)
    return result
