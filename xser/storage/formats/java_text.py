"""Java 8's number text, exactly: ``Float.toString``, ``Double.toString`` and ``DecimalFormat("#.######")``.

Angel writes its text formats with these. JDK 8 to 18 print with ``sun.misc.FloatingDecimal``, which is
not the shortest representation (JDK 19 and later): it keeps every digit of integers below 2^63, it
excludes the ends of the rounding interval (``2e23`` prints as ``1.9999999999999998E23``), it narrows the
interval of powers of two on both sides, it always makes two digits in the ``E`` form (``1.4E-45``), and a
carry can leave a trailing zero. This module follows that digit generation step by step, from the
description of the algorithm (Steele and White's free-format method with JDK 8's tests), checked against
a JDK on generated values (``tests/test_java_text.py``, data in ``tests/data/java_text/``).

``DecimalFormat`` rounds those digits half-even to 6 decimals, using whether FloatingDecimal rounded up
and whether its digits are exact to settle ties on the binary value. JDK 8's default symbols (the JRE
locale data) are ``\\ufffd`` for NaN and ``\\u221e`` for infinity; Angel writes chars with
``writeBytes`` (the low byte), so the bytes are ``0xfd`` and ``0x1e``.

``java_vector`` does the same for arrays, vectorised, and falls back on this module where it cannot settle a value.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["INF_TEXT", "NAN_TEXT", "decimal6", "fd_digits", "java_string", "parse_java", "scales"]

NAN_TEXT = "\ufffd"  # JDK 8 DecimalFormatSymbols (JRE locale data) for NaN
INF_TEXT = "\u221e"

# (significand bits without the hidden one, exponent bits) of float and double
_LAYOUT = {True: (23, 8), False: (52, 11)}
_EXP_SHIFT = 52  # FloatingDecimal works on a 53-bit significand; floats are shifted up to it


def _n5bits(k: int) -> int:
    """Bits of 5**k as FloatingDecimal's table has them (0 for k = 0, 3 bits per power past the table)."""
    return (5**k).bit_length() if 0 < k < 27 else (0 if k == 0 else 3 * k)


def _insignificant(p2: int) -> int:
    """Decimal digits that 2**p2 makes insignificant: floor(p2 * log10(2)) for 1 < p2 < 64, else 0."""
    if not 1 < p2 < 64:
        return 0
    return len(str(1 << p2)) - 1


def _estimate_dec_exp(fract: int, bin_exp: int) -> int:
    """FloatingDecimal.estimateDecExp: floor of a double-precision estimate of log10 (same operations, same order)."""
    d2 = 1.0 + (fract & ((1 << 52) - 1)) / float(1 << 52)  # the significand as a double in [1, 2): exact
    d = (d2 - 1.5) * 0.289529654 + 0.176091259 + float(bin_exp) * 0.301029995663981
    return math.floor(d)


def _unpack(x: float, is_float: bool) -> tuple[bool, int, int, int]:
    """(negative, 53-bit significand with its top bit at 52, binary exponent, significant bits) of a finite non-zero."""
    frac_bits, exp_bits = _LAYOUT[is_float]
    if is_float:
        raw = int(np.float32(x).view(np.uint32))
        neg, e, f = bool(raw >> 31), (raw >> 23) & 0xFF, raw & ((1 << 23) - 1)
    else:
        raw = int(np.float64(x).view(np.uint64))
        neg, e, f = bool(raw >> 63), (raw >> 52) & 0x7FF, raw & ((1 << 52) - 1)
    bias = (1 << (exp_bits - 1)) - 1
    if e == 0:  # subnormal: normalise, and count its own significant bits
        shift = frac_bits + 1 - f.bit_length()
        f <<= shift
        e = 1 - shift
        nsig = f.bit_length() - shift
    else:
        f |= 1 << frac_bits
        nsig = frac_bits + 1
    return neg, f << (_EXP_SHIFT - frac_bits), e - bias, nsig


def scales(dec_exp: int, bin_exp: int, nfract: int, ntiny: int, nsig: int) -> tuple[int, ...]:
    """FloatingDecimal's powers of 5 and 2 in B (value), S (one unit of the first digit) and M (margin), and the
    width of the arithmetic it uses: 32 (int), 64 (long) or 0 (big integers); and the bits of 10 S."""
    b5 = max(0, -dec_exp)
    b2 = b5 + ntiny + bin_exp
    s5 = max(0, dec_exp)
    s2 = s5 + ntiny
    m5, m2 = b5, b2 - nsig
    b2 -= nfract - 1
    common = min(b2, s2)
    b2, s2, m2 = b2 - common, s2 - common, m2 - common
    if nfract == 1:  # a power of two: the margin is halved on both sides
        m2 -= 1
    if m2 < 0:
        b2, s2, m2 = b2 - m2, s2 - m2, 0
    bbits = nfract + b2 + _n5bits(b5)
    tens_bits = s2 + 1 + _n5bits(s5 + 1)
    # int (32-bit) or long (64-bit) arithmetic when FloatingDecimal's bit estimates allow it, with its
    # wrap-around (a long '(b << 1) - tens' overflows for some floats near 5e25: they round down); big
    # integers otherwise (JDK 8 may accept b + m == tens there, but no double or float reaches that case)
    width = (32 if bbits < 32 and tens_bits < 32 else 64) if bbits < 64 and tens_bits < 64 else 0
    return b5, b2, s5, s2, m5, m2, width, tens_bits


