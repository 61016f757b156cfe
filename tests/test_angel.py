"""Angel matrices: the eight formats and _meta, against the bytes in formats.md section 2.4."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from helpers import returns_soon

import xser
from strategies import leaf_of
from xser.cli import main
from xser.interop.angel import FORMATS, export_angel, import_angel, java_string, read_angel

W = np.array([[1.5, 0, -2.25], [0.1, 1234567, 1e-7]], np.float32)

# formats.md 2.4, the worked example (f32 row type)
EXPECTED = {
    "value-binary": bytes.fromhex("3fc00000 00000000 c0100000 3dcccccd 4996b438 33d6bf95"),
    "colid-value-binary": bytes.fromhex("00000000 3fc00000 00000001 00000000 00000002 c0100000 00000000 3dcccccd"
                                        "00000001 4996b438 00000002 33d6bf95"),
    "rowid-colid-value-binary": bytes.fromhex("00000000 00000000 3fc00000 00000000 00000001 00000000 00000000 00000002 c0100000"
                                              "00000001 00000000 3dcccccd 00000001 00000001 4996b438 00000001 00000002 33d6bf95"),
    "binary-column": bytes.fromhex("00000000 3fc00000 3dcccccd 00000001 00000000 4996b438 00000002 c0100000 33d6bf95"),
    "value-text": b"1.5\n0.0\n-2.25\n0.1\n1234567.0\n1.0E-7\n",
    "colid-value-text": b"0,1.5\n1,0.0\n2,-2.25\n0,0.1\n1,1234567.0\n2,1.0E-7\n",
    "text-column": b"0,1.5,0.1\n1,0.0,1234567.0\n2,-2.25,1.0E-7\n",
}
META = (b'{"matrixId":1,"matrixName":"w","formatClassName":"com.tencent.angel.model.output.format.ColIdValueTextRowFormat",'
        b'"rowType":7,"row":2,"col":3,"blockRow":2,"blockCol":3,"options":{"feature.index.range.end":"3","feature.index.range.start":"0"},'
        b'"partMetas":{"0":{"partId":0,"startRow":0,"endRow":2,"startCol":0,"endCol":3,"nnz":6,"saveRowNum":2,"saveColNum":0,'
        b'"saveColElemNum":0,"fileName":"0","offset":0,"length":47,"rowMetas":{"0":{"rowId":0,"offset":0,"elementNum":3,"saveType":0},'
        b'"1":{"rowId":1,"offset":0,"elementNum":3,"saveType":0}}}}}')


@pytest.fixture
def model(tmp_path):
    leaf = leaf_of({"w": W})
    xser.save(leaf, tmp_path / "m.yaml")
    return str(tmp_path / "m.yaml"), f"{xser.params(leaf).name}/w"


class TestFormats:
    @pytest.mark.parametrize("fmt", sorted(FORMATS))
    def test_bytes_and_round_trip(self, tmp_path, model, fmt):
        """Each format writes the worked example's bytes and reads back the matrix."""
        path, param = model
        written = export_angel(path, param, tmp_path / "out", format=fmt, matrix_name="w")
        data = (tmp_path / "out" / "w" / "0").read_bytes()
        if fmt in EXPECTED:
            assert data == EXPECTED[fmt]
        _, back = read_angel(tmp_path / "out" / "w")
        assert np.array_equal(back, W)
        assert written[-1].endswith("_meta")

    def test_meta_bytes(self, tmp_path, model):
        """_meta is a big-endian length and jettison's compact JSON, as in the worked example."""
        path, param = model
        export_angel(path, param, tmp_path / "out", format="colid-value-text", matrix_name="w")
        raw = (tmp_path / "out" / "w" / "_meta").read_bytes()
        assert raw == struct.pack(">i", len(META)) + META and raw[:4] == bytes.fromhex("0000021a")

    @pytest.mark.parametrize("fmt", sorted(FORMATS))
    def test_save_row_num(self, tmp_path, model, fmt):
        """Angel's ColumnFormat never sets saveRowNum: column formats say 0; row formats the partition's rows."""
        path, param = model
        export_angel(path, param, tmp_path / "out", format=fmt, matrix_name="w")
        meta = json.loads((tmp_path / "out" / "w" / "_meta").read_bytes()[4:])
        assert meta["partMetas"]["0"]["saveRowNum"] == (0 if fmt.endswith("column") else W.shape[0])
        assert np.array_equal(read_angel(tmp_path / "out" / "w")[1], W)

    def test_partitions_and_files(self, tmp_path):
        """Partitions of --block-rows rows; Angel's halving puts 6 partitions into files of 3 and 3 (not 5 and 1),
        files named by their first partition."""
        big = np.arange(24, dtype=np.float32).reshape(12, 2)
        leaf = leaf_of({"w": big})
        xser.save(leaf, tmp_path / "m.yaml")
        export_angel(tmp_path / "m.yaml", f"{xser.params(leaf).name}/w", tmp_path / "o", format="value-binary", matrix_name="w", block_rows=2)
        assert sorted(p.name for p in (tmp_path / "o" / "w").iterdir()) == ["0", "3", "_meta"]
        meta = json.loads((tmp_path / "o" / "w" / "_meta").read_bytes()[4:])
        assert [meta["partMetas"][str(k)]["offset"] for k in range(6)] == [0, 16, 32, 0, 16, 32]
        assert np.array_equal(read_angel(tmp_path / "o" / "w")[1], big)

    def test_import_and_tools(self, tmp_path, model):
        """xser import angel gives a model that loads, averages and exports again identically."""
        path, param = model
        export_angel(path, param, tmp_path / "out", format="binary-column", matrix_name="w")
        name = import_angel(tmp_path / "out" / "w", tmp_path / "a.yaml")
        assert np.array_equal(xser.load(tmp_path / "a.yaml").values, W)
        assert main(["export", "angel", str(tmp_path / "a.yaml"), f"{name}/values", str(tmp_path / "again"), "--format", "binary-column", "--name", "w"]) == 0
        assert (tmp_path / "again" / "w" / "0").read_bytes() == EXPECTED["binary-column"]

    def test_java_strings(self):
        """Java's Float/Double.toString: decimal between 1e-3 and 1e7, else computerized scientific."""
        cases = [(1.5, "1.5"), (0.0, "0.0"), (-0.0, "-0.0"), (1e7, "1.0E7"), (1e-3, "0.001"), (9.9e-4, "9.9E-4"),
                 (1234567.0, "1234567.0"), (1e-7, "1.0E-7"), (float("nan"), "NaN"), (float("-inf"), "-Infinity"), (100.0, "100.0")]
        for x, s in cases:
            assert java_string(x, True) == s, x
        assert java_string(0.1, False) == "0.1" and java_string(2e23, False) == "1.9999999999999998E23"  # JDK 8: ends excluded

    def test_large_offsets(self, tmp_path):
        """Row offsets past 2**31 work (Angel itself read them as int)."""
        d = tmp_path / "big"
        d.mkdir()
        offset = 2**31 + 8
        with open(d / "0", "wb") as f:
            f.seek(offset)
            f.write(EXPECTED["value-binary"])
        meta = json.loads(META)
        meta["formatClassName"] = "com.tencent.angel.model.output.format.ValueBinaryRowFormat"
        meta["partMetas"]["0"].update(offset=offset, length=24)
        body = json.dumps(meta).encode()
        (d / "_meta").write_bytes(struct.pack(">i", len(body)) + body)
        assert np.array_equal(read_angel(d)[1], W)


