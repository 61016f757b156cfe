"""Parameter declarations: names, shapes, dtypes, initialisers."""

import sys

import ml_dtypes
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
        (dict(name="w", shape=(2,), dtype=object), "param 'w': object dtypes need pickle and are not supported"),
        (dict(name="w", shape=(2,), dtype="V8"), "param 'w': raw void dtype |V8 cannot be saved (its meaning is not recorded); "
         "view it as uint8 or a record dtype"),
        (dict(name="w", shape=(2,), dtype=[("a", "<f4"), ("b", "V2")]), "param 'w': field 'b': raw void dtype |V2 cannot be saved"),
        (dict(name="w", shape=(2,), dtype=ml_dtypes.int4), "param 'w': ml_dtypes.int4 is not supported "
         "(of ml_dtypes' types xser stores bfloat16, float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz)"),
        (dict(name="w", shape=(2,), dtype=ml_dtypes.float8_e8m0fnu), "param 'w': ml_dtypes.float8_e8m0fnu is not supported"),
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

    @pytest.mark.parametrize("tag", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
    def test_ml_dtypes_by_name(self, tag):
        """The table's extension dtypes may be named by their tag; they are ml_dtypes arrays."""
        a = Holder().p.add("w", (3,), dtype=tag, init="ones")
        assert a.dtype == np.dtype(getattr(ml_dtypes, tag)) and a.astype(np.float32).tolist() == [1.0, 1.0, 1.0]

    @pytest.mark.parametrize("tag", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
    def test_without_ml_dtypes_says_what_to_install(self, tag, monkeypatch):
        """Without ml_dtypes, naming an extension dtype is refused at add() with the package to install."""
        from xser.storage import dtypes

        monkeypatch.setitem(sys.modules, "ml_dtypes", None)
        monkeypatch.setattr(dtypes, "_ML", {})
        with pytest.raises(xser.RegistryError) as info:
            Holder().p.add("w", 2, dtype=tag)
        assert str(info.value).endswith(f"param 'w': dtype {tag} needs the ml_dtypes package in numpy: pip install ml_dtypes")

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


@xser.serializable(tag="!TRenamed")
class Renamed:
    """The attribute is not named after the parameter."""

    n: int = 3

    def __attrs_post_init__(self):
        self.weight = xser.params(self).add("W", (self.n,), init="zeros")


@xser.serializable(tag="!TInDict")
class InDict:
    """Parameters kept in a dict and a list held by attributes."""

    n: int = 3

    def __attrs_post_init__(self):
        p = xser.params(self)
        self.tensors = {"W": p.add("W", (self.n,), init="zeros")}
        self.layers = [p.add("b", (self.n,), init="zeros")]


def saved_values(tmp_path, obj, name):
    path = tmp_path / "m.yaml"
    xser.save(obj, path)
    return xser.read_params(path)[xser.params(obj).name][name]


class TestOneSourceOfTruth:
    """Every way of updating a parameter either reaches the save or is refused with a message saying how."""

    def test_rebinding_an_attribute_not_named_like_the_parameter(self, tmp_path):
        """self.weight = p.add("W") then self.weight = self.weight + 1 saves the new values."""
        m = Renamed()
        m.weight = m.weight + 1
        assert np.all(saved_values(tmp_path, m, "W") == 1)
        assert xser.params(m)["W"] is m.weight

    def test_rebinding_inside_a_dict_and_a_list(self, tmp_path):
        """Parameters kept in containers: rebinding the entry is picked up."""
        m = InDict()
        m.tensors["W"] = m.tensors["W"] + 2
        m.layers[0] = m.layers[0] - 1
        assert np.all(saved_values(tmp_path, m, "W") == 2)
        assert np.all(saved_values(tmp_path, m, "b") == -1)

    def test_setitem_updates_the_attribute_too(self, tmp_path):
        """p["W"] = new with the README's component pattern: the attribute and the save both see the new array."""
        lin = Linear(2, 3)
        new = np.full((3, 2), 5, np.float32)
        xser.params(lin)["W"] = new
        assert lin.W is new
        assert np.all(saved_values(tmp_path, lin, "W") == 5)

    def test_in_place_updates(self, tmp_path):
        """Updating in place never needs anything else."""
        lin = Linear(2, 3)
        lin.W -= 1.5
        lin.b[...] = 7
        assert np.all(saved_values(tmp_path, lin, "W") == xser.params(lin)["W"])
        assert np.all(saved_values(tmp_path, lin, "b") == 7)

    BAD = [
        (lambda m: setattr(m, "weight", [0.0, 1.0, 2.0]), "param 'W': attribute .weight holds a list now, not the parameter's numpy array; update it in place (obj.weight[...] = new) or with xser.params(obj)['W'] = new"),
        (lambda m: setattr(m, "weight", np.zeros(3, np.float64)), "param 'W': attribute .weight was rebound to (3,) float64, declared (3,) float32; keep the dtype: .astype(np.float32) on the new value, or update in place ([...] =)"),
        (lambda m: setattr(m, "weight", 3.0), "param 'W': attribute .weight holds a float now, not the parameter's numpy array; update it in place (obj.weight[...] = new) or with xser.params(obj)['W'] = new"),
    ]

    @pytest.mark.parametrize("edit, message", BAD, ids=["list", "dtype", "float"])
    def test_refused_rebindings(self, tmp_path, edit, message):
        """Rebinding to something that is not an array of the declared shape and dtype is refused, naming the attribute."""
        m = Renamed()
        edit(m)
        with pytest.raises(xser.DataError) as info:
            xser.save(m, tmp_path / "m.yaml")
        assert str(info.value) == f"{xser.params(m).name}: {message}"
        assert not (tmp_path / "m.yaml").exists()

    def test_two_different_new_values_are_refused(self, tmp_path):
        """Two places holding different new arrays for one parameter: ambiguous, refused."""
        m = Renamed()
        m.alias = m.weight
        xser.params(m).bind()
        m.weight = m.weight + 1
        m.alias = m.alias + 2
        with pytest.raises(xser.DataError, match=r"param 'W': attribute \.weight and attribute \.alias hold different new values"):
            xser.save(m, tmp_path / "m.yaml")

    def test_foreign_array_type_is_refused(self, tmp_path):
        """An array of another library (here a memoryview stands for a tensor) is refused, not silently skipped."""
        m = Renamed()
        m.weight = memoryview(np.ones(3, np.float32))
        with pytest.raises(xser.DataError, match="attribute .weight holds a memoryview now"):
            xser.save(m, tmp_path / "m.yaml")

    def test_loaded_models_follow_the_same_rules(self, tmp_path):
        """A loaded component records its places too: a rebinding after load is saved."""
        path = tmp_path / "m.yaml"
        xser.save(Renamed(), path)
        m = xser.load(path)
        m.weight = m.weight + 4
        xser.save(m, path)
        assert np.all(xser.load(path).weight == 4)

    def test_repr_shows_what_is_held(self, tmp_path):
        """repr of a partially loaded subcollection shows the rows held, not only the declaration."""
        path = tmp_path / "m.yaml"
        lin = Linear(4, 10)
        xser.save(lin, path)
        name = xser.params(lin).name
        part = xser.load(path, rows={f"{name}/W": (2, 6)})
        assert repr(xser.params(part)) == f"<Subcollection {name} {{W: (4, 4) float32 (rows 2:6 of (10, 4)), b: (10,) float32}}>"

    def test_partial_model_cannot_be_saved(self, tmp_path):
        """A model loaded with rows= refuses to be saved, and the source stays whole."""
        path = tmp_path / "m.yaml"
        lin = Linear(4, 10)
        xser.save(lin, path)
        name = xser.params(lin).name
        part = xser.load(path, rows={f"{name}/W": (2, 6)})
        with pytest.raises(xser.DataError) as info:
            xser.save(part, path)
        assert str(info.value) == (
            f"{name}: param 'W' holds rows 2:6 of its 10 (the model was loaded with rows=); "
            "a partial model cannot be saved: load it without rows= to save it"
        )
        assert np.array_equal(xser.load(path).W, lin.W)
