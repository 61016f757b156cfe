"""DiSMEC++ import and export against files DiSMEC++ wrote (tests/data/dismec/)."""

from __future__ import annotations

import json
import math
import os
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from helpers import returns_soon

import xser
from xser.cli import main
from xser.interop.dismec import export_dismec, import_dismec

DATA = Path(__file__).parent / "data" / "dismec"
FIXTURES = [("DenseTXT", "DenseTXT", 4096), ("SparseTXT", "SparseTXT", 4096), ("DenseNPY", "DenseNPY", 4096), ("split-DenseNPY", "DenseNPY", 2)]
DATE = '"date": "2026-11-22 - 22:06:14"'


def masked(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".json"):
        text = data.decode()
        start = text.index('"date": "')
        end = text.index('"', start + 9) + 1
        data = (text[:start] + DATE + text[end:]).encode()
    return data


class TestFixtures:
    @pytest.mark.parametrize("folder, fmt, split", FIXTURES)
    def test_import_then_export_is_byte_identical(self, tmp_path, folder, fmt, split):
        """Every fixture imports, and exporting it again gives DiSMEC++'s bytes (the date aside)."""
        name = import_dismec(DATA / folder / "model.json", tmp_path / "m.yaml")
        written = export_dismec(tmp_path / "m.yaml", f"{name}/weights", tmp_path / "out" / "model.json", format=fmt, split_files=split)
        produced = sorted(os.path.basename(w) for w in written)
        expected = sorted(p.name for p in (DATA / folder).iterdir())
        assert produced == expected
        for w in written:
            assert masked(Path(w)) == masked(DATA / folder / os.path.basename(w)), w

    def test_values(self, tmp_path):
        """The imported matrix is W = [[1.5, 0, -2.25], [0.1, 1234567, 1e-7]] (text at DiSMEC++'s 6 digits)."""
        import_dismec(DATA / "DenseNPY" / "model.json", tmp_path / "npy.yaml")
        w = xser.load(tmp_path / "npy.yaml").weights
        assert np.array_equal(w, np.array([[1.5, 0, -2.25], [0.1, 1234567, 1e-7]], np.float32))
        import_dismec(DATA / "DenseTXT" / "model.json", tmp_path / "txt.yaml")
        assert xser.load(tmp_path / "txt.yaml").weights[1, 1] == np.float32(1234570)  # 1.23457e+06

    def test_split_files_become_blocks(self, tmp_path):
        """DiSMEC++'s row files keep their ranges as blocks; row ranges load only what they need."""
        name = import_dismec(DATA / "split-DenseNPY" / "model.json", tmp_path / "m.yaml")
        m = json.loads((tmp_path / "m.yaml.data" / "manifest.json").read_text())
        blocks = m["subcollections"][name]["weights"]["blocks"]
        assert [(b["start"][0], b["shape"][0]) for b in blocks] == [(0, 2), (2, 2), (4, 1)]
        rows = xser.read_params(tmp_path / "m.yaml", rows={f"{name}/weights": (3, 5)})[name]["weights"]
        assert rows.tolist() == [[3.0, 3.25, 3.5], [4.0, 4.25, 4.5]]

    def test_tools_work_after_import(self, tmp_path):
        """An imported model is an xser model: inspect, convert and avg work on it."""
        import_dismec(DATA / "DenseNPY" / "model.json", tmp_path / "m.yaml")
        assert main(["inspect", str(tmp_path / "m.yaml")]) == 0
        assert main(["convert", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "c.yaml")]) == 0
        assert main(["avg", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "a.yaml")]) == 0
        assert np.array_equal(xser.load(tmp_path / "a.yaml").weights, xser.load(tmp_path / "m.yaml").weights)

    def test_precision_and_culling(self, tmp_path):
        """--precision 3 --culling 0.2 writes what DiSMEC++ writes with those options."""
        name = import_dismec(DATA / "DenseNPY" / "model.json", tmp_path / "m.yaml")
        with pytest.warns(UserWarning, match=r"^export dismec: precision 3 changes 1 of 6 values of model.json.weights \(label 1, "
                                             r"feature 1: 1234567.0 is written as 1.23e\+06\); 9 keep every float32 value$"):
            export_dismec(tmp_path / "m.yaml", f"{name}/weights", tmp_path / "o" / "model.json", format="SparseTXT", precision=3, culling=0.2)
        assert (tmp_path / "o" / "model.json.weights").read_bytes() == b"0:1.5 2:-2.25 \n1:1.23e+06 \n"

    @pytest.mark.parametrize("fmt, culling, message", [
        ("SparseTXT", -0.5, "culling must be a finite number >= 0, got -0.5"),
        ("SparseTXT", float("nan"), "culling must be a finite number >= 0, got nan"),
        ("DenseTXT", 0.2, "culling applies to SparseTXT only; this export writes DenseTXT"),
        (None, 0.2, "culling applies to SparseTXT only; this export writes DenseNPY"),  # the format recorded at import
    ])
    def test_culling_refused_where_it_would_be_ignored_or_meaningless(self, tmp_path, fmt, culling, message):
        name = import_dismec(DATA / "DenseNPY" / "model.json", tmp_path / "m.yaml")
        with pytest.raises(xser.DataError) as info:
            export_dismec(tmp_path / "m.yaml", f"{name}/weights", tmp_path / "o" / "model.json", format=fmt, culling=culling)
        assert info.value.message == message
        assert not (tmp_path / "o").exists()

    def test_cli(self, tmp_path, capsys):
        """xser import dismec / xser export dismec."""
        assert main(["import", "dismec", str(DATA / "SparseTXT" / "model.json"), str(tmp_path / "m.yaml")]) == 0
        name = capsys.readouterr().out.split("(parameter ")[1].split("/")[0]
        assert main(["export", "dismec", str(tmp_path / "m.yaml"), f"{name}/weights", str(tmp_path / "o" / "model.json"), "--format", "SparseTXT"]) == 0
        assert (tmp_path / "o" / "model.json.weights").read_bytes() == (DATA / "SparseTXT" / "model.json.weights").read_bytes()


