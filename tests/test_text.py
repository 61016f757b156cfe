"""Weight formats beyond npy: dense-text, sparse-text, user formats (xser/storage/formats/text.py, storage/formats/__init__.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import xser
from components import Linear
from strategies import bit_equal, leaf_of
from xser.storage.formats.text import DENSE_TEXT, SPARSE_TEXT, format_float32, parse_float32


@pytest.fixture(autouse=True)
def _forget_registered_formats():
    """Formats a test registers do not outlive it (they would change other tests' lists of known formats)."""
    from xser.storage import formats as fm
    from xser.storage.formats.external import EXTERNAL

    fm.get_format("dense-text")  # the built-in text and external formats join the table lazily, once: they stay
    before = set(fm.FORMATS) | set(EXTERNAL())
    yield
    for name in set(fm.FORMATS) - before:
        del fm.FORMATS[name]

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class TestFloat32Text:
    @settings(max_examples=200, deadline=None)
    @given(hnp.arrays(np.float32, st.integers(1, 50), elements=st.floats(width=32, allow_nan=False, allow_infinity=False)))
    def test_exact_and_equal_to_printf(self, values):
        """The vectorised formatter writes exactly C's %+.8e, and every float32 reads back bit-exactly."""
        chars = format_float32(values)
        text = chars.tobytes().decode()
        assert text == "".join(f"{float(v):+.8e} " for v in values)
        back = np.array([float(t) for t in text.split()], np.float32)
        assert bit_equal(back, values) or np.array_equal(back, values)  # -0.0 vs 0.0 are both kept: see below
        assert bit_equal(parse_float32(chars), values)

    def test_signed_zero_and_extremes(self):
        """-0.0, the smallest subnormal and the largest float32 survive."""
        v = np.array([-0.0, 0.0, 1e-45, -3.4028235e38, 1.17549435e-38], np.float32)
        assert bit_equal(parse_float32(format_float32(v)), v)


    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.sampled_from(list("+-0123456789.eE x")), min_size=15, max_size=15), st.integers(0, 14),
           st.floats(width=32, allow_nan=False, allow_infinity=False))
    def test_parser_takes_exactly_the_form(self, noise, at, x):
        """The word-arithmetic parser accepts exactly ``[+-]d.dddddddde[+-]dd`` (any other byte anywhere: None),
        and reads it as C does for every float32's own text (a value in between: within one float32 step)."""
        import re

        good = f"{float(np.float32(x)):+.8e}"
        for token in (good, good[:at] + noise[at] + good[at + 1 :], "".join(noise)):
            chars = np.frombuffer((token + " ").encode(), np.uint8).reshape(1, 16)
            got = parse_float32(np.repeat(chars, 3, axis=0))  # several rows: the words of each are separate
            if not re.fullmatch(r"[+-][0-9]\.[0-9]{8}e[+-][0-9]{2}", token):
                assert got is None, token
                continue
            want = np.float32(float(token)) if abs(float(token)) < 3.4e38 else np.float32(np.inf) * np.sign(float(token))
            if token == good:
                assert bit_equal(got, np.full(3, np.float32(x))), token
            elif np.isfinite(want):
                assert abs(float(got[0]) - float(want)) <= float(np.spacing(np.float32(abs(want)))), token

    def test_parser_exponent_range(self):
        """Exponents up to 99 either way parse (to 0 or inf beyond float32), not out of a table's range."""
        chars = np.frombuffer(b"+1.00000000e-99 -1.00000000e+99 +2.50000000e-45 -1.00000000e-46 ", np.uint8).reshape(4, 16)
        assert bit_equal(parse_float32(chars), np.array([0.0, -np.inf, 3e-45, -0.0], np.float32))


