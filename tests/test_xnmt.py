"""XNMT import and export against a model XNMT itself wrote (tests/data/xnmt/)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from helpers import returns_soon

import xser
from xser.cli import main
from xser.interop.xnmt import export_xnmt, import_xnmt, read_dynet_text, write_dynet_text

FIX = Path(__file__).parent / "data" / "xnmt" / "trained"
MOD = FIX / "tiny-train.mod"


@pytest.fixture
def imported(tmp_path):
    out = tmp_path / "m.yaml"
    import_xnmt(MOD, out)
    return out


class TestImport:
    def test_checkpoints_and_names(self, imported):
        """All three checkpoints come along (identical ones too); subcollection names are unchanged."""
        assert len(xser.checkpoints(imported)) == 3
        text = imported.read_text()
        assert "xser_subcol_name: MlpAttender-3b337990" in text and "xnmt_subcol_name" not in text
        assert "!Experiment" in text and "!SavedFormatString" in text
        params = [xser.read_params(imported, checkpoint=k) for k in range(3)]
        assert set(params[0]) == {p.name for p in (FIX / "tiny-train.mod.data").iterdir()}
        for sub in params[0]:
            for name in params[0][sub]:
                assert np.array_equal(params[0][sub][name], params[1][sub][name])  # .data == .data.1 in XNMT's files

    def test_refs_lose_the_sentinel(self, imported):
        """XNMT's !Ref {default: 1928437192847, name: null, path: p} becomes !Ref {path: p}."""
        text = imported.read_text()
        assert "1928437192847" not in text and "model: !Ref {path: model}" in text

    def test_dynet_layout_is_column_major(self, imported):
        """A {8,8} record is an (8, 8) array filled column by column; lookup tables keep DyNet's dims."""
        params = xser.read_params(imported)
        first_values = (FIX / "tiny-train.mod.data" / "MlpAttender-3b337990").read_text().split("\n")[1].split()
        w = params["MlpAttender-3b337990"]["_0"]
        assert w.shape == (8, 8) and w[1, 0] == np.float32(float(first_values[1]))
        assert params["SimpleWordEmbedder-76307c07"]["_0"].shape == (8, 73)

    def test_average_is_unchanged_by_import(self, imported, tmp_path):
        """Averaging the imported checkpoints gives the mean of XNMT's three files."""
        from xser.tools.average import average

        average(imported, tmp_path / "avg.yaml")
        avg = xser.read_params(tmp_path / "avg.yaml")["MlpAttender-3b337990"]["_0"]
        runs = [{r["name"]: r["array"] for r in read_dynet_text(str(FIX / d / "MlpAttender-3b337990"))}["_0"]
                for d in ("tiny-train.mod.data", "tiny-train.mod.data.1", "tiny-train.mod.data.2")]
        assert np.array_equal(avg, np.mean(np.stack(runs).astype(np.float64), axis=0).astype(np.float32))

    def test_convert_gives_fresh_xnmt_style_names(self, imported, tmp_path):
        """convert works on an imported model; names keep XNMT's '-' separator."""
        from xser.tools.convert import convert

        report = convert(imported, tmp_path / "c.yaml", checkpoint=2)
        new = report.renamed["MlpAttender-3b337990"]
        assert new.startswith("MlpAttender-") and len(new) == len("MlpAttender-3b337990") and new != "MlpAttender-3b337990"


class TestExport:
    def test_round_trip_is_byte_identical(self, imported, tmp_path):
        """Export after import gives exactly the files XNMT wrote: the .mod and every DyNet text file."""
        out = tmp_path / "back" / "tiny-train.mod"
        os.makedirs(out.parent)
        written = export_xnmt(imported, out)
        expected = sorted(str(p.relative_to(FIX)) for p in FIX.rglob("*") if p.is_file())
        assert sorted(str(Path(w).relative_to(out.parent)) for w in written) == expected
        for w in written:
            assert Path(w).read_bytes() == (FIX / Path(w).relative_to(out.parent)).read_bytes(), w

    def test_changed_names_write_a_new_spec(self, imported, tmp_path):
        """After convert (fresh names) the .mod is written from the spec, with xnmt_subcol_name."""
        from xser.tools.convert import convert

        convert(imported, tmp_path / "c.yaml")
        export_xnmt(tmp_path / "c.yaml", tmp_path / "c.mod")
        text = (tmp_path / "c.mod").read_text()
        assert "xnmt_subcol_name: MlpAttender-" in text and "MlpAttender-3b337990" not in text
        names = [p for p in os.listdir(tmp_path / "c.mod.data")]
        assert all(f"xnmt_subcol_name: {n}" in text for n in names)

    def test_dynet_writer_reader_round_trip(self):
        """write_dynet_text inverts read_dynet_text."""
        data = (FIX / "tiny-train.mod.data" / "UniLSTMSeqTransducer-4b9dfdad").read_bytes()
        import tempfile

        with tempfile.NamedTemporaryFile() as f:
            f.write(data)
            f.flush()
            assert write_dynet_text(read_dynet_text(f.name)) == data

    def test_cli(self, tmp_path, capsys):
        """xser import xnmt / xser export xnmt."""
        assert main(["import", "xnmt", str(MOD), str(tmp_path / "m.yaml")]) == 0
        assert "with 3 checkpoints" in capsys.readouterr().out
        assert main(["export", "xnmt", str(tmp_path / "m.yaml"), str(tmp_path / "x.mod")]) == 0
        assert (tmp_path / "x.mod").read_bytes() == MOD.read_bytes()


