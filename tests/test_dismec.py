"""DiSMEC++ import and export against files DiSMEC++ wrote (tests/data/dismec/)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

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
        export_dismec(tmp_path / "m.yaml", f"{name}/weights", tmp_path / "o" / "model.json", format="SparseTXT", precision=3, culling=0.2)
        assert (tmp_path / "o" / "model.json.weights").read_bytes() == b"0:1.5 2:-2.25 \n1:1.23e+06 \n"

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
