"""Java 8's number text (Float/Double.toString, DecimalFormat("#.######")) against a JDK's own output."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xser.storage.formats.java_text import decimal6, fd_digits, java_string, parse_java
from xser.storage.formats.java_vector import decimal6_chars, java_chars

DATA = Path(__file__).parent / "data" / "java_text"


def _cases() -> list[tuple[str, int, str]]:
    out = []
    for line in (DATA / "jdk17_compat.txt").read_text("utf-8").split("\n")[:-1]:
        value, java = line.split("\t")
        kind, bits = value.split()
        out.append((kind, int(bits, 16), java))
    return out


def _value(kind: str, bits: int) -> float:
    return float(np.array(bits, np.uint32 if kind == "f" else np.uint64).view(np.float32 if kind == "f" else np.float64))


def _strings(chars: np.ndarray, lengths: np.ndarray) -> list[str]:
    return [bytes(c[:n]).decode("latin-1") for c, n in zip(chars, lengths)]


def _angel_bytes(text: str) -> str:
    return text.translate({0xFFFD: 0xFD, 0x221E: 0x1E})


CASES = _cases()


def test_fixture_covers_the_quirks():
    texts = {java for _, _, java in CASES}
    assert "1.4E-45" in texts  # two digits in the E form, though "1.0E-45" is shorter
    assert "1.9999999999999998E23 199999999999999980000000" in texts  # interval ends excluded
    assert "-5.3647655E25" in texts  # long arithmetic wrapping around
    assert "NaN \ufffd" in texts and "-Infinity -\u221e" in texts
    assert sum(k == "f" for k, _, _ in CASES) > 1000 and sum(k == "d" for k, _, _ in CASES) > 1000


def test_exact_emulation_matches_the_jdk():
    bad = []
    for kind, bits, java in CASES:
        x = _value(kind, bits)
        got = java_string(x, True) if kind == "f" else f"{java_string(x, False)} {decimal6(x)}"
        if got != java:
            bad.append((kind, hex(bits), java, got))
    assert bad == []


def test_vectorised_matches_the_jdk():
    floats = [(bits, java) for kind, bits, java in CASES if kind == "f"]
    x = np.array([b for b, _ in floats], np.uint32).view(np.float32)
    assert _strings(*java_chars(x, True)) == [java for _, java in floats]
    doubles = [(bits, java) for kind, bits, java in CASES if kind == "d"]
    d = np.array([b for b, _ in doubles], np.uint64).view(np.float64)
    assert _strings(*java_chars(d, False)) == [java.split(" ")[0] for _, java in doubles]
    assert _strings(*decimal6_chars(d)) == [_angel_bytes(java.split(" ")[1]) for _, java in doubles]


def test_known_values():
    assert [java_string(x, True) for x in (1.5, 0.0, -2.25, 0.1, 1234567.0, 1e-7, 1e7, 1234567890.0, 3.4028235e38)] == [
        "1.5", "0.0", "-2.25", "0.1", "1234567.0", "1.0E-7", "1.0E7", "1.23456794E9", "3.4028235E38"]
    assert java_string(2e-3, False) == "0.002" and java_string(-0.0, False) == "-0.0"
    assert [decimal6(x) for x in (0.1, 5e-7, 1.5e-6, 2.5e-6, -1e-9, 0.0078125, 1e22)] == [
        "0.1", "0", "0.000002", "0.000003", "-0", "0.007812", "1" + "0" * 22]
    assert fd_digits(2e23, False) == ("19999999999999998", 24, False, False)


@settings(max_examples=300, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_java_float_text_reads_back(x):
    """Whatever the digits, Float.parseFloat gives the value back (Java's contract)."""
    text = java_string(x, True)
    assert np.float32(parse_java(text)) == np.float32(x)
    assert _strings(*java_chars(np.array([x], np.float32), True)) == [text]


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e7, max_value=1e7))
def test_decimal6_vectorised_equals_exact(x):
    assert _strings(*decimal6_chars(np.array([x]))) == [decimal6(x)]
    assert math.isclose(parse_java(decimal6(x)), x, abs_tol=5.000001e-7)


@pytest.mark.skipif(shutil.which("java") is None or shutil.which("javac") is None, reason="no JDK on the PATH")
def test_fresh_values_against_the_jdk(tmp_path):
    """New values each run (not the fixture): the JDK's own output decides."""
    version = subprocess.run(["java", "-version"], check=False, capture_output=True, text=True).stderr
    if any(f'version "{v}' in version for v in range(19, 40)):
        pytest.skip("JDK 19+ prints the shortest representation, not JDK 8's")
    rng = np.random.default_rng()
    fx = np.concatenate([rng.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                         (rng.standard_normal(3000) * 10.0 ** rng.integers(-8, 9, 3000)).astype(np.float32)])
    fx = fx[np.isfinite(fx)]
    dx = np.concatenate([rng.integers(0, 2**64, 3000, dtype=np.uint64).view(np.float64),
                         rng.integers(0, 10**7, 3000) / 1e7 + 5e-7, rng.standard_normal(3000)])
    dx = dx[np.isfinite(dx)]
    lines = [f"f {int(b):08x}" for b in fx.view(np.uint32)] + [f"d {int(b):016x}" for b in dx.view(np.uint64)]
    (tmp_path / "Oracle.java").write_text((DATA / "Oracle.java").read_text())
    subprocess.run(["javac", "-d", str(tmp_path), str(tmp_path / "Oracle.java")], check=True, capture_output=True)
    out = subprocess.run(["java", "-Djava.locale.providers=COMPAT", "-cp", str(tmp_path), "Oracle"], input="\n".join(lines) + "\n",
                         capture_output=True, check=True, encoding="utf-8").stdout.split("\n")[:-1]
    java_f, java_d = out[: fx.size], out[fx.size :]
    assert _strings(*java_chars(fx, True)) == java_f
    assert [f"{java_string(x, False)} {decimal6(x)}" for x in dx.tolist()] == java_d
    assert _strings(*decimal6_chars(dx)) == [_angel_bytes(j.split(" ")[1]) for j in java_d]