class TestBadDynet:
    @pytest.mark.parametrize("content, message", [
        (b"#Parameter# /A-00000000/_0 {2} 33 ZERO_GRAD\n+1.00000000e+00 +2.00000000e+00 \n", None),
        (b"#Parameter# /A-00000000/_0 {2} 34 ZERO_GRAD\n+1.00000000e+00 +2.00000000e+00 \n", ":1: byte count 34 does not match 2 values (33)"),
        (b"#Parameter# /A-00000000/_0 {3} 49 ZERO_GRAD\n+1.00000000e+00 +2.00000000e+00 \n", ":2: file ends inside the values of /A-00000000/_0"),
        (b"#Param /A/_0 {2} 33\n", ":1: not a DyNet record header: '#Param /A/_0 {2} 33'"),
        (b"#Parameter# /A-00000000/_0 {2} 33 ZERO_GRAD\n+1.00000000e+00             nan \n", ":2: /A-00000000/_0: non-finite value"),
    ])
    def test_records(self, tmp_path, content, message):
        """Byte counts, dimensions and values are checked; errors name file and line."""
        p = tmp_path / "A-00000000"
        p.write_bytes(content)
        if message is None:
            (rec,) = read_dynet_text(str(p))
            assert rec["array"].tolist() == [1.0, 2.0]
            return
        with pytest.raises(xser.DataError) as info:
            read_dynet_text(str(p))
        assert str(info.value) == f"{p}{message}"

    def test_missing_data(self, tmp_path):
        """A model without .data (XNMT then used random weights and exited 0) is refused."""
        (tmp_path / "x.mod").write_text("!Experiment {name: x}\n")
        with pytest.raises(xser.DataError, match="no .data directory beside the model"):
            import_xnmt(tmp_path / "x.mod", tmp_path / "m.yaml")


def test_yaml_11_meaning_is_kept(tmp_path):
    """When the original .mod text cannot be reused, the YAML means the same to PyYAML (YAML 1.1) as to xser:
    'no' stays a word, 1e-08 stays a float (PyYAML reads '1e-08' as a string)."""
    import yaml
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from xser.spec import dump, parse

    words = ["no", "No", "yes", "Y", "n", "on", "OFF", "~", "null", "1_000", "012", "0x1F", "12:30", "1.5", ".inf", "2024-01-02",
             "<<", "=", "plain", "0b101", "+1", "-.5", "1e5"]
    floats = [1e-08, 1e20, 0.1, -2.5, 3.0, 1e300, 5e-324, float("inf"), float("-inf"), 123456789.0]
    tree = {"vocab": words, "floats": floats, "eps": 1e-08}
    text = dump(tree, yaml11=True)
    back = yaml.safe_load(text)
    assert back["vocab"] == words and back["floats"] == floats and back["eps"] == 1e-08
    assert parse(text, "<t>").tree == tree  # and xser itself reads the same

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.one_of(st.text(max_size=6), st.floats(allow_nan=False), st.integers(-10**6, 10**6), st.booleans(), st.none()), max_size=6))
    def agree(values):
        assert yaml.safe_load(dump({"v": values}, yaml11=True))["v"] == values

    agree()


@pytest.mark.parametrize("victim, kind, what", [
    ("tiny-train.mod", "fifo", "XNMT model is not a regular file (a FIFO: never read, as it could block forever)"),
    ("data", "fifo", "DyNet data file is not a regular file (a FIFO: never read, as it could block forever)"),
    ("data", "dir", "DyNet data file is not a regular file (a directory: never read, as it could block forever)"),
])
def test_special_files_are_refused_not_waited_for(tmp_path, victim, kind, what):
    """A FIFO (or a directory) in place of the model file or a DyNet file is a DataError at once, never waited for."""
    import shutil

    src = tmp_path / "in"
    shutil.copytree(FIX, src)
    path = src / victim if victim != "data" else sorted((src / "tiny-train.mod.data").iterdir())[0]
    path.unlink()
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    result = returns_soon(lambda: import_xnmt(src / "tiny-train.mod", tmp_path / "m.yaml", durable=False))
    assert isinstance(result.get("error"), xser.DataError), result
    assert str(result["error"]) == f"{path}: {what}"


def test_export_of_checkpoints_saved_by_several_ranks(tmp_path):
    """Every checkpoint of a model saved by 3 ranks (rows of W in blocks) as DyNet text, imported back equal."""
    from reshard_model import Rows, save, w_rows

    path = save(str(tmp_path / "r.yaml"), 3, steps=2, make=Rows, blocks={"*/W": 4})
    export_xnmt(path, tmp_path / "x.mod")
    import_xnmt(tmp_path / "x.mod", tmp_path / "back.yaml")
    for k, step in ((0, 2), (1, 1)):
        (arrays,) = xser.read_params(tmp_path / "back.yaml", checkpoint=k).values()
        assert np.array_equal(arrays["W"], w_rows(step, 0, 23)) and np.array_equal(arrays["b"], np.arange(3, dtype=np.float32) + step)