class TestBadInput:
    def write(self, tmp_path, meta_edit=None, data=EXPECTED["colid-value-text"], raw_meta=None):
        d = tmp_path / "m"
        d.mkdir()
        (d / "0").write_bytes(data)
        meta = json.loads(META)
        if meta_edit:
            meta_edit(meta)
        body = json.dumps(meta).encode()
        (d / "_meta").write_bytes(raw_meta if raw_meta is not None else struct.pack(">i", len(body)) + body)
        return d

    def test_truncated_partition(self, tmp_path):
        """A partition shorter than its recorded length is named with its offset."""
        d = self.write(tmp_path, data=EXPECTED["colid-value-text"][:30])
        with pytest.raises(xser.DataError, match=r"partition 0 is truncated: 30 of 47 bytes at offset 0"):
            read_angel(d)

    def test_length_prefix_too_large(self, tmp_path):
        """A _meta length prefix larger than the file is refused before parsing."""
        d = self.write(tmp_path, raw_meta=struct.pack(">i", 10_000) + b"{}")
        with pytest.raises(xser.DataError, match="_meta length prefix says 10000 bytes of JSON, the file has 2"):
            read_angel(d)

    def test_unknown_format_class(self, tmp_path):
        """An unknown formatClassName is refused (no reflection), with a suggestion."""
        d = self.write(tmp_path, lambda m: m.update(formatClassName="com.tencent.angel.model.output.format.ColIdValueTextRowFormatX"))
        with pytest.raises(xser.DataError, match="unknown formatClassName .* did you mean 'com.tencent.angel.model.output.format.ColIdValueTextRowFormat'"):
            read_angel(d)

    def test_bad_text_records(self, tmp_path):
        """Text records with the wrong number of fields or bad numbers name the file and line."""
        d = self.write(tmp_path, data=b"0,1.5\n1,0.0,7\n2,-2.25\n0,0.1\n1,1234567.0\n2,1.0E-7\n" + b" " * 0)
        d2 = tmp_path / "m"
        meta = json.loads(META)
        meta["partMetas"]["0"]["length"] = len((d2 / "0").read_bytes())
        body = json.dumps(meta).encode()
        (d2 / "_meta").write_bytes(struct.pack(">i", len(body)) + body)
        with pytest.raises(xser.DataError, match=r"0:2: 3 fields separated by ',', 2 expected"):
            read_angel(d)

    FORGED = [
        (lambda m: m.update(row=3000, col=3000), "partitions do not cover the matrix: blocks cover 6 of 9000000 elements"),
        (lambda m: m["partMetas"]["0"].update(endRow=3000, endCol=3000),
         "partition 0: rows 0-3000, cols 0-3000 lie outside the 2x3 matrix"),
        (lambda m: (m.update(row=4000, col=3000), m["partMetas"]["0"].update(endRow=4000, endCol=3000)),
         "partition 0: 47 bytes cannot hold its 4000x3000 values (colid-value-text needs at least 48000000)"),
        (lambda m: m.update(row=2**40, col=2**40), "partitions do not cover the matrix"),
        (lambda m: m["partMetas"]["0"].update(endRow=1), "partitions do not cover the matrix: blocks cover 3 of 6 elements"),
        (lambda m: m.update(partMetas={}), "no partitions: the 2x3 matrix has no data"),
        (lambda m: m.update(row="2"), "row must be an int >= 0, got '2'"),
        (lambda m: m["partMetas"]["0"].update(offset=-1), "partition 0: offset must be an int >= 0, got -1"),
        (lambda m: m["partMetas"]["0"].pop("rowMetas"), "0: 6 records, the row metadata says 0"),
        # a forged length: checked against the file before reading (it was a MemoryError) or allocating
        (lambda m: m["partMetas"]["0"].update(length=2**40), "0: partition 0 is truncated: 47 of 1099511627776 bytes at offset 0"),
        (lambda m: (m.update(row=2**17, col=2**17), m["partMetas"]["0"].update(endRow=2**17, endCol=2**17, length=2**40)),
         "0: partition 0 is truncated: 47 of 1099511627776 bytes at offset 0"),
        (lambda m: m["partMetas"]["0"].update(offset=40), "0: partition 0 is truncated: 7 of 47 bytes at offset 40"),
        (lambda m: m["partMetas"]["0"].update(fileName="1"), "1: partition 0: data file missing"),
        (lambda m: m["partMetas"]["0"]["rowMetas"]["1"].update(elementNum="3"), "rowMetas['1'].elementNum must be an int >= 0, got '3'"),
        (lambda m: m["partMetas"]["0"]["rowMetas"]["1"].update(rowId=0), "rowMetas list a row twice"),
    ]

    @pytest.mark.parametrize("edit, message", FORGED)
    def test_forged_sizes_are_checked_before_allocating(self, tmp_path, edit, message):
        """Declared dimensions and partitions are checked against the bytes present; a missing partition is an error."""
        d = self.write(tmp_path, edit)
        with pytest.raises(xser.DataError) as info:
            read_angel(d)
        assert message in str(info.value)

    def test_export_errors(self, tmp_path, model):
        """Unknown formats suggest the closest; non-float parameters are refused."""
        path, param = model
        with pytest.raises(xser.DataError, match="did you mean 'colid-value-text'"):
            export_angel(path, param, tmp_path / "o", format="colid-value-txt")