class TestFormatsInModels:
    @SETTINGS
    @given(
        arr=st.sampled_from([np.float32, np.float64]).flatmap(lambda dt: hnp.arrays(
            dt, hnp.array_shapes(min_dims=0, max_dims=3, max_side=5),
            elements=st.floats(allow_nan=False, width=32 if dt == np.float32 else 64) | st.sampled_from([np.nan, -np.nan]),
        )),
        fmt=st.sampled_from(["dense-text", "sparse-text"]),
        block=st.one_of(st.none(), st.integers(1, 4)),
    )
    def test_round_trip(self, tmp_path_factory, arr, fmt, block):
        """Any float array, in either text format, whole or in blocks, loads back bit-exactly (nan of either sign, inf too)."""
        path = str(tmp_path_factory.mktemp("t") / "m.yaml")
        leaf = leaf_of({"x": arr})
        xser.save(leaf, path, durable=False, formats={"*": fmt}, blocks={"*": block} if block else None)
        got = xser.params(xser.load(path, verify=True))["x"]
        assert got.dtype == arr.dtype and got.shape == arr.shape
        assert np.array_equal(got, arr, equal_nan=True) and np.array_equal(np.signbit(got), np.signbit(arr))

    def test_nan_payloads_are_refused_not_lost(self, tmp_path):
        """A value a format cannot hold exactly (a NaN payload in text) is refused at save time, naming the limits."""
        x = np.array([1.0, np.uint32(0x7FC0BEEF).view(np.float32)], np.float32)
        with pytest.raises(xser.DataError) as info:
            xser.save(leaf_of({"x": x}), tmp_path / "m.yaml", formats={"*": "dense-text"})
        assert str(info.value).endswith(
            "format 'dense-text' cannot store this array exactly: element (1,) is nan (bits 0x7fc0beef) and would read back as "
            "nan (bits 0x7fc00000) (dense-text stores floating-point arrays; a NaN is written as nan (its sign kept, its payload not))"
        )
        assert not (tmp_path / "m.yaml").exists()

    def test_declared_format_and_override(self, tmp_path):
        """A format declared with add(format=...) is used; save(formats=...) overrides it."""

        @xser.serializable(tag="!TSparseHolder")
        class Holder:
            n: int = 4

            def __attrs_post_init__(self):
                xser.params(self).add("w", (self.n, self.n), format="sparse-text", init=np.eye(self.n))

        try:
            h = Holder()
            name = xser.params(h).name
            xser.save(h, tmp_path / "a.yaml")
            assert (tmp_path / "a.yaml.data" / name / "w.txt").read_text().startswith("0:+1.00000000e+00 \n1:")
            xser.save(h, tmp_path / "b.yaml", formats={"*/w": "npy"})
            assert (tmp_path / "b.yaml.data" / name / "w.npy").exists()
            assert np.array_equal(xser.load(tmp_path / "a.yaml").__dict__["_xser_params"]["w"], np.eye(4))
        finally:
            from xser.model.registry import _unregister

            _unregister("!TSparseHolder")

    def test_sparse_threshold(self, tmp_path):
        """("sparse-text", {"threshold": t}) drops small values on purpose."""
        lin = Linear(3, 2)
        lin.W[...] = [[0.5, 0.001, -0.2], [0.0, 0.0, 0.0]]
        xser.save(lin, tmp_path / "m.yaml", formats={"*/W": ("sparse-text", {"threshold": 0.01})})
        w = xser.load(tmp_path / "m.yaml").W
        assert w.tolist() == [[0.5, 0.0, pytest.approx(-0.2)], [0.0, 0.0, 0.0]]
        name = xser.params(lin).name
        assert (tmp_path / "m.yaml.data" / name / "W.txt").read_text() == "0:+5.00000000e-01 2:-2.00000003e-01 \n\n"

    def test_manifest_records_the_format(self, tmp_path):
        """Loading never needs to be told: the manifest says the format of every file."""
        lin = Linear(3, 2)
        xser.save(lin, tmp_path / "m.yaml", formats={"*/W": "dense-text"})
        m = json.loads((tmp_path / "m.yaml.data" / "manifest.json").read_text())
        blocks = m["subcollections"][xser.params(lin).name]
        assert blocks["W"]["blocks"][0]["format"] == "dense-text" and blocks["b"]["blocks"][0]["format"] == "npy"

    def test_unknown_format(self, tmp_path):
        """An unknown format name suggests the closest one; nothing is written."""
        with pytest.raises(xser.DataError, match="unknown weight format 'dense_text' for '\\*/W'.*did you mean 'dense-text'"):
            xser.save(Linear(2, 2), tmp_path / "m.yaml", formats={"*/W": "dense_text"})
        assert not (tmp_path / "m.yaml").exists()
        with pytest.raises(xser.RegistryError, match="unknown weight format 'csv'"):
            xser.params(Linear(1, 1)).add("v", 2, format="csv")

    def test_integer_arrays_refused_by_text(self, tmp_path):
        """Text formats store floats; an int array in one is refused."""
        with pytest.raises(xser.DataError, match="stores floating-point arrays, not int64"):
            xser.save(leaf_of({"i": np.arange(3)}), tmp_path / "m.yaml", formats={"*": "dense-text"})