def npy_bytes(a):
    import io

    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def broken(tmp_path, folder, meta_edit=None, weights=None):
    d = tmp_path / folder
    shutil.copytree(DATA / folder, d)
    meta = d / "model.json"
    if meta_edit is not None:
        m = json.loads(meta.read_text())
        meta_edit(m)
        meta.write_text(json.dumps(m))
    if weights is not None:
        (d / "model.json.weights").write_bytes(weights)
    return meta


class TestBadInput:
    CASES = [
        ("DenseTXT", lambda m: m.update(weights=m.pop("files")), None,
         'the weight files are listed under "weights", but DiSMEC++ reads "files" (its documentation is wrong)'),
        ("DenseTXT", lambda m: m["files"][0].update({"weight-format": "DenseTxt"}), None,
         "unknown weight-format 'DenseTxt' (known: DenseTXT, SparseTXT, DenseNPY); did you mean 'DenseTXT'?"),
        ("DenseTXT", lambda m: m["files"][0].update(count=1), None, "weight files cover 1 labels, num-labels is 2"),
        ("DenseTXT", lambda m: m["files"][0].update(first=1), None, "labels 0 to 0 are in no weight file (a checkpoint of an unfinished run? import the ranges present with --partial)"),
        ("DenseTXT", lambda m: m["files"][0].update(file="../x"), None, "weight file '../x' must be a path relative to the metadata file, inside its directory"),
        ("DenseTXT", None, b"1 nan 2\n0 0 0\n", "non-finite value 'nan'"),
        ("DenseTXT", None, b"1 2\n0 0 0\n", "2 values on the line, 3 expected"),
        ("DenseTXT", None, b"1 2 3\n", "1 rows, the metadata says 2"),
        ("SparseTXT", None, b"0:1 3:2 \n\n", "index 3 is outside 0..2"),
        ("SparseTXT", None, b"2:1 1:2 \n\n", "index 1 after 2: indices must ascend"),
        ("SparseTXT", None, b"0=1\n\n", "expected index:value, got '0=1'"),
        ("DenseNPY", None, npy_bytes(np.zeros((2, 3), "<f8")), "expected a C-order <f4 array of shape (2, 3), found <f8 (2, 3)"),
        ("DenseNPY", None, npy_bytes(np.zeros((3, 2), "<f4")), "expected a C-order <f4 array of shape (2, 3), found <f4 (3, 2)"),
        ("DenseNPY", None, npy_bytes(np.zeros((2, 3), "<f4"))[:-4], "file holds 20 data bytes, expected 24"),
        # a forged num-features: the dense array a sparse file would become is checked before allocating (it was 7 TiB)
        ("SparseTXT", lambda m: m.update({"num-features": 10**12}), None,
         "2 labels of 1000000000000 features in a SparseTXT file of 44 bytes would take 8000000000000 bytes as the dense "
         "matrix xser imports; refused before allocating (a very sparse model, or a wrong num-features)"),
        ("DenseTXT", lambda m: m.update({"num-features": 10**12}), None, "3 values on the line, 1000000000000 expected"),
        ("DenseNPY", lambda m: m.update({"num-features": 10**12}), None,
         "expected a C-order <f4 array of shape (2, 1000000000000), found <f4 (2, 3)"),
    ]

    @pytest.mark.parametrize("folder, edit, weights, message", CASES, ids=[c[3] for c in CASES])
    def test_table(self, tmp_path, folder, edit, weights, message):
        """Each bad DiSMEC++ file is a DataError naming the file (and line for text)."""
        meta = broken(tmp_path, folder, edit, weights)
        with pytest.raises(xser.DataError) as info:
            import_dismec(meta, tmp_path / "m.yaml")
        assert str(info.value).endswith(message), str(info.value)
        assert not (tmp_path / "m.yaml").exists()

    def test_text_errors_have_lines(self, tmp_path):
        """Text errors carry file:line."""
        meta = broken(tmp_path, "DenseTXT", weights=b"1 2 3\n0 inf 0\n")
        with pytest.raises(xser.DataError) as info:
            import_dismec(meta, tmp_path / "m.yaml")
        assert str(info.value) == f"{meta.parent / 'model.json.weights'}:2: non-finite value 'inf'"

    def test_export_errors(self, tmp_path):
        """Unknown parameters and formats, and non-matrices are refused."""
        name = import_dismec(DATA / "DenseNPY" / "model.json", tmp_path / "m.yaml")
        with pytest.raises(xser.DataError, match=rf"no parameter '{name}/weight'; did you mean '{name}/weights'"):
            export_dismec(tmp_path / "m.yaml", f"{name}/weight", tmp_path / "o.json")
        with pytest.raises(xser.DataError, match="did you mean 'SparseTXT'"):
            export_dismec(tmp_path / "m.yaml", f"{name}/weights", tmp_path / "o.json", format="SparseText")


