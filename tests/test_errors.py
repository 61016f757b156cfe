"""The error tree and Location formatting."""

import pickle

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
