"""Parameter declarations: names, shapes, dtypes, initialisers."""

import numpy as np
import pytest

import xser
from components import Linear, Node
from xser.model.params import INITS


@xser.serializable(tag="!PHolder")
class Holder:
    kind: str = "zeros"

    def __attrs_post_init__(self):
        self.p = xser.params(self)


class TestAdd:
    def test_same_subcollection_each_call(self):
        """xser.params(self) returns the same subcollection every time."""
        h = Holder()
        assert xser.params(h) is h.p and h.p.name.startswith("Holder.")

    @pytest.mark.parametrize("init", sorted(INITS))
    def test_named_inits(self, init):
        """Every named initialiser gives the declared shape and dtype."""
        a = Holder().p.add("w", (3, 4, 2), init=init, dtype="float64")
        assert a.shape == (3, 4, 2) and a.dtype == np.float64

    def test_glorot_bounds(self):
        """glorot_uniform stays inside sqrt(6 / (fan_in + fan_out))."""
        a = Holder().p.add("w", (30, 20), init="glorot_uniform")
        assert np.abs(a).max() <= np.sqrt(6 / 50)

    def test_callable_and_array_inits(self):
        """init may be a callable (shape, rng) -> array, or an array (copied)."""
        p = Holder().p
        a = p.add("a", (2,), init=lambda shape, rng: np.full(shape, 3.0))
        src = np.arange(4, dtype=np.int32)
        b = p.add("b", (4,), init=src, dtype="int32")
        assert a.tolist() == [3.0, 3.0] and b.tolist() == [0, 1, 2, 3] and b is not src

    def test_int_shape(self):
        """An int shape means a vector."""
        assert Holder().p.add("v", 5).shape == (5,)

    ERRORS = [
        (dict(name="1bad", shape=(1,)), "parameter name '1bad' must match"),
        (dict(name="w", shape=(1, -1)), "shape must be a tuple of non-negative ints, got (1, -1)"),
        (dict(name="w", shape="ab"), "shape must be a tuple of ints, got 'ab'"),
        (dict(name="w", shape=(2,), dtype="nope"), "unknown dtype 'nope'"),
        (dict(name="w", shape=(2,), dtype=object), "object dtypes cannot be saved"),
        (dict(name="w", shape=(2,), init="gaussian"), "unknown init 'gaussian' (known: glorot_normal"),
        (dict(name="w", shape=(2,), init=np.zeros(3)), "init gave shape (3,), declared (2,)"),
    ]

    @pytest.mark.parametrize("kw, message", ERRORS, ids=[m for _, m in ERRORS])
    def test_bad_declarations(self, kw, message):
        """Programmer mistakes in declarations are RegistryErrors that say what is wrong."""
        p = Holder().p
        with pytest.raises(xser.RegistryError) as info:
            p.add(kw.pop("name"), kw.pop("shape"), **kw)
        assert message in str(info.value)

    def test_declared_twice(self):
        """A name declared twice is an error."""
        p = Holder().p
        p.add("w", 1)
        with pytest.raises(xser.RegistryError, match="declared twice"):
            p.add("w", 1)

    def test_not_a_component(self):
        """Only registered components own parameters."""

        class Plain:
            pass

        with pytest.raises(xser.RegistryError, match="not an @xser.serializable class"):
            xser.params(Plain())


class TestReplace:
    def test_setitem_checks(self):
        """Replacing a parameter keeps its declared shape and dtype."""
        lin = Linear(2, 3)
        p = xser.params(lin)
        p["W"] = np.ones((3, 2), np.float32)
        assert p["W"].sum() == 6
        with pytest.raises(xser.DataError, match=r"new value is \(2, 3\) float32, declared \(3, 2\) float32"):
            p["W"] = np.ones((2, 3), np.float32)
        with pytest.raises(KeyError, match="has no parameter 'V'"):
            p["V"] = 1

    def test_mapping_protocol(self):
        """A subcollection lists its parameters in declaration order."""
        p = xser.params(Linear(2, 3))
        assert list(p) == ["W", "b"] and len(p) == 2 and "W" in p and "V" not in p
        assert [n for n, _ in p.items()] == ["W", "b"]
        assert p.decls["b"].trainable is True

    def test_component_without_params(self):
        """A component that never calls xser.params has no subcollection."""
        from xser.model.params import subcollection_of

        assert subcollection_of(Node(1)) is None