class TestLayouts:
    def test_recorded_layout_comes_back(self, tmp_path):
        """An imported DiSMEC++ model exports to its own file names, ranges and formats (no options needed)."""
        src = DATA / "split-DenseNPY"
        name = import_dismec(src / "model.json", tmp_path / "m.yaml")
        written = export_dismec(tmp_path / "m.yaml", f"{name}/weights", tmp_path / "out" / "model.json", date="D")
        assert sorted(os.path.basename(p) for p in written) == sorted(p.name for p in src.iterdir())
        for p in src.iterdir():
            if p.name != "model.json":
                assert (tmp_path / "out" / p.name).read_bytes() == p.read_bytes(), p.name
        got, want = json.loads((tmp_path / "out" / "model.json").read_text()), json.loads((src / "model.json").read_text())
        assert {k: v for k, v in got.items() if k != "date"} == {k: v for k, v in want.items() if k != "date"}

    @pytest.mark.parametrize("ranges", [[(0, 2), (2, 1), (3, 2)], [(0, 1), (1, 4)], [(0, 5)]])
    def test_cli_names_and_unequal_ranges_round_trip(self, tmp_path, ranges):
        """train's naming (<meta>.weights-<first>-<last>, last inclusive) with any ranges: import then export gives the
        same files back."""
        w = np.arange(15, dtype=np.float32).reshape(5, 3) / 7
        from strategies import leaf_of

        leaf = leaf_of({"w": w})
        xser.save(leaf, tmp_path / "m.yaml", durable=False)
        first = export_dismec(tmp_path / "m.yaml", f"{xser.params(leaf).name}/w", tmp_path / "a" / "model.json", layout="cli",
                              ranges=ranges, date="D", format="SparseTXT")
        assert [os.path.basename(p) for p in first[:-1]] == [f"model.json.weights-{a}-{a + n - 1}" for a, n in ranges]
        name = import_dismec(tmp_path / "a" / "model.json", tmp_path / "b.yaml")
        again = export_dismec(tmp_path / "b.yaml", f"{name}/weights", tmp_path / "c" / "model.json", date="D")
        for p, q in zip(first, again):
            assert os.path.basename(p) == os.path.basename(q) and Path(p).read_bytes() == Path(q).read_bytes()

    def test_explicit_split_overrides_the_record(self, tmp_path):
        name = import_dismec(DATA / "split-DenseNPY" / "model.json", tmp_path / "m.yaml")
        written = export_dismec(tmp_path / "m.yaml", f"{name}/weights", tmp_path / "o" / "model.json", layout="split", split_files=4096)
        assert [os.path.basename(p) for p in written] == ["model.json.weights", "model.json"]

    @pytest.mark.parametrize("ranges, message", [
        ([(0, 2), (3, 2)], "ranges must be contiguous (first, count) pairs from label 0"),
        ([(0, 2)], "ranges cover 2 labels, the matrix has 5"),
    ])
    def test_bad_ranges(self, tmp_path, ranges, message):
        from strategies import leaf_of

        leaf = leaf_of({"w": np.zeros((5, 3), np.float32)})
        xser.save(leaf, tmp_path / "m.yaml", durable=False)
        with pytest.raises(xser.DataError) as info:
            export_dismec(tmp_path / "m.yaml", f"{xser.params(leaf).name}/w", tmp_path / "o" / "model.json", ranges=ranges)
        assert message in str(info.value)


