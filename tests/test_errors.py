"""The error tree and Location formatting."""

import pickle

import pytest

import xser
from xser.errors import Location, did_you_mean, shape_str


class TestLocation:
    def test_full(self):
        """file:line:col: path"""
        assert str(Location("a.yaml", 3, 5, "model.x")) == "a.yaml:3:5: model.x"

    def test_partial(self):
        """Missing parts are left out."""
        assert str(Location("a.yaml")) == "a.yaml"
        assert str(Location(path="m.x")) == "m.x"
        assert str(Location("a.yaml", 3)) == "a.yaml:3"


class TestErrors:
    def test_message_with_location(self):
        """An error prints its location, then the message."""
        e = xser.SpecError("bad", Location("a.yaml", 1, 2))
        assert str(e) == "a.yaml:1:2: bad" and e.message == "bad"

    def test_hierarchy(self):
        """Errors also subclass the builtin they resemble."""
        assert issubclass(xser.SpecError, ValueError) and issubclass(xser.RegistryError, TypeError)
        for cls in (xser.SpecError, xser.RegistryError, xser.DataError, xser.CheckpointError):
            assert issubclass(cls, xser.XserError)

    def test_pickle(self):
        """Errors survive pickling (e.g. from worker processes)."""
        e = pickle.loads(pickle.dumps(xser.DataError("x", Location("f", 1, 2))))
        assert str(e) == "f:1:2: x"

    def test_did_you_mean(self):
        """One close suggestion, or nothing."""
        assert did_you_mean("out_dimm", ["in_dim", "out_dim"]) == "; did you mean 'out_dim'?"
        assert did_you_mean("zzz", ["in_dim"]) == ""

    def test_shape_str(self):
        """Shapes are Python tuples."""
        assert (shape_str([6, 4]), shape_str([3]), shape_str([])) == ("(6, 4)", "(3,)", "()")


# ---------------------------------------------------------------- what a new user meets (issue 14, point 10)


def _first_week(tmp_path, case):
    """Run one of the mistakes a new user makes; return the error's text with tmp_path as D and names as X."""
    import re

    import numpy as np

    import xser
    from components import Linear, Norm
    from xser.cli import main

    d = tmp_path
    if case == "unknown tag":
        (d / "c.yaml").write_text("e: !Unknwn {a: 1}\n")
        fn = lambda: xser.build(xser.load_config(d / "c.yaml")["e"])  # noqa: E731
    elif case == "negative shape":
        (d / "c.yaml").write_text("e: !TLinear {in_dim: -3, out_dim: 2}\n")
        fn = lambda: xser.build(xser.load_config(d / "c.yaml")["e"])  # noqa: E731
    elif case == "missing LoadSerialized":
        (d / "c.yaml").write_text("e: !LoadSerialized {filename: nope/m.yaml}\n")
        fn = lambda: xser.build(xser.load_config(d / "c.yaml")["e"])  # noqa: E731
    elif case == "forgotten tag":
        @xser.serializable(tag="!NormHolder")
        class NormHolder:
            norm: Norm

        (d / "c.yaml").write_text("e: !NormHolder {norm: {dim: 3}}\n")
        fn = lambda: xser.build(xser.load_config(d / "c.yaml")["e"])  # noqa: E731
    elif case in ("inspect dir", "inspect config"):
        (d / "dir").mkdir()
        (d / "c.yaml").write_text("e: 1\n")

        def fn():
            if main(["inspect", str(d / ("dir" if case == "inspect dir" else "c.yaml"))]) != 1:
                raise AssertionError("inspect succeeded")
            raise xser.XserError("see stderr")
    elif case == "second saver":
        first = xser.CheckpointSaver(d / "m.yaml")
        fn = lambda: xser.CheckpointSaver(d / "m.yaml")  # noqa: E731
    elif case == "duplicate tag":
        def fn():
            @xser.serializable(tag="!TLinear")
            class Other:
                pass
    elif case == "rebind float64":
        lin = Linear(2, 2)

        def fn():
            lin.W = lin.W.astype(np.float64)
            xser.save(lin, d / "m.yaml")
    elif case == "version bump":
        def fn():
            @xser.serializable(tag="!Bumped")
            class Bumped:
                a: int = 1

            xser.save(Bumped(), d / "m.yaml")

            @xser.serializable(tag="!Bumped", version=2)
            class Bumped:  # noqa: F811 - the class as it is now
                a: int = 1

            xser.load(d / "m.yaml")
    with pytest.raises(xser.XserError) as info:
        fn()
    if case == "second saver":
        first.close()
    return re.sub(r"(Linear|Other)\.[0-9a-f]{8}", r"\1.X", str(info.value).replace(str(d), "D"))


FIRST_WEEK = [
    ("unknown tag", "D/c.yaml:1:4: unknown component '!Unknwn'; import the module that defines its class before building or "
     "loading (xser.read_params and the xser tools need no classes)"),
    ("negative shape", "D/c.yaml:1:4: !TLinear built from these arguments: Linear.X: param 'W': shape must be a tuple of "
     "non-negative ints, got (2, -3)"),
    ("missing LoadSerialized", "D/c.yaml:1:4: !LoadSerialized 'nope/m.yaml': D/nope/m.yaml: file not found"),
    ("forgotten tag", "D/c.yaml:1:23: norm: expected Norm, got dict; a component needs its tag: !TNorm {...}"),
    ("second saver", "D/m.yaml.lock: this process already has a CheckpointSaver on this model: use that one, or close() it "
     "(or leave its with block) before making another"),
    ("duplicate tag", "duplicate tag !TLinear: test_errors._first_week.<locals>.fn.<locals>.Other and components.Linear; "
     "give one of them its own tag: @xser.serializable(tag=\"!Other\")"),
    ("rebind float64", "Linear.X: param 'W': attribute .W was rebound to (2, 2) float64, declared (2, 2) float32; keep the "
     "dtype: .astype(np.float32) on the new value, or update in place ([...] =)"),
    ("version bump", "D/m.yaml.data/spec.yaml:4:13: !Bumped was saved by version 1; version 2 has no migrate= to read it: add "
     "@xser.serializable(version=2, migrate=fn) with fn(args, old_version) -> the arguments of version 2 (and "
     "migrate_params=fn(arrays, old_version) if parameters were renamed)"),
]


@pytest.mark.parametrize("case, message", FIRST_WEEK)
def test_first_week_messages(tmp_path, case, message):
    assert _first_week(tmp_path, case) == message


@pytest.mark.parametrize("case, message", [
    ("inspect dir", "error: D/dir: not a model directory: neither model.safetensors.index.json nor model.safetensors is in "
     "it; pass a saved xser model's .yaml file (MODEL.yaml, beside MODEL.yaml.data/), a RecIS checkpoint directory or a "
     "Hugging Face safetensors directory"),
    ("inspect config", "error: D/c.yaml:1:1: not a saved xser model (no xser_format key); is this a config file? Build and "
     "save it first: a saved model is the MODEL.yaml that xser.save writes beside MODEL.yaml.data/"),
])
def test_first_week_cli_messages(tmp_path, capsys, case, message):
    _first_week(tmp_path, case)
    assert capsys.readouterr().err.strip().replace(str(tmp_path), "D") == message