def fd_digits(x: float, is_float: bool) -> tuple[str, int, bool, bool]:
    """FloatingDecimal's (digits, decimal exponent, rounded up, exact) for a finite non-zero value.

    The value is ``0.<digits> * 10**exponent`` up to the rounding the digits carry.
    """
    _, fract, bin_exp, nsig = _unpack(x, is_float)
    tail = (fract & -fract).bit_length() - 1
    nfract = _EXP_SHIFT + 1 - tail  # significant bits of the significand
    ntiny = max(0, nfract - bin_exp - 1)  # bits below the binary point
    if -21 <= bin_exp <= 62 and ntiny == 0 and nfract + _n5bits(0) < 64:
        # an integer below 2**63: its digits, less those its precision makes insignificant (rounded half up)
        value = fract << (bin_exp - _EXP_SHIFT) if bin_exp >= _EXP_SHIFT else fract >> (_EXP_SHIFT - bin_exp)
        drop = _insignificant(bin_exp - nsig - 1) if bin_exp > nsig else 0
        if drop:
            p = 10**drop
            value, rest = divmod(value, p)
            value += rest >= p // 2
        text = str(value)
        digits = text.rstrip("0")
        return digits, len(text) + drop, False, False
    dec_exp = _estimate_dec_exp(fract, bin_exp)
    b5, b2, s5, s2, m5, m2, width, _ = scales(dec_exp, bin_exp, nfract, ntiny, nsig)
    fract >>= tail
    b = fract * 5**b5 << b2
    s = 5**s5 << s2
    m = 5**m5 << m2
    tens = 10 * s

    def wrap(v: int) -> int:
        if not width:
            return v
        v &= (1 << width) - 1
        return v - (1 << width) if v >> (width - 1) else v

    def tests(b: int, m: int, first: bool) -> tuple[bool, bool]:
        if width and not first and m <= 0:
            return True, True
        return b < m, wrap(b + m) > tens

    q, b = divmod(b, s)
    b = wrap(10 * b)
    m = wrap(10 * m)
    low, high = tests(b, m, True)
    digits = []
    if q == 0 and not high:
        dec_exp -= 1  # the estimate was one too high
    else:
        digits.append(q)
    if dec_exp < -3 or dec_exp >= 8:  # the E form: at least two digits
        low = high = False
    while not low and not high:
        q, b = divmod(b, s)
        b = wrap(10 * b)
        m = wrap(10 * m)
        low, high = tests(b, m, False)
        digits.append(q)
    exact = b == 0
    exponent = dec_exp + 1
    up = False
    diff = wrap(wrap(2 * b) - tens)  # (b << 1) - tens, in the path's own width
    if high and (not low or diff > 0 or (diff == 0 and digits[-1] % 2)):
        up = True
        i = len(digits) - 1
        while digits[i] == 9 and i > 0:
            digits[i] = 0
            i -= 1
        if digits[i] == 9:  # carry out of the first digit: 1 and a larger exponent, the rest stay
            digits[0] = 1
            exponent += 1
            up = False  # FloatingDecimal only flags the ordinary round-up
        else:
            digits[i] += 1
    return "".join(map(str, digits)), exponent, up, exact


def java_string(x: float, is_float: bool) -> str:
    """JDK 8's ``Float.toString`` (``is_float``) or ``Double.toString``."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    digits, e, _, _ = fd_digits(x, is_float)
    sign = "-" if x < 0 else ""
    n = len(digits)
    if 0 < e < 8:
        if n <= e:
            return f"{sign}{digits}{'0' * (e - n)}.0"
        return f"{sign}{digits[:e]}.{digits[e:]}"
    if -3 < e <= 0:
        return f"{sign}0.{'0' * -e}{digits}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{e - 1}"


def decimal6(x: float) -> str:
    """JDK 8's ``new DecimalFormat("#.######").format(x)`` for a double (default locale data, as Unicode)."""
    if math.isnan(x):
        return NAN_TEXT
    sign = "-" if math.copysign(1.0, x) < 0 else ""
    if math.isinf(x):
        return sign + INF_TEXT
    if x == 0:
        return sign + "0"
    digits, e, up, exact = fd_digits(x, False)
    digits = digits.rstrip("0")
    keep = e + 6  # digits left of the 6th decimal
    if keep < 0:
        return sign + "0"
    if keep < len(digits):
        nxt = digits[keep]
        if nxt > "5":
            round_up = True
        elif nxt < "5":
            round_up = False
        elif keep < len(digits) - 1:
            round_up = any(c != "0" for c in digits[keep + 1 :])
        elif up:  # the digits are above the value: the value is below the tie
            round_up = False
        elif not exact:  # the digits are below the value
            round_up = True
        else:
            round_up = keep > 0 and int(digits[keep - 1]) % 2 == 1
        digits = digits[:keep]
        if round_up:
            n = int(digits or "0") + 1
            if len(str(n)) > len(digits):
                e += 1
            digits = str(n)
        digits = digits.rstrip("0")
        if not digits:
            return sign + "0"
    whole = digits[:e] + "0" * (e - len(digits)) if e > 0 else ""
    frac = "0" * -e + digits if e < 0 else digits[e:]
    return f"{sign}{whole or '0'}" + (f".{frac}" if frac else "")


def parse_java(text: str) -> float:
    """A number as Java or DecimalFormat wrote it (``NaN``, ``Infinity``, ``\\ufffd``, ``\\u221e``, their bytes)."""
    t = text.replace("Infinity", "inf").replace(INF_TEXT, "inf").replace("\x1e", "inf")
    if t in (NAN_TEXT, "\xfd"):
        return float("nan")
    return float(t)