class TestPartialImport:
    def checkpoint(self, tmp_path, ranges=((0, 2), (4, 1)), labels=6):
        """A metadata file with some label ranges missing, as DiSMEC++'s update_meta_file leaves it mid-training."""
        from strategies import leaf_of

        w = np.arange(labels * 3, dtype=np.float32).reshape(labels, 3) / 4
        leaf = leaf_of({"w": w})
        xser.save(leaf, tmp_path / "full.yaml", durable=False)
        export_dismec(tmp_path / "full.yaml", f"{xser.params(leaf).name}/w", tmp_path / "run" / "model.json", layout="cli",
                      ranges=[(0, 2), (2, 2), (4, 1), (5, 1)], date="D")
        meta = json.loads((tmp_path / "run" / "model.json").read_text())
        meta["files"] = [f for f in meta["files"] if (f["first"], f["count"]) in set(ranges)]
        (tmp_path / "run" / "model.json.checkpoint").write_text(json.dumps(meta, indent=4, sort_keys=True) + "\n")
        return w, tmp_path / "run" / "model.json.checkpoint"

    def test_refused_as_a_whole_without_partial(self, tmp_path):
        _, ck = self.checkpoint(tmp_path)
        with pytest.raises(xser.DataError) as info:
            import_dismec(ck, tmp_path / "m.yaml")
        assert str(info.value) == (f"{ck}: labels 2 to 3 are in no weight file (a checkpoint of an unfinished run? "
                                   "import the ranges present with --partial)")

    def test_ranges_present_are_imported_and_recorded(self, tmp_path):
        w, ck = self.checkpoint(tmp_path)
        assert main(["import", "dismec", str(ck), str(tmp_path / "m.yaml"), "--partial"]) == 0
        m = xser.load(tmp_path / "m.yaml")
        assert m.present == [[0, 2], [4, 1]] and np.array_equal(m.weights, np.concatenate([w[0:2], w[4:5]]))
        meta = xser.checkpoints(tmp_path / "m.yaml")[0].training
        assert meta["dismec_partial"] == {"present": [[0, 2], [4, 1]], "missing": [[2, 2], [5, 1]]}
        name = xser.params(m).name
        written = export_dismec(tmp_path / "m.yaml", f"{name}/weights", tmp_path / "again" / "model.json.checkpoint", date="D")
        back = json.loads(Path(written[-1]).read_text())
        assert back == json.loads(ck.read_text())  # same files, ranges and num-labels: DiSMEC++'s partial loader reads it
        for f in back["files"]:
            assert (tmp_path / "again" / f["file"]).read_bytes() == (tmp_path / "run" / f["file"]).read_bytes()


def _plain_model(tmp_path, w, name="m.yaml"):
    from strategies import leaf_of

    leaf = leaf_of({"w": w})
    xser.save(leaf, tmp_path / name, durable=False)
    return tmp_path / name, f"{xser.params(leaf).name}/w"


def _export_quietly(*args, **kwargs):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return export_dismec(*args, **kwargs)