def read_file(fmt, p, *args, **kw):
    with open(p, "rb") as f:
        return fmt.read(f, str(p), *args, **kw)


class TestBadText:
    @pytest.mark.parametrize("fmt, content, shape, message", [
        (DENSE_TEXT, b"1 2 3\n4 5\n", (2, 3), ":2: 2 values on the line, 3 expected"),
        (DENSE_TEXT, b"1 2 3\n", (2, 3), ":2: 1 lines, 2 rows expected for shape (2, 3)"),
        (DENSE_TEXT, b"1 2 x\n4 5 6\n", (2, 3), ":1: not a number: 'x'"),
        # xser's own fixed width, one separator wrong: not read as two values
        (DENSE_TEXT, b"+1.00000000e+00x+2.00000000e+00\n", (1, 2), ":1: 1 values on the line, 2 expected"),
        (DENSE_TEXT, b"+1.00000000e+00 +2.00000000e+00 +3.00000000e+00\n", (1, 3), None),
        (SPARSE_TEXT, b"0:1 5:2 \n\n", (2, 3), ":1: index 5 is outside 0..2"),
        (SPARSE_TEXT, b"1:1 0:2 \n\n", (2, 3), ":1: index 0 after 1: indices must ascend"),
        (SPARSE_TEXT, b"1;1\n\n", (2, 3), ":1: expected index:value, got '1;1'"),
    ])
    def test_errors(self, tmp_path, fmt, content, shape, message):
        """Text files are checked line by line; errors name the file and line."""
        p = tmp_path / "x.txt"
        p.write_bytes(content)
        if message is None:  # the control: the same form, right
            assert read_file(fmt, p, np.dtype("f4"), shape, len(content), mmap=False, verify=None).tolist() == [[1, 2, 3]]
            return
        with pytest.raises(xser.DataError) as info:
            read_file(fmt, p, np.dtype("f4"), shape, len(content), mmap=False, verify=None)
        assert str(info.value) == f"{p}{message}"


class TestUserFormats:
    def test_register_and_use(self, tmp_path):
        """register_format adds a format; xser checksums its files and checks what it reads."""
        def writer(path, array):
            Path(path).write_bytes(array.astype("<f4").tobytes())

        def reader(path, dtype, shape):
            return np.frombuffer(Path(path).read_bytes(), "<f4").reshape(shape).astype(dtype)

        xser.register_format("raw-f4", reader, writer, suffix=".f4")
        lin = Linear(3, 2)
        xser.save(lin, tmp_path / "m.yaml", formats={"*/W": "raw-f4"})
        assert np.array_equal(xser.load(tmp_path / "m.yaml", verify=True).W, lin.W)
        with pytest.raises(xser.RegistryError, match="already registered"):
            xser.register_format("raw-f4", reader, lambda p, a: None)
        with pytest.raises(xser.RegistryError, match="already registered"):
            xser.register_format("npy", reader, writer)

    def test_bad_reader_result(self, tmp_path):
        """A reader that returns the wrong shape is caught with both shapes."""
        xser.register_format("bad-reader", lambda p, d, s: np.zeros(1), lambda p, a: Path(p).write_bytes(b"x"))
        with pytest.raises(xser.DataError, match=r"format 'bad-reader' read float64 \(1,\), the manifest says float32 \(2, 3\)"):
            xser.save(Linear(3, 2), tmp_path / "m.yaml", formats={"*/W": "bad-reader"})  # read back at once
        assert not (tmp_path / "m.yaml").exists()


class TestExternalFormats:
    @pytest.mark.parametrize("fmt", ["dynet-text", "value-binary", "colid-value-binary", "rowid-colid-value-binary", "value-text",
                                     "colid-value-text", "rowid-colid-value-text", "binary-column", "text-column"])
    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_any_parameter_in_any_format(self, tmp_path, fmt, dtype):
        """DyNet text and Angel's eight formats are rows of the format table: save, load, verify."""
        rng = np.random.default_rng(3)
        arr = (rng.standard_normal((5, 3)) * 1e3).astype(dtype)
        if fmt == "rowid-colid-value-text" and dtype == np.float64:
            arr = np.round(arr, 6)  # Angel writes doubles there with DecimalFormat("#.######")
        if fmt == "dynet-text" and dtype == np.float64:
            arr = arr.astype(np.float32).astype(np.float64)  # DyNet text has 9 significant digits
        leaf = leaf_of({"m": arr})
        xser.save(leaf, tmp_path / "m.yaml", formats={"*": fmt})
        got = xser.params(xser.load(tmp_path / "m.yaml", verify=True))["m"]
        assert got.dtype == arr.dtype and np.array_equal(got, arr)

    def test_angel_needs_a_matrix(self, tmp_path):
        """Angel formats store matrices: a vector is refused with what it is."""
        with pytest.raises(xser.DataError, match=r"value-text stores 2-D float32 or float64 matrices, got float32 \(3,\)"):
            xser.save(leaf_of({"v": np.zeros(3, np.float32)}), tmp_path / "m.yaml", formats={"*": "value-text"})


