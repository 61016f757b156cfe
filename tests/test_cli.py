"""The command line: exit codes 0 / 1 (error: ...) / 2 (usage)."""

import subprocess
import sys
from pathlib import Path

import pytest

import xser
from components import Linear, Model, Norm
from xser.cli import main


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "m.yaml"
    m = Model(encoder=Linear(2, 3), decoder=Norm(3))
    xser.save(m, path, training={"step": 4})
    return m, str(path)


class TestInspect:
    def test_output(self, saved, capsys):
        """inspect shows the components, each subcollection's shapes, dtypes and bytes, and metadata."""
        m, path = saved
        assert main(["inspect", path]) == 0
        out = capsys.readouterr().out
        enc, dec = xser.params(m.encoder).name, xser.params(m.decoder).name
        assert f"model {path}" in out and "training: {'step': 4}" in out
        assert f"encoder: !TLinear [{enc}]" in out and f"decoder: !TNorm [{dec}]" in out
        assert f"  {enc}  (at encoder)" in out
        assert "    W  (3, 2)         float32           152 B" in out
        assert "running_mean  (3,)           float32           140 B  (not trainable)" in out
        assert "subcollections: 2, 4 params, 568 bytes on disk" in out

    def test_verify(self, saved, capsys):
        """--verify checks every checksum."""
        _, path = saved
        assert main(["inspect", path, "--verify"]) == 0
        assert "verified: 4 files match their checksums" in capsys.readouterr().out

    def test_verify_finds_corruption(self, saved, capsys):
        """A flipped byte makes --verify exit 1 with error: ..."""
        m, path = saved
        f = f"{path}.data/{xser.params(m.encoder).name}/W.npy"
        data = bytearray(Path(f).read_bytes())
        data[-2] ^= 1
        Path(f).write_bytes(bytes(data))
        assert main(["inspect", path, "--verify"]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: {f}: checksum mismatch: xxh3_64 ")

    def test_without_component_classes(self, saved, tmp_path):
        """inspect works in a fresh interpreter that never imported the component classes."""
        _, path = saved
        r = subprocess.run([sys.executable, "-m", "xser", "inspect", path], capture_output=True, text=True)
        assert r.returncode == 0 and "!TLinear" in r.stdout

    def test_missing_model(self, tmp_path, capsys):
        """A missing file: exit 1 and one error line."""
        assert main(["inspect", str(tmp_path / "nope.yaml")]) == 1
        assert capsys.readouterr().err == f"error: {tmp_path / 'nope.yaml'}: file not found\n"

    def test_debug_raises(self, tmp_path):
        """--debug shows the traceback instead."""
        with pytest.raises(xser.SpecError):
            main(["--debug", "inspect", str(tmp_path / "nope.yaml")])


class TestUsage:
    @pytest.mark.parametrize("argv", [[], ["bogus"], ["inspect"], ["demo"], ["inspect", "a", "--nope"]])
    def test_usage_errors_exit_2(self, argv):
        """Usage errors exit 2."""
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2

    def test_version(self, capsys):
        """--version prints the version."""
        with pytest.raises(SystemExit) as info:
            main(["--version"])
        assert info.value.code == 0 and capsys.readouterr().out.strip() == f"xser {xser.__version__}"


class TestDemo:
    def test_demo_runs(self, tmp_path, capsys):
        """xser demo trains, saves, loads and evaluates; the loaded model predicts identically."""
        assert main(["demo", str(tmp_path / "out")]) == 0
        out = capsys.readouterr().out
        assert "predictions identical: yes" in out
        assert (tmp_path / "out" / "demo.yaml").exists()
        assert main(["inspect", str(tmp_path / "out" / "demo.yaml")]) == 0

    def test_demo_unknown_experiment(self, tmp_path, capsys):
        """An unknown experiment name exits 1 and lists the ones there are."""
        assert main(["demo", str(tmp_path), "--experiment", "nope"]) == 1
        assert "no experiment 'nope'" in capsys.readouterr().err