TEXT_FORMATS = ["value-text", "colid-value-text", "rowid-colid-value-text", "text-column"]


@pytest.mark.parametrize("sep", [",", " ", "\t", ";", "|", ":"])
@pytest.mark.parametrize("fmt", TEXT_FORMATS)
def test_any_separator_round_trips(tmp_path, sep, fmt):
    """Every separator Angel users pick reads back (it was ',' ' ' or tab only: ';' gave an all-zero matrix); as an
    xser weight format too, with no option needed on load."""
    w = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5) * 1.5
    leaf = leaf_of({"w": w})
    xser.save(leaf, tmp_path / "m.yaml", durable=False)
    if sep == "|" and fmt != "value-text":  # Angel's reader splits at the regex '|' (an empty alternative): between all chars
        with pytest.warns(UserWarning, match=r"^export angel: Angel's reader splits lines at the regular expression '\|'"):
            export_angel(tmp_path / "m.yaml", f"{xser.params(leaf).name}/w", tmp_path / "o", format=fmt, matrix_name="w", sep=sep, block_rows=2)
    else:
        export_angel(tmp_path / "m.yaml", f"{xser.params(leaf).name}/w", tmp_path / "o", format=fmt, matrix_name="w", sep=sep, block_rows=2)
    assert np.array_equal(read_angel(tmp_path / "o" / "w")[1], w)
    leaf2 = leaf_of({"w": w})
    xser.save(leaf2, tmp_path / "f.yaml", formats={"*": (fmt, {"sep": sep})}, durable=False)
    assert np.array_equal(xser.params(xser.load(tmp_path / "f.yaml"))["w"], w)