class TestOptionsAndPlugins:
    def test_precision(self, tmp_path):
        """precision=P writes DiSMEC++'s %.{P}g (lossy, on purpose)."""
        lin = Linear(3, 1)
        lin.W[...] = [[1.5, 1234567, 1e-7]]
        xser.save(lin, tmp_path / "m.yaml", formats={"*/W": ("dense-text", {"precision": 6})})
        name = xser.params(lin).name
        assert (tmp_path / "m.yaml.data" / name / "W.txt").read_text() == "1.5 1.23457e+06 1e-07\n"
        assert xser.load(tmp_path / "m.yaml").W[0, 1] == np.float32(1234570)
        with pytest.raises(xser.DataError, match="precision must be an int from 1 to 17, got 0"):
            xser.save(lin, tmp_path / "n.yaml", formats={"*/W": ("sparse-text", {"precision": 0})})

    def test_entry_point_formats(self, tmp_path, monkeypatch):
        """A package can add a format through the entry-point group xser.formats."""
        import importlib.metadata as md
        import types

        from xser.storage import formats as fm

        def writer(path, array):
            with open(path, "wb") as f:
                np.save(f, array)

        plugin = types.SimpleNamespace(reader=lambda path, dtype, shape: np.load(path).astype(dtype), writer=writer, suffix=".plug")
        ep = md.EntryPoint(name="plugged", value="plugin_mod:FORMAT", group="xser.formats")
        monkeypatch.setattr(md.EntryPoint, "load", lambda self: plugin)
        monkeypatch.setattr(md, "entry_points", lambda group=None: [ep] if group == "xser.formats" else [])
        monkeypatch.setattr(fm, "_ENTRY_POINTS_LOADED", False)
        monkeypatch.delitem(fm.FORMATS, "plugged", raising=False)
        lin = Linear(2, 2)
        xser.save(lin, tmp_path / "m.yaml", formats={"*/W": "plugged"})
        assert np.array_equal(xser.load(tmp_path / "m.yaml").W, lin.W)
        assert (tmp_path / "m.yaml.data" / xser.params(lin).name / "W.plug").exists()