class TestPrecision:
    """DiSMEC++'s metadata does not record the text precision: the import finds it, and auto export writes it again."""

    def test_nine_digit_files_come_back_byte_for_byte(self, tmp_path):
        """Files written with 9 digits re-export with 9 (it was %.6g: the values changed)."""
        w = np.array([[1.23456789, -0.000123456791, 7.0], [3.14159274, 1e-7, 123456792.0]], np.float32)
        model, param = _plain_model(tmp_path, w)
        first = export_dismec(model, param, tmp_path / "a" / "model.json", precision=9, date="D")
        assert (tmp_path / "a" / "model.json.weights").read_bytes() == b"1.23456788 -0.00012345679 7\n3.14159274 1.00000001e-07 123456792\n"
        name = import_dismec(tmp_path / "a" / "model.json", tmp_path / "b.yaml")
        assert xser.checkpoints(tmp_path / "b.yaml")[0].training["dismec_files"][0]["precision"] == 9
        again = export_dismec(tmp_path / "b.yaml", f"{name}/weights", tmp_path / "c" / "model.json", date="D")
        assert [Path(p).read_bytes() for p in again] == [Path(p).read_bytes() for p in first]
        assert np.array_equal(xser.load(tmp_path / "b.yaml").weights, w)

    @pytest.mark.parametrize("folder", ["DenseTXT", "SparseTXT"])
    def test_dismec_fixtures_are_found_at_six(self, tmp_path, folder):
        """The files DiSMEC++ wrote (its default precision 6) are recorded as 6 and come back without options."""
        name = import_dismec(DATA / folder / "model.json", tmp_path / "m.yaml")
        assert [f["precision"] for f in xser.checkpoints(tmp_path / "m.yaml")[0].training["dismec_files"]] == [6]
        written = export_dismec(tmp_path / "m.yaml", f"{name}/weights", tmp_path / "o" / "model.json")
        for w in written:
            assert masked(Path(w)) == masked(DATA / folder / os.path.basename(w)), w

    @settings(max_examples=40, deadline=None)
    @given(st.integers(1, 5), st.integers(1, 6), st.integers(1, 9), st.sampled_from(["DenseTXT", "SparseTXT"]),
           st.sampled_from([None, 1, 2]), st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.25]))
    def test_any_precision_round_trips(self, tmp_path_factory, labels, features, precision, fmt, split, seed, culling):
        """Any precision 1-9, both text formats, one or several files, with culling: import then auto export gives
        the same bytes."""
        tmp = tmp_path_factory.mktemp("p")
        culling = culling if fmt == "SparseTXT" else 0.0  # culling with a dense format is refused
        rng = np.random.default_rng(seed)
        w = (rng.standard_normal((labels, features)) * 10.0 ** rng.integers(-9, 10, (labels, features))).astype(np.float32)
        w[rng.random(w.shape) < 0.2] = 0
        model, param = _plain_model(tmp, w)
        first = _export_quietly(model, param, tmp / "a" / "model.json", precision=precision, format=fmt, date="D",
                                split_files=split or 4096, culling=culling)
        name = import_dismec(tmp / "a" / "model.json", tmp / "b.yaml")
        again = export_dismec(tmp / "b.yaml", f"{name}/weights", tmp / "c" / "model.json", date="D", culling=culling)
        assert [os.path.basename(p) for p in again] == [os.path.basename(p) for p in first]
        for p, q in zip(first, again):
            assert Path(p).read_bytes() == Path(q).read_bytes(), (precision, Path(p).read_bytes(), Path(q).read_bytes())

    def test_explicit_lower_precision_warns(self, tmp_path):
        """A precision lower than the imported files had (or than the float32 values need) warns, naming a value."""
        w = np.array([[1.23456789, 0.5], [3.14159274, 123456792.0]], np.float32)
        model, param = _plain_model(tmp_path, w)
        export_dismec(model, param, tmp_path / "a" / "model.json", precision=9, date="D")
        name = import_dismec(tmp_path / "a" / "model.json", tmp_path / "b.yaml")
        with pytest.warns(UserWarning) as record:
            export_dismec(tmp_path / "b.yaml", f"{name}/weights", tmp_path / "c" / "model.json", precision=6)
        assert [str(r.message) for r in record] == [
            "export dismec: precision 6 changes 3 of 4 values of model.json.weights (label 0, feature 0: 1.2345678806304932 is "
            "written as 1.23457); the imported file had 9 digits"]
        name = import_dismec(DATA / "DenseNPY" / "model.json", tmp_path / "n.yaml")
        with pytest.warns(UserWarning) as record:
            export_dismec(tmp_path / "n.yaml", f"{name}/weights", tmp_path / "d" / "model.json", precision=3, format="DenseTXT")
        assert [str(r.message) for r in record] == [
            "export dismec: precision 3 changes 1 of 6 values of model.json.weights (label 1, feature 1: 1234567.0 is "
            "written as 1.23e+06); 9 keep every float32 value"]

    def test_precision_that_keeps_the_values_does_not_warn(self, tmp_path):
        import warnings

        name = import_dismec(DATA / "DenseTXT" / "model.json", tmp_path / "m.yaml")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            export_dismec(tmp_path / "m.yaml", f"{name}/weights", tmp_path / "o" / "model.json", precision=6)
            export_dismec(tmp_path / "m.yaml", f"{name}/weights", tmp_path / "p" / "model.json", precision=9)