@pytest.mark.parametrize("line, message", [
    ("0,1.0", "2 fields separated by ',', a column id and 2 values expected"),
    ("0,1.0,2.0,3.0", "4 fields separated by ',', a column id and 2 values expected"),
    ("x,1.0,2.0", "field 1 is not an integer: 'x'"),
])
def test_text_column_field_counts_are_checked(tmp_path, line, message):
    """A text-column line with missing or extra fields is refused, with its line (it was read as zeros)."""
    w = np.ones((2, 3), np.float32)
    leaf = leaf_of({"w": w})
    xser.save(leaf, tmp_path / "m.yaml", durable=False)
    export_angel(tmp_path / "m.yaml", f"{xser.params(leaf).name}/w", tmp_path / "o", format="text-column", matrix_name="w")
    part = tmp_path / "o" / "w" / "0"
    lines = part.read_text().splitlines()
    lines[1] = line
    part.write_text("\n".join(lines) + "\n")
    meta_path = tmp_path / "o" / "w" / "_meta"
    meta = json.loads(meta_path.read_bytes()[4:])
    meta["partMetas"]["0"]["length"] = part.stat().st_size
    raw = json.dumps(meta, separators=(",", ":")).encode()
    meta_path.write_bytes(struct.pack(">i", len(raw)) + raw)
    with pytest.raises(xser.DataError) as info:
        read_angel(tmp_path / "o" / "w")
    assert str(info.value).endswith(f"0:2: {message}")


def write_meta(d, meta: dict) -> None:
    raw = json.dumps(meta, separators=(",", ":")).encode()
    (d / "_meta").write_bytes(struct.pack(">i", len(raw)) + raw)


def angel_dir(tmp_path, fmt="colid-value-text"):
    w = np.array([[0, 1.5, 0], [2.0, 0, 0]], np.float32)
    leaf = leaf_of({"w": w})
    xser.save(leaf, tmp_path / "m.yaml", durable=False)
    export_angel(tmp_path / "m.yaml", f"{xser.params(leaf).name}/w", tmp_path / "o", format=fmt, matrix_name="w")
    d = tmp_path / "o" / "w"
    return d, json.loads((d / "_meta").read_bytes()[4:])