class TestRoundTripOrRefuse:
    """Every format either gives back every value it accepts, bit for bit, or refuses it at save time."""

    CASES = [
        ("dynet-text", np.float32, np.nan, "reading it back fails"),
        ("dynet-text", np.float32, np.inf, "reading it back fails"),
        ("dynet-text", np.float64, 0.1, "element (0, 0) is 0.1 and would read back as 0.10000000149011612"),
        ("rowid-colid-value-text", np.float64, 0.1234567, "element (0, 0) is 0.1234567 and would read back as 0.123457"),
    ]

    def test_java_decimal_format_holds_infinities_and_large_values(self, tmp_path):
        """#.###### writes infinity as JDK 8 does (the low byte of its symbol) and every digit of 1e22: both read back."""
        x = np.array([[np.inf, -np.inf, 1e22, -1e300, 0.5]])
        xser.save(leaf_of({"x": x}), tmp_path / "m.yaml", formats={"*": "rowid-colid-value-text"})
        assert np.array_equal(xser.params(xser.load(tmp_path / "m.yaml"))["x"], x)

    @pytest.mark.parametrize("fmt, dtype, value, message", CASES)
    def test_refused_with_the_limits(self, tmp_path, fmt, dtype, value, message):
        """What a format cannot hold is refused before anything is published, naming the value and the limits."""
        x = np.array([[value, 1.0]], dtype)
        with pytest.raises(xser.DataError) as info:
            xser.save(leaf_of({"x": x}), tmp_path / "m.yaml", formats={"*": fmt})
        assert message in str(info.value) and f"({fmt} stores " in str(info.value)
        assert not (tmp_path / "m.yaml").exists()

    @pytest.mark.parametrize("fmt", ["dynet-text", "rowid-colid-value-text", "colid-value-text", "binary-column"])
    def test_what_is_accepted_comes_back(self, tmp_path, fmt):
        """Values inside the limits round-trip exactly (float32, signed zeros, extremes)."""
        f32 = np.finfo(np.float32)
        x = np.array([[f32.max, f32.min, f32.tiny, -0.0], [1e-45, 3.0, -2.5, 0.1]], np.float32)
        xser.save(leaf_of({"x": x}), tmp_path / "m.yaml", formats={"*": fmt})
        (sub,) = xser.read_params(tmp_path / "m.yaml").values()
        assert sub["x"].view(np.uint32).tolist() == x.view(np.uint32).tolist()


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_vectorised_sparse_text_is_printf(data):
    """The vectorised sparse-text writer gives exactly what per-value printf gives: indices of every width, -0.0,
    subnormals, empty rows, thresholds."""
    from xser.storage.formats.text import SPARSE_TEXT, _as_rows

    rows = data.draw(st.integers(0, 6))
    cols = data.draw(st.sampled_from([1, 9, 10, 11, 99, 101, 1234]))
    raw = data.draw(hnp.arrays(np.uint32, (rows, cols)))
    a = raw.view(np.float32).copy()
    a[~np.isfinite(a)] = 0
    a[np.random.default_rng(rows).random(a.shape) < 0.6] = 0
    threshold = data.draw(st.sampled_from([0.0, 1e-30, 0.5]))
    got = b"".join(SPARSE_TEXT._chunks(_as_rows(a), threshold=threshold))
    want = []
    for row in a:
        idx = np.flatnonzero(np.abs(row) > threshold) if threshold else np.flatnonzero((row != 0) | np.signbit(row))
        want.append("".join(f"{j}:{v:+.8e} " for j, v in zip(idx.tolist(), row[idx].tolist())) + "\n")
    assert got == "".join(want).encode()


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_vectorised_sparse_text_reader(data):
    """The fast reader gives the slow reader's matrix on what xser writes, and declines (falls back) on other spellings."""
    from xser.storage.formats.text import SPARSE_TEXT, _as_rows, _sparse_fast

    rows = data.draw(st.integers(1, 5))
    cols = data.draw(st.sampled_from([1, 10, 11, 123]))
    a = data.draw(hnp.arrays(np.uint32, (rows, cols))).view(np.float32).copy()
    a[~np.isfinite(a)] = 0
    a[np.random.default_rng(cols).random(a.shape) < 0.5] = 0
    text = b"".join(SPARSE_TEXT._chunks(_as_rows(a)))
    lines = text.split(b"\n")[:-1]
    got = SPARSE_TEXT._parse(lines, rows, cols, np.dtype(np.float32), "<t>")
    assert got.tobytes() == a.tobytes()
    other = [line.replace(b"e+", b"E+") for line in lines]  # another spelling: the fast path declines, the slow one reads it
    assert _sparse_fast(other, rows, cols, np.dtype(np.float32)) is None or not any(b"E+" in x for x in other)
    assert np.array_equal(SPARSE_TEXT._parse(other, rows, cols, np.dtype(np.float32), "<t>"), a)


class TestDynetTextBytes:
    @settings(max_examples=60, deadline=None)
    @given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=7),
                      elements=st.floats(width=32, allow_subnormal=True) | st.sampled_from([np.inf, -np.inf, -0.0])),
           st.booleans(), st.sampled_from([1, 5, 1 << 18]))
    def test_writer_is_printf_column_major(self, a, fortran, chunk):
        """DyNet text is each value as C's %+.8e and a space, column-major, in bands of any size, from C- or
        Fortran-ordered arrays; what it writes reads back bit for bit where every value is finite."""
        from unittest import mock

        from xser.storage.formats import dynet_codec

        a = np.asfortranarray(a) if fortran else a
        flag = "ZERO_GRAD"
        with mock.patch.object(dynet_codec, "CHUNK_VALUES", chunk):
            got = dynet_codec.write_dynet_text([{"kind": "Parameter", "key": "/s/W", "dims": list(a.shape), "array": a, "grad": flag}])
        values = "".join(f"{v:+.8e} " for v in a.reshape(-1, order="F").tolist()) + "\n"
        assert got == f"#Parameter# /s/W {{{','.join(map(str, a.shape))}}} {16 * a.size + 1} {flag}\n{values}".encode()
        if np.isfinite(a).all():
            (back,) = dynet_codec.parse_dynet_text(got, "x")
            assert bit_equal(np.ascontiguousarray(back["array"]), np.ascontiguousarray(a))


