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
        """--verify checks every checksum, and that spec and data belong together."""
        _, path = saved
        assert main(["inspect", path, "--verify"]) == 0
        assert "verified checkpoint 0 (m.yaml.data): 5 files match their checksums; spec and data belong together" in capsys.readouterr().out

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

    # Each command line that is wrong by itself (whatever the model holds): exit 2, the subcommand's usage line, then
    # "PROG: error: MESSAGE". Errors that depend on the model (more checkpoints asked than it has) are `error: ...`, exit 1.
    USAGE = [
        (["avg", "m.yaml", "--out", "o.yaml", "--best", "2"], "xser avg", "--best needs --metric"),
        (["avg", "m.yaml", "--out", "o.yaml", "--metric", "bleu"], "xser avg", "--metric is only used with --best"),
        (["avg", "m.yaml", "--out", "o.yaml", "--last", "2", "--metric", "bleu"], "xser avg", "--metric is only used with --best"),
        (["avg", "m.yaml", "--out", "o.yaml", "--mode", "min"], "xser avg", "--mode is only used with --best"),
        (["avg", "m.yaml", "--out", "o.yaml", "--last", "0"], "xser avg", "argument --last: expected a whole number >= 1, got '0'"),
        (["avg", "m.yaml", "--out", "o.yaml", "--last", "-3"], "xser avg", "argument --last: expected a whole number >= 1, got '-3'"),
        (["avg", "m.yaml", "--out", "o.yaml", "--best", "0", "--metric", "b"], "xser avg",
         "argument --best: expected a whole number >= 1, got '0'"),
        (["avg", "m.yaml", "--out", "o.yaml", "--checkpoints", ""], "xser avg",
         "argument --checkpoints: expected comma-separated checkpoint numbers (0 = newest), got ''"),
        (["avg", "m.yaml", "--out", "o.yaml", "--checkpoints", "0,-1"], "xser avg",
         "argument --checkpoints: expected comma-separated checkpoint numbers (0 = newest), got '0,-1'"),
        (["avg", "m.yaml", "--out", "o.yaml", "--checkpoints", "1,0,1"], "xser avg", "argument --checkpoints: checkpoint 1 is given twice"),
        (["avg", "m.yaml", "--out", "o.yaml", "--weights", "1,-1"], "xser avg",
         "argument --weights: weights must not be negative, got '1,-1'"),
        (["avg", "m.yaml", "--out", "o.yaml", "--weights", "-2"], "xser avg",
         "argument --weights: weights must not be negative, got '-2'"),
        (["avg", "m.yaml", "--out", "o.yaml", "--weights", "1,nan"], "xser avg",
         "argument --weights: weights must be finite numbers, got '1,nan'"),
        (["avg", "m.yaml", "--out", "o.yaml", "--weights", "inf,1"], "xser avg",
         "argument --weights: weights must be finite numbers, got 'inf,1'"),
        (["avg", "m.yaml", "--out", "o.yaml", "--weights", "0,0.0"], "xser avg", "argument --weights: weights sum to zero: '0,0.0'"),
        (["avg", "m.yaml", "--out", "o.yaml", "--weights", ""], "xser avg", "argument --weights: expected comma-separated numbers, got ''"),
        (["avg", "m.yaml", "--out", "o.yaml", "--last", "3", "--weights", "1,2"], "xser avg",
         "--weights gives 2 weights for the 3 checkpoints of --last 3"),
        (["avg", "m.yaml", "--out", "o.yaml", "--best", "1", "--metric", "b", "--weights", "1,2"], "xser avg",
         "--weights gives 2 weights for the 1 checkpoint of --best 1"),
        (["avg", "m.yaml", "--out", "o.yaml", "--checkpoints", "0,2", "--weights", "1"], "xser avg",
         "--weights gives 1 weight for the 2 checkpoints of --checkpoints 0,2"),
        (["inspect", "m.yaml", "--plot", "p.png", "--checkpoint", "2"], "xser inspect",
         "--checkpoint does not change --plot, which draws every checkpoint"),
        (["inspect", "m.yaml", "--plot", "p.png", "--checkpoint", "last"], "xser inspect",
         "--checkpoint does not change --plot, which draws every checkpoint"),
        (["export", "recis", "m.yaml", "out", "--shards", "0"], "xser export recis",
         "argument --shards: expected a whole number >= 1, got '0'"),
        (["export", "recis", "m.yaml", "out", "--parallel", "-1"], "xser export recis",
         "argument --parallel: expected a whole number >= 1, got '-1'"),
        (["export", "angel", "m.yaml", "W", "out", "--block-rows", "0"], "xser export angel",
         "argument --block-rows: expected a whole number >= 1, got '0'"),
        (["export", "angel", "m.yaml", "W", "out", "--per-file", "0"], "xser export angel",
         "argument --per-file: expected a whole number >= 1, got '0'"),
        (["export", "dismec", "m.yaml", "W", "o.json", "--split-files", "0"], "xser export dismec",
         "argument --split-files: expected a whole number >= 1, got '0'"),
        (["export", "dismec", "m.yaml", "W", "o.json", "--precision", "0"], "xser export dismec",
         "argument --precision: expected a whole number from 1 to 17, got '0'"),
        (["export", "dismec", "m.yaml", "W", "o.json", "--precision", "18"], "xser export dismec",
         "argument --precision: expected a whole number from 1 to 17, got '18'"),
        (["export", "dismec", "m.yaml", "W", "o.json", "--culling", "-1"], "xser export dismec",
         "argument --culling: expected a finite number >= 0, got '-1'"),
        (["export", "dismec", "m.yaml", "W", "o.json", "--culling", "nan"], "xser export dismec",
         "argument --culling: expected a finite number >= 0, got 'nan'"),
        (["export", "dismec", "m.yaml", "W", "o.json", "--format", "DenseTXT", "--culling", "0.5"], "xser export dismec",
         "--culling applies to SparseTXT only, not DenseTXT"),
        (["export", "safetensors", "m.yaml", "out", "--max-shard-size", "0"], "xser export safetensors",
         "argument --max-shard-size: shard size must be at least 1 byte, got '0'"),
        (["export", "safetensors", "m.yaml", "out", "--max-shard-size", "big"], "xser export safetensors",
         "argument --max-shard-size: shard size must look like 5GB, 500MB, 2GiB or a number of bytes, got 'big'"),
    ]

    @pytest.mark.parametrize("argv, prog, message", USAGE, ids=[" ".join(a[0:1] + a[3:]) for a, _, _ in USAGE])
    def test_invalid_combinations_exit_2_with_usage(self, tmp_path, monkeypatch, capsys, argv, prog, message):
        """Checked before anything is read or written: the model need not exist, and nothing appears."""
        monkeypatch.chdir(tmp_path)
        with pytest.raises(SystemExit) as info:
            main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2
        assert err.startswith(f"usage: {prog} ") and err.endswith(f"\n{prog}: error: {message}\n"), err
        assert list(tmp_path.iterdir()) == []

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