def _dismec_rule(labels: int, split: int) -> list[tuple[int, int, str]]:
    """save_model's files, transcribed from model-io.cpp (xmc-aalto/dismecpp 7cfb2b6c) statement by statement."""
    if labels < split:
        return [(0, labels, "m.weights")]
    num_files = math.floor(Fraction(labels, split) + Fraction(1, 2))  # std::round: halves away from zero
    out = []
    for sub in range(num_files):
        first = sub * split
        end = labels if sub == num_files - 1 else (sub + 1) * split
        end = min(end, labels)
        out.append((first, end - first, f"m.weights-{1 + sub}-of-{num_files}"))
    return out


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 3000), st.integers(1, 400))
def test_save_model_naming_rule(labels, split):
    """DiSMEC++'s rule: one '<meta>.weights' below split_files labels, else round(labels/split) files '-K-of-N'
    (halves round up), '-1-of-1' too; contiguous, all but the last of split_files labels."""
    from xser.interop.dismec import save_model_files

    files = save_model_files("m", labels, split)
    assert files == _dismec_rule(labels, split)
    assert [f for f, _, _ in files] == [sum(c for _, c, _ in files[:k]) for k in range(len(files))]
    assert sum(c for _, c, _ in files) == labels and all(c == split for _, c, _ in files[:-1])
    if labels >= split:
        assert len(files) == (2 * labels + split) // (2 * split) and files[0][2].endswith(f"-1-of-{len(files)}")


@pytest.mark.parametrize("labels, split, names", [
    (5, 4, ["model.json.weights-1-of-1"]),
    (4, 4, ["model.json.weights-1-of-1"]),
    (3, 4, ["model.json.weights"]),
    (6, 4, ["model.json.weights-1-of-2", "model.json.weights-2-of-2"]),
    (5, 2, ["model.json.weights-1-of-3", "model.json.weights-2-of-3", "model.json.weights-3-of-3"]),
])
def test_split_export_names(tmp_path, labels, split, names):
    """export with the split layout names files as save_model does (5 labels, split 4: '-1-of-1', it was '.weights')."""
    model, param = _plain_model(tmp_path, np.ones((labels, 2), np.float32))
    written = export_dismec(model, param, tmp_path / "o" / "model.json", split_files=split, layout="split", format="DenseNPY")
    assert [os.path.basename(p) for p in written] == [*names, "model.json"]


@pytest.mark.parametrize("victim, kind, what", [
    ("model.json", "fifo", "metadata file is not a regular file (a FIFO: never read, as it could block forever)"),
    ("model.json.weights", "fifo", "weight file is not a regular file (a FIFO: never read, as it could block forever)"),
    ("model.json.weights", "dir", "weight file is not a regular file (a directory: never read, as it could block forever)"),
    ("model.json", "dir", "metadata file is not a regular file (a directory: never read, as it could block forever)"),
])
@pytest.mark.parametrize("folder", ["DenseTXT", "DenseNPY"])
def test_special_files_are_refused_not_waited_for(tmp_path, folder, victim, kind, what):
    """A FIFO or a directory in place of the metadata or a weight file is a DataError at once (a FIFO blocked forever;
    a directory as metadata was an IsADirectoryError)."""
    d = tmp_path / "in"
    shutil.copytree(DATA / folder, d)
    (d / victim).unlink()
    os.mkfifo(d / victim) if kind == "fifo" else (d / victim).mkdir()
    result = returns_soon(lambda: import_dismec(d / "model.json", tmp_path / "m.yaml"))
    assert isinstance(result.get("error"), xser.DataError), result
    assert str(result["error"]) == f"{d / victim}: {what}"