class TestAngelBinaryBands:
    @settings(max_examples=40, deadline=None)
    @given(st.sampled_from(["value-binary", "colid-value-binary", "rowid-colid-value-binary", "binary-column"]),
           st.sampled_from([np.float32, np.float64]).flatmap(lambda dt: hnp.arrays(
               dt, st.tuples(st.integers(1, 6), st.integers(1, 6)), elements=st.floats(width=32 if dt == np.float32 else 64)
               | st.just(-0.0))),
           st.sampled_from([1, 4, 1 << 18]))
    def test_bands_are_the_codecs_bytes(self, tmp_path_factory, name, a, band):
        """Written in bands of any size, a binary layout is byte for byte what the Angel codec encodes; it reads back bit
        for bit in bands (checksum checked), and a checksum that does not match is an error."""
        from unittest import mock

        from xser.storage.checksums import digest_bytes
        from xser.storage.formats import external

        fmt = external.EXTERNAL()[name]
        p = tmp_path_factory.mktemp("angel") / "x.bin"
        with mock.patch.object(external, "_BAND", band):
            size, digest = fmt.write(str(p), a)
            data = p.read_bytes()
            assert data == fmt.encode(str(p), a) and (size, digest) == (len(data), digest_bytes(data))
            back = read_file(fmt, p, a.dtype, a.shape, size, mmap=False, verify=("xxh3_64", digest))
            assert bit_equal(back, a)
            with pytest.raises(xser.DataError, match="checksum mismatch"):
                read_file(fmt, p, a.dtype, a.shape, size, mmap=False, verify=("xxh3_64", "0" * 16))

    @pytest.mark.parametrize("name", ["colid-value-binary", "rowid-colid-value-binary", "binary-column"])
    def test_ids_out_of_order_are_placed_by_id(self, tmp_path, name):
        """Records whose ids are not in xser's order go through the general reader, which places them by id."""
        from xser.storage.formats import external

        fmt = external.EXTERNAL()[name]
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        rec = np.frombuffer(fmt.encode("x", a), fmt._records(a.shape, 4)).copy()
        if name == "binary-column":
            rec = rec[::-1].copy()  # columns 2, 1, 0
        else:
            rec["c"] = rec["c"].reshape(2, 3)[:, ::-1].reshape(-1)  # columns listed backwards, values kept with them
            rec["v"] = rec["v"].reshape(2, 3)[:, ::-1].reshape(-1)
        p = tmp_path / "x.bin"
        p.write_bytes(rec.tobytes())
        assert bit_equal(read_file(fmt, p, np.dtype(np.float32), a.shape, p.stat().st_size, mmap=False, verify=None), a)



class TestSparseTextFullRows:
    @settings(max_examples=60, deadline=None)
    @given(hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.sampled_from([1, 9, 10, 11, 101])),
                      elements=st.floats(width=32, allow_nan=False, allow_infinity=False).filter(lambda x: x != 0) | st.just(-0.0)))
    def test_rows_keeping_every_value(self, a):
        """Rows that keep every value (index runs of 1, 2 and 3 digits) are printf's ``j:%+.8e `` tokens, and read back
        bit for bit; one index changed sends the file to the general reader, which names the line."""
        from xser.storage.formats.float_text import _sparse_block, _sparse_fast

        text = _sparse_block(a, 0.0)
        assert text == "".join("".join(f"{j}:{v:+.8e} " for j, v in enumerate(row)) + "\n" for row in a.tolist()).encode()
        lines = text.split(b"\n")[:-1]
        assert bit_equal(_sparse_fast(lines, *a.shape, np.dtype(np.float32)), a)
        if a.shape[1] > 1:
            bad = [lines[0].replace(b" 1:", b" 2:", 1)] + lines[1:]
            assert _sparse_fast(bad, *a.shape, np.dtype(np.float32)) is None
            with pytest.raises(xser.DataError, match="index 2 after 2: indices must ascend"):
                SPARSE_TEXT._parse(bad, *a.shape, np.dtype(np.float32), "x")