@pytest.fixture
def run(tmp_path):
    path = str(tmp_path / "m.yaml")
    m = Model(encoder=Linear(2, 3), decoder=Norm(3))
    with xser.CheckpointSaver(path, keep=4) as saver:
        for step in range(1, 5):
            m.encoder.W[...] = step
            saver.save(m, step=step, metrics={"bleu": float(step % 3)})
    return path, m


class TestTools:
    def test_avg(self, run, tmp_path, capsys):
        """xser avg writes the mean and says which checkpoints it used and what it copied."""
        path, m = run
        assert main(["avg", path, "--out", str(tmp_path / "avg.yaml"), "--best", "2", "--metric", "bleu"]) == 0
        out = capsys.readouterr().out
        assert "averaged 2 checkpoints" in out and "m.yaml.data (step 4, weight 1)" in out
        assert f"copied, not averaged: {xser.params(m.decoder).name}/count" in out
        assert float(xser.load(tmp_path / "avg.yaml").encoder.W.flat[0]) == 3.0  # steps 4 and 2

    def test_avg_errors_exit_1(self, run, tmp_path, capsys):
        """Bad selections exit 1 with one error line; argparse problems exit 2."""
        path, _ = run
        assert main(["avg", path, "--out", str(tmp_path / "a.yaml"), "--weights", "1,2"]) == 1
        assert capsys.readouterr().err == f"error: {path}: 2 weights for 4 selected checkpoints\n"
        assert main(["avg", path, "--out", str(tmp_path / "a.yaml"), "--last", "9"]) == 1
        assert capsys.readouterr().err == (f"error: {path}: asked for the last 9 checkpoints, but the model has 4; "
                                           "choose at most 4, or no selection to average all 4\n")
        assert main(["avg", path, "--out", str(tmp_path / "a.yaml"), "--best", "5", "--metric", "bleu"]) == 1
        assert capsys.readouterr().err == (f"error: {path}: asked for the best 5 checkpoints by 'bleu', but only 4 "
                                           "record it as a number; choose at most 4\n")
        assert not (tmp_path / "a.yaml").exists()
        with pytest.raises(SystemExit) as info:
            main(["avg", path, "--out", "x.yaml", "--last", "1", "--best", "1"])
        assert info.value.code == 2
        with pytest.raises(SystemExit):
            main(["avg", path, "--out", "x.yaml", "--checkpoints", "a,b"])

    def test_convert_all_then_ensemble(self, run, tmp_path, capsys):
        """convert --all, then ensemble the converted checkpoints: one loadable model."""
        path, _ = run
        assert main(["convert", path, "--all", "--out", str(tmp_path / "c" / "m.yaml")]) == 0
        outs = [str(tmp_path / "c" / f"m.{k}.yaml") for k in range(4)]
        assert main(["ensemble", *outs, "--out", str(tmp_path / "ens.yaml")]) == 0
        ens = xser.load(tmp_path / "ens.yaml")
        assert [float(mm.encoder.W.flat[0]) for mm in ens.members] == [4.0, 3.0, 2.0, 1.0]
        assert main(["ensemble", path, path, "--out", str(tmp_path / "e2.yaml")]) == 1
        assert "pass --rename" in capsys.readouterr().err

    @pytest.mark.parametrize("script, word", [("avg_checkpoints.py", "--best"), ("conv_checkpoints_to_model.py", "--all")])
    def test_scripts(self, script, word):
        """The scripts are thin wrappers with a --help a user can learn from."""
        import os

        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        r = subprocess.run([sys.executable, os.path.join(root, "scripts", script), "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.startswith(f"usage: {script}") and word in r.stdout

    def test_script_runs(self, run, tmp_path):
        """scripts/avg_checkpoints.py does what xser avg does."""
        import os

        path, _ = run
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        r = subprocess.run(
            [sys.executable, os.path.join(root, "scripts", "avg_checkpoints.py"), path, "--out", str(tmp_path / "s.yaml"), "--last", "2"],
            capture_output=True, text=True,
        )
        assert r.returncode == 0, r.stderr
        assert float(xser.load(tmp_path / "s.yaml").encoder.W.flat[0]) == 3.5

    def test_inspect_lists_checkpoints(self, run, capsys):
        """inspect prints the checkpoint table with steps and metrics."""
        path, _ = run
        assert main(["inspect", path]) == 0
        out = capsys.readouterr().out
        assert "checkpoints: 4" in out and "  #  directory      step  created" in out
        assert main(["inspect", path, "--checkpoint", "3"]) == 0


class TestCleanFailures:
    """Paths that cannot be made or written are `error: ...` and exit 1, never a traceback."""

    @pytest.fixture
    def here(self, tmp_path, monkeypatch):
        monkeypatch.chdir(tmp_path)
        xser.save(Linear(2, 3), "m.yaml")
        Path("afile").write_text("x")
        return tmp_path

    @pytest.mark.parametrize("argv, message", [
        (["avg", "m.yaml", "--out", "afile/x.yaml"], "afile: cannot create the model's directory: a file is in the way of a directory"),
        (["convert", "m.yaml", "--out", "afile/x.yaml"], "afile: cannot create the model's directory: a file is in the way of a directory"),
        (["demo", "afile"], "afile: cannot make the output directory: a file is in the way of a directory"),
        (["export", "xnmt", "m.yaml", "afile/out.mod"], "afile: cannot write the export: a file is in the way of a directory"),
        (["avg", "m.yaml", "--out", "/proc/xser-test/x.yaml"], "cannot create"),
    ])
    def test_error_and_exit_1(self, here, capsys, argv, message):
        """Each is one line on stderr with the path, and exit code 1."""
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err

    def test_save_under_a_file(self, here):
        """xser.save into a path under a file is a CheckpointError naming the file in the way."""
        with pytest.raises(xser.CheckpointError, match="afile: cannot create the model's directory"):
            xser.save(Linear(2, 3), "afile/m.yaml")

    def test_debug_after_the_subcommand(self, here):
        """--debug works after the subcommand too (the traceback is raised)."""
        with pytest.raises(xser.XserError):
            main(["inspect", "missing.yaml", "--debug"])

    def test_export_of_a_scalar_to_xnmt_is_refused(self, here, capsys):
        """A 0-d or integer parameter (a counter) cannot go to DyNet: refused with the reason, nothing half-written."""
        from components import Norm

        xser.save(Norm(3), "n.yaml")
        assert main(["export", "xnmt", "n.yaml", "out.mod"]) == 1
        assert "DyNet (XNMT) holds float32 arrays of at least one dimension" in capsys.readouterr().err


def _scored_model(tmp_path):
    from helpers import scored_model

    return scored_model(tmp_path / "m.yaml", [0.1, 0.9, 0.3])


@pytest.mark.parametrize("which, step", [("best:dev", 2), ("best:dev:min", 1), ("last", 3), ("2", 1)])
def test_checkpoint_selection_on_the_command_line(tmp_path, which, step):
    path = _scored_model(tmp_path)
    assert main(["convert", str(path), "--out", str(tmp_path / "c.yaml"), "--checkpoint", which]) == 0
    assert (xser.load(tmp_path / "c.yaml").W == step).all()


@pytest.mark.parametrize("which, message", [
    ("best:dev:up", "argument --checkpoint: mode must be 'max' or 'min', got 'up'"),
    ("-1", "argument --checkpoint: expected K (0 = newest), last or best:METRIC[:max|min], got '-1'"),
    ("best:", "argument --checkpoint: metric must be a metric name, got ''"),
])
def test_checkpoint_selection_usage_errors(tmp_path, capsys, which, message):
    path = _scored_model(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["convert", str(path), "--out", str(tmp_path / "c.yaml"), "--checkpoint", which])
    assert info.value.code == 2 and capsys.readouterr().err.strip().endswith(message)


@pytest.mark.parametrize("system, out", [("angel", "ang"), ("dismec", "d/meta.json")])
def test_exports_name_params_by_component_path_and_never_overwrite_silently(tmp_path, capsys, system, out):
    model = Model(Linear(3, 2))
    xser.save(model, tmp_path / "m.yaml")
    sub = xser.params(model.encoder).name
    args = ["export", system, str(tmp_path / "m.yaml"), "encoder.W", str(tmp_path / out)]
    assert main(args) == 0
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.strip().endswith("the output exists; remove it or pass --force to replace it")
    assert main([*args, "--force"]) == 0
    assert main(["export", system, str(tmp_path / "m.yaml"), f"{sub}/W", str(tmp_path / out), "--force"]) == 0
    assert main(["export", system, str(tmp_path / "m.yaml"), "encoder.w", str(tmp_path / "other")]) == 1
    assert "no parameter 'encoder.w'; did you mean 'encoder.W'?" in capsys.readouterr().err


def _parsers(p, path=()):
    """Every parser of the command line, with its path of subcommand names."""
    import argparse

    yield path, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, path + (name,))


def test_every_subcommand_and_option_is_described():
    """Each (sub)command's --help has a description, and each option and argument a help text."""
    import argparse

    from xser.cli import COMMANDS, command_parser, parser

    seen = []
    roots = [parser()] + [command_parser(name, f"xser-{name}") for name in COMMANDS]
    for root in roots:
        for path, p in _parsers(root):
            seen.append(" ".join(path))
            assert p.description and p.description.strip(), f"xser {' '.join(path)}: no description"
            assert p.format_help().startswith("usage: ")
            for action in p._actions:
                if isinstance(action, argparse._HelpAction):
                    continue
                if isinstance(action, argparse._SubParsersAction):
                    helps = {a.dest: a.help for a in action._choices_actions}
                    assert set(helps) == set(action.choices) and all(h and h.strip() for h in helps.values()), (path, helps)
                    continue
                name = action.option_strings[0] if action.option_strings else action.dest
                assert action.help and action.help.strip() and action.help != argparse.SUPPRESS, f"xser {' '.join(path)} {name}: no help"
    assert {"export safetensors", "export recis", "import dismec", "avg", "inspect", "demo"} <= set(seen)


def test_help_shows_the_description(capsys):
    """`xser export recis --help` (a subcommand of a subcommand) starts with its description."""
    with pytest.raises(SystemExit) as info:
        main(["export", "recis", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert out.split("\n\n")[1] == "the model as a RecIS checkpoint directory (hash tables and dense tensors)"


@pytest.mark.parametrize("argv", [["inspect", "{m}"], ["inspect", "{m}", "--json"]])
def test_output_into_a_closed_pipe(tmp_path, argv):
    """Output piped into a reader that is gone (`| head`): exit 0, nothing on stderr (no 'error: Broken pipe')."""
    import os

    m = str(tmp_path / "m.yaml")
    xser.save(Linear(2, 3), m)
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "xser", *[a.format(m=m) for a in argv]], stdout=w, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(w)
    assert (p.returncode, p.stderr) == (0, "")


@pytest.mark.parametrize("argv, which", [
    (["avg", "{d}", "--out", "{o}"], " (this is its checkpoint 1)"),
    (["convert", "{d}", "--out", "{o}"], " with --checkpoint 1"),
    (["ensemble", "{m}", "{d}", "--out", "{o}"], " (this is its checkpoint 1)"),
    (["export", "xnmt", "{d}", "{o}"], " (this is its checkpoint 1)"),
    (["export", "recis", "{d}", "{o}"], " with --checkpoint 1"),
    (["export", "safetensors", "{d}", "{o}"], " with --checkpoint 1"),
    (["export", "angel", "{d}", "W", "{o}"], " with --checkpoint 1"),
    (["export", "dismec", "{d}", "W", "{o}"], " with --checkpoint 1"),
    (["inspect", "{d}"], " with --checkpoint 1"),
])
def test_every_command_names_the_model_file_for_a_directory(tmp_path, capsys, argv, which):
    """A checkpoint directory, or a directory holding a model, where a model's file belongs: exit 1 naming the file
    (and the checkpoint), whatever the command; nothing is written."""
    from helpers import save_steps

    m = str(tmp_path / "m" / "m.yaml")
    save_steps(m, Linear(2, 3), [1, 2])
    out = str(tmp_path / "out")
    fill = lambda d: [a.format(d=d, m=m, o=out) for a in argv]  # noqa: E731
    assert main(fill(m + ".data.1")) == 1
    assert capsys.readouterr().err == f"error: {m}.data.1: a checkpoint directory of the model {m}; give the model's file instead: {m}{which}\n"
    assert main(fill(str(tmp_path / "m"))) == 1
    assert capsys.readouterr().err == (f"error: {tmp_path / 'm'}: a directory that holds a saved model, not a model; "
                                       f"give its model file instead: {m}\n")
    assert not (tmp_path / "out").exists()