def test_long_key_sparse_matrix_is_refused_before_allocating(tmp_path):
    """An LR-style matrix (1 row, 10^12 long-key columns, few non-zeros) is refused with a message, never a
    7 TiB allocation."""
    d, meta = angel_dir(tmp_path)
    meta.update(row=1, col=10**12, rowType=6)  # sparse, long keys
    meta["partMetas"]["0"].update(endRow=1, endCol=10**12)
    write_meta(d, meta)
    with pytest.raises(xser.DataError) as info:
        read_angel(d)
    assert "this 1x1000000000000 matrix is stored in" in str(info.value)
    assert "(a sparse long-key row type: an LR/FM-style model); refused before allocating" in str(info.value)


@pytest.mark.parametrize("fmt", ["value-binary", "value-text"])
def test_value_formats_on_sparse_row_types_are_refused(tmp_path, fmt):
    """value-* formats keep no column ids: on a sparse row type the values would land in the wrong columns."""
    d, meta = angel_dir(tmp_path, fmt)
    meta["rowType"] = 1 + 3  # a sparse float row type
    write_meta(d, meta)
    with pytest.raises(xser.DataError, match=f"{fmt} stores values without column ids, and rowType 4 is sparse"):
        read_angel(d)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_int64_values_and_long_ids_stay_exact(tmp_path, fmt):
    """Integer row types keep integers end to end (beyond 2^53 too), and long column ids are read as int64."""
    from xser.storage.formats.angel_codec import decode_partition, row_type

    vals = np.array([[2**62 + 1, -(2**53) - 1], [7, 2**63 - 1]], np.int64)
    cols = np.array([0, 1])
    long_ids = True
    vdtype = row_type(2 * 7 + 0)[0]  # int64 dense
    # build the partition bytes by hand (xser exports float matrices only): big-endian records
    if fmt == "binary-column":
        data = b"".join(np.array([c], ">i8").tobytes() + vals[:, c].astype(">i8").tobytes() for c in cols)
    elif fmt.endswith("binary"):
        fields = {"value-binary": [], "colid-value-binary": [("c", ">i8")], "rowid-colid-value-binary": [("r", ">i4"), ("c", ">i8")]}[fmt]
        rec = np.empty((2, 2), np.dtype(fields + [("v", ">i8")]))
        if "c" in rec.dtype.names:
            rec["c"] = cols[None, :]
        if "r" in rec.dtype.names:
            rec["r"] = np.arange(2)[:, None]
        rec["v"] = vals
        data = rec.tobytes()
    elif fmt == "text-column":
        data = "".join(f"{c},{vals[0, c]},{vals[1, c]}\n" for c in cols).encode()
    else:
        lines = []
        for r in range(2):
            for c in cols:
                lines.append({"value-text": f"{vals[r, c]}", "colid-value-text": f"{c},{vals[r, c]}",
                              "rowid-colid-value-text": f"{r},{c},{vals[r, c]}"}[fmt])
        data = ("\n".join(lines) + "\n").encode()
    pm = {"partId": 0, "startRow": 0, "endRow": 2, "startCol": 0, "endCol": 2, "saveColNum": 2, "saveColElemNum": 2,
          "rowMetas": {str(r): {"rowId": r, "elementNum": 2} for r in range(2)}}
    out = np.zeros((2, 2), np.int64)
    decode_partition(out, pm, data, fmt, vdtype, long_ids, str(tmp_path / "0"))
    assert out.tolist() == vals.tolist()