@pytest.mark.parametrize("text, sparse, precision", [
    (b"1.5 0 -2.25\n0.1 1.23457e+06 1e-07\n", False, 6),  # DiSMEC++'s fixture: 1.23457e+06 bounds it to exactly 6
    (b"0:1.5 2:-2.25 \n0:0.1 1:1.23457e+06 2:1e-07 \n", True, 6),
    (b"0.5 1e+03\n", False, 3),  # 1e+03 was written with at most 3 digits
    (b"0.123456789 1\n", False, 9),
    (b"123456789 0\n", False, 9),  # written without an exponent: 9 digits at least
    (b"100 0\n", False, 6),  # 3 at least; 6 (DiSMEC++'s default) writes it the same
    (b"10.05 -0\n", False, 6),
    (b"1.5e-05 -2e-07\n", False, 6),  # exponents below -4 do not bound it
    (b"1.5e-04 2e+02\n", False, 2),
    (b"1.23456789e+08\n", False, 9),
    (b"0:-0.000123456 \n\n3:7 \n", True, 6),
    (b"", False, None),
    (b"\n\n", True, None),
])
def test_g_precision(text, sparse, precision):
    """The precision found in text written with %.{P}g: the tokens' bounds, DiSMEC++'s 6 where they allow it."""
    from xser.storage.formats.text import g_precision

    assert g_precision(text, sparse) == precision


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=30), st.integers(1, 9))
def test_g_precision_reproduces(values, precision):
    """Whatever the values, %.{found}g of the float32s read back writes the same text."""
    from xser.storage.formats.text import g_precision

    text = (" ".join(format(v, f".{precision}g") for v in values) + "\n").encode()
    found = g_precision(text)
    with np.errstate(over="ignore"):
        back = np.array(text.split(), np.float64).astype(np.float32)
    assume(np.isfinite(back).all())  # rounded past float32's largest: not a file DiSMEC++ (or the import) reads back
    assert (" ".join(format(float(v), f".{found}g") for v in back) + "\n").encode() == text


def test_export_of_a_matrix_saved_by_several_ranks(tmp_path):
    """W saved as the rows of 3 ranks (in blocks of 4 rows): exported whole, imported back equal."""
    from reshard_model import Rows, save, w_rows

    path = save(str(tmp_path / "r.yaml"), 3, steps=2, make=Rows, blocks={"*/W": 4})
    (sub,) = xser.read_params(path)
    export_dismec(path, f"{sub}/W", tmp_path / "dm" / "model.json", format="DenseNPY")
    name = import_dismec(tmp_path / "dm" / "model.json", tmp_path / "back.yaml")
    assert np.array_equal(xser.read_params(tmp_path / "back.yaml")[name]["weights"], w_rows(2, 0, 23))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 5), st.integers(0, 7), st.integers(1, 17), st.sampled_from([0.0, 0.5, 1e-30]), st.sampled_from([1, 3, 1 << 16]),
       st.sampled_from([np.float32, np.float64]), st.data())
def test_batched_text_is_value_by_value(rows, cols, precision, culling, batch, dtype, data):
    """DenseTXT and SparseTXT, formatted a batch of rows at a time, are byte for byte the value-by-value text
    (C's %.{P}g through Python's format), for any values: subnormals, huge and tiny exponents, -0.0, inf and nan."""
    from unittest import mock

    from hypothesis.extra import numpy as hnp

    from xser.storage.formats import dismec_codec as dc

    a = data.draw(hnp.arrays(dtype, (rows, cols), elements=st.floats(width=32 if dtype == np.float32 else 64, allow_subnormal=True)))
    g = lambda v: format(float(v), f".{precision}g")  # noqa: E731
    dense = "".join(" ".join(g(v) for v in row) + "\n" for row in a.tolist()).encode("ascii")
    sparse = "".join("".join(f"{j}:{g(v)} " for j, v in enumerate(row) if abs(v) > culling) + "\n" for row in a.tolist()).encode("ascii")
    with mock.patch.object(dc, "BATCH_VALUES", batch):
        assert dc.dense_text(a, precision) == dense
        assert dc.sparse_text(a, precision, culling) == sparse