class TestSeparators:
    """Angel writes the separator (conf text.format.filed.sep) as it is and splits lines with String.split(sep): a regular
    expression, trailing empty fields dropped."""

    def export(self, tmp_path, fmt="colid-value-text", sep=","):
        w = np.array([[1.5, -2.0], [0.25, 1e-7]], np.float32)
        leaf = leaf_of({"w": w})
        xser.save(leaf, tmp_path / "m.yaml", durable=False)
        export_angel(tmp_path / "m.yaml", f"{xser.params(leaf).name}/w", tmp_path / "o", format=fmt, matrix_name="w", sep=sep)
        return w, tmp_path / "o" / "w"

    @pytest.mark.parametrize("sep", ["::", ", ", "<->", "\t\t", "ab", "0x"])
    @pytest.mark.parametrize("fmt", ["colid-value-text", "rowid-colid-value-text", "text-column"])
    def test_separators_of_several_characters(self, tmp_path, fmt, sep):
        """Found in the files with no option (it was the first non-number character only)."""
        w, d = self.export(tmp_path, fmt, sep)
        assert sep.encode() in (d / "0").read_bytes()
        assert np.array_equal(read_angel(d)[1], w)
        assert np.array_equal(read_angel(d, sep=sep)[1], w)

    def test_an_explicit_separator_is_a_regular_expression(self, tmp_path):
        """--sep on import is what Angel's reader takes: a regex; '[,;]' splits at either."""
        w, d = self.export(tmp_path)
        (d / "0").write_bytes((d / "0").read_bytes().replace(b"1,", b"1;", 1))
        assert np.array_equal(read_angel(d, sep="[,;]")[1], w)
        assert main(["import", "angel", str(d), str(tmp_path / "i.yaml"), "--sep", " *[,;] *"]) == 0
        assert np.array_equal(xser.load(tmp_path / "i.yaml").values, w)

    def test_a_metacharacter_separator_splits_as_java_does(self, tmp_path):
        """sep '|' is the regex of an empty alternative: Java splits between all characters, and so does the reader."""
        w, d = self.export(tmp_path)
        text = (d / "0").read_bytes().replace(b",", b"|")
        (d / "0").write_bytes(text)
        with pytest.raises(xser.DataError) as info:
            read_angel(d, sep="|")
        assert str(info.value).endswith("0:1: 5 fields separated by '|' (a regular expression, as Angel's reader splits), 2 expected")
        assert np.array_equal(read_angel(d, sep=r"\|")[1], w)
        assert np.array_equal(read_angel(d)[1], w)  # found in the file: the literal '|'

    def test_a_trailing_separator_is_read_as_angel_reads_it(self, tmp_path):
        """'0,1.5,' splits into 2 fields in Java (trailing empty strings are dropped)."""
        w, d = self.export(tmp_path)
        lines = (d / "0").read_bytes().split(b"\n")[:-1]
        data = b"".join(line + b",\n" for line in lines)
        (d / "0").write_bytes(data)
        _rewrite_length(d, len(data))
        assert np.array_equal(read_angel(d)[1], w)

    @pytest.mark.parametrize("sep, message", [
        ("|", "export angel: Angel's reader splits lines at the regular expression '|' (String.split): '10|2|-1.25E-7' gives "
              "13 fields, not 3; a separator without regex metacharacters works"),
        (".", "export angel: Angel's reader splits lines at the regular expression '.' (String.split): '10.2.-1.25E-7' gives "
              "0 fields, not 3; a separator without regex metacharacters works"),
        ("+", "export angel: Angel's reader splits lines at the regular expression '+', which Java rejects too (nothing to repeat "
              "at position 0)"),
        ("1", "export angel: Angel's reader splits lines at the regular expression '1' (String.split): '10121-1.25E-7' gives "
              "5 fields, not 3; a separator without regex metacharacters works"),
    ])
    def test_export_warns_of_separators_angel_cannot_read(self, tmp_path, sep, message):
        with pytest.warns(UserWarning) as record:
            self.export(tmp_path, "rowid-colid-value-text", sep)
        assert [str(r.message) for r in record] == [message]

    def test_bad_regex_on_import(self, tmp_path):
        _, d = self.export(tmp_path)
        with pytest.raises(xser.DataError) as info:
            read_angel(d, sep="(")
        assert str(info.value) == ("separator '(' is not a regular expression (Angel's reader splits lines with String.split, "
                                   "which takes one): missing ), unterminated subpattern at position 0")


def _rewrite_length(d, length):
    meta = json.loads((d / "_meta").read_bytes()[4:])
    meta["partMetas"]["0"]["length"] = length
    write_meta(d, meta)


def test_angel_layouts_come_back_byte_for_byte(tmp_path):
    """An Angel directory with partitions of rows and columns (range partitioning), three partitions in one file and one
    in another, rows 30-33 (rowMetas wrap around: 32, 33, 30, 31), matrixId 3, other options, a long-key float row type,
    ';' as separator: import, then export with no options gives every file back byte for byte."""
    from xser.storage.formats.angel_codec import encode_box, rowmetas_order

    w = np.arange(34 * 6, dtype=np.float32).reshape(34, 6) / 8 - 7
    d = tmp_path / "emb"
    d.mkdir()
    boxes = {0: (0, 30, 0, 4), 1: (0, 30, 4, 6), 2: (30, 34, 0, 4), 3: (30, 34, 4, 6)}
    files = {"0": [0, 1, 2], "3": [3]}
    parts = {}
    for fname, pids in files.items():
        blob = b""
        for pid in pids:
            r0, r1, c0, c1 = boxes[pid]
            data, metas, _, _ = encode_box(w, boxes[pid], "colid-value-text", np.dtype(">f4"), True, True, ";")
            parts[pid] = {"partId": pid, "startRow": r0, "endRow": r1, "startCol": c0, "endCol": c1, "nnz": (r1 - r0) * (c1 - c0),
                          "saveRowNum": r1 - r0, "saveColNum": 0, "saveColElemNum": 0, "fileName": fname, "offset": len(blob),
                          "length": len(data), "rowMetas": {str(r): {"rowId": r, "offset": len(blob), "elementNum": c1 - c0, "saveType": 0}
                                                            for r in rowmetas_order([r for r, _ in metas])}}
            blob += data
        (d / fname).write_bytes(blob)
    meta = {"matrixId": 3, "matrixName": "emb", "formatClassName": "com.tencent.angel.model.output.format.ColIdValueTextRowFormat",
            "rowType": 9, "row": 34, "col": 6, "blockRow": 30, "blockCol": 4,
            "options": {"feature.index.range.end": "6", "angel.ps.router.type": "range", "feature.index.range.start": "0"},
            "partMetas": {str(k): parts[k] for k in sorted(parts)}}
    assert list(parts[2]["rowMetas"]) == ["32", "33", "30", "31"]
    raw = json.dumps(meta, separators=(",", ":")).encode()
    (d / "_meta").write_bytes(struct.pack(">i", len(raw)) + raw)
    assert main(["import", "angel", str(d), str(tmp_path / "m.yaml")]) == 0
    assert np.array_equal(xser.load(tmp_path / "m.yaml").values, w)
    name = xser.params(xser.load(tmp_path / "m.yaml")).name
    assert main(["export", "angel", str(tmp_path / "m.yaml"), f"{name}/values", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out" / "emb").iterdir()) == ["0", "3", "_meta"]
    for f in ("0", "3", "_meta"):
        assert (tmp_path / "out" / "emb" / f).read_bytes() == (d / f).read_bytes(), f
    # an option given explicitly wins over the record: one partition per file, rows of 10
    assert main(["export", "angel", str(tmp_path / "m.yaml"), f"{name}/values", str(tmp_path / "o2"), "--block-rows", "10",
                 "--per-file", "1", "--format", "binary-column"]) == 0
    assert sorted(p.name for p in (tmp_path / "o2" / "emb").iterdir()) == ["0", "1", "2", "3", "_meta"]
    back = json.loads((tmp_path / "o2" / "emb" / "_meta").read_bytes()[4:])
    assert (back["rowType"], back["matrixId"], back["blockRow"]) == (9, 3, 10)
    assert np.array_equal(read_angel(tmp_path / "o2" / "emb")[1], w)


@pytest.mark.parametrize("victim, kind, what", [
    ("_meta", "fifo", "_meta is not a regular file (a FIFO: never read, as it could block forever)"),
    ("_meta", "dir", "_meta is not a regular file (a directory: never read, as it could block forever)"),
    ("0", "fifo", "partition 0: not a regular file"),
    ("0", "dir", "partition 0: not a regular file"),
])
def test_special_files_are_refused_not_waited_for(tmp_path, victim, kind, what):
    """A FIFO or a directory as _meta or a data file is a DataError at once, never waited for."""
    import os

    d, _ = angel_dir(tmp_path)
    (d / victim).unlink()
    os.mkfifo(d / victim) if kind == "fifo" else (d / victim).mkdir()
    result = returns_soon(lambda: read_angel(d))
    assert isinstance(result.get("error"), xser.DataError), result
    assert str(result["error"]) == f"{d / victim}: {what}"


def test_a_recorded_row_type_follows_the_values(tmp_path):
    """The recorded row type keeps its keys and density when the matrix's value type changed since the import
    (float32 sparse long keys, 12, becomes double sparse long keys, 5), instead of refusing the export."""
    w = np.array([[0, 1.5, 0], [2.0, 0, 0]], np.float32)
    leaf = leaf_of({"w": w})
    xser.save(leaf, tmp_path / "m.yaml", durable=False)
    export_angel(tmp_path / "m.yaml", f"{xser.params(leaf).name}/w", tmp_path / "o", format="colid-value-binary", matrix_name="w",
                 row_type=12)
    import_angel(tmp_path / "o" / "w", tmp_path / "i.yaml")
    layout = xser.checkpoints(tmp_path / "i.yaml")[0].training["angel_layout"]
    assert (layout["format"], layout["row_type"], layout["partitions"]) == ("colid-value-binary", 12, [[0, 0, 2, 0, 3, "0"]])
    leaf64 = leaf_of({"w": w.astype(np.float64)})
    xser.save(leaf64, tmp_path / "d.yaml", durable=False, training={"angel_layout": layout})
    export_angel(tmp_path / "d.yaml", f"{xser.params(leaf64).name}/w", tmp_path / "d")
    meta = json.loads((tmp_path / "d" / "w" / "_meta").read_bytes()[4:])
    assert meta["rowType"] == 5 and meta["formatClassName"].endswith("ColIdValueBinaryRowFormat")
    assert (tmp_path / "d" / "w" / "0").stat().st_size == 2 * (8 + 8)  # two non-zeros: long id and double each
    got = read_angel(tmp_path / "d" / "w")[1]
    assert got.dtype == np.float64 and np.array_equal(got, w)


@pytest.mark.parametrize("rt, value, message", [
    (7, "1e308", "field 3: 1e+308 is beyond float32"),
    (7, "-3.5E39", "field 3: -3.5e+39 is beyond float32"),
    (21, "2147483648", "field 3: '2147483648' is beyond int32"),
    (21, "-2147483649", "field 3: '-2147483649' is beyond int32"),
    (14, "9223372036854775808", "field 3: '9223372036854775808' is beyond int64"),
    (14, "1.5", "field 3 is not an integer: 1.5"),
])
def test_numbers_beyond_the_value_type_are_refused(tmp_path, rt, value, message):
    """A text value the row type cannot hold is an error with its line (1e308 became an infinity, and 2^31 a wrapped
    int32, with a numpy warning)."""
    from xser.storage.formats.angel_codec import row_type

    w = np.arange(6).reshape(2, 3).astype(row_type(rt)[0].newbyteorder("="))
    leaf = leaf_of({"w": w})
    xser.save(leaf, tmp_path / "m.yaml", durable=False)
    export_angel(tmp_path / "m.yaml", f"{xser.params(leaf).name}/w", tmp_path / "o", format="rowid-colid-value-text", matrix_name="w",
                 row_type=rt)
    d = tmp_path / "o" / "w"
    lines = (d / "0").read_bytes().split(b"\n")
    lines[4] = b"1,1," + value.encode()
    (d / "0").write_bytes(b"\n".join(lines))
    _rewrite_length(d, len(b"\n".join(lines)))
    with pytest.raises(xser.DataError) as info:
        read_angel(d)
    assert str(info.value) == f"{d / '0'}:5: {message}"


def test_export_of_a_matrix_saved_by_several_ranks(tmp_path):
    """W saved as the rows of 3 ranks (in blocks of 4 rows): the Angel matrix holds every row."""
    from reshard_model import Rows, save, w_rows

    path = save(str(tmp_path / "r.yaml"), 3, steps=2, make=Rows, blocks={"*/W": 4})
    (sub,) = xser.read_params(path)
    export_angel(path, f"{sub}/W", tmp_path / "out", format="value-binary", matrix_name="w")
    _, back = read_angel(tmp_path / "out" / "w")
    assert np.array_equal(back, w_rows(2, 0, 23))
