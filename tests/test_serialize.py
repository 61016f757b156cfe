"""Objects -> spec trees."""

import numpy as np
import pytest

import xser
from components import Linear, Model, Node
from xser.model.serialize import to_tree
from xser.spec import Tagged


class TestToTree:
    def test_fields_in_order_with_names(self):
        """A component becomes its tag and its arguments in field order, then its subcollection name."""
        lin = Linear(2, 3)
        tree, subcols = to_tree(lin)
        name = xser.params(lin).name
        assert tree == Tagged("!TLinear", {"in_dim": 2, "out_dim": 3, "init": "glorot_uniform", "xser_subcol_name": name})
        assert list(tree.args) == ["in_dim", "out_dim", "init", "xser_subcol_name"]
        assert subcols[name][1] == "the root"

    def test_shared_by_path_and_by_name(self):
        """Second places are !Ref by path, or by name when the object has an xser_id."""
        n = Node(1)
        tree, _ = to_tree(Node(children=[n, n]))
        assert tree.args["children"][1] == Tagged("!Ref", {"path": "children.0"})
        n.__dict__["_xser_id"] = "shared"
        tree, _ = to_tree(Node(children=[n, n]))
        assert tree.args["children"][0].args["xser_id"] == "shared"
        assert tree.args["children"][1] == Tagged("!Ref", {"name": "shared"})

    def test_numpy_scalars_become_python(self):
        """numpy scalars in arguments are written as plain numbers."""
        tree, _ = to_tree(Node(value=[np.int64(3), np.float32(0.5), np.bool_(True)]))
        assert tree.args["value"] == [3, 0.5, True]
        assert [type(v) for v in tree.args["value"]] == [int, float, bool]

    def test_tuples_become_lists(self):
        """Tuples are written as YAML lists."""
        assert to_tree(Node(value=(1, 2)))[0].args["value"] == [1, 2]

    @pytest.mark.parametrize("value, message", [
        (object(), "value: cannot save a value of type builtins.object"),
        ({(1, 2): 3}, "value: mapping key (1, 2) is not a YAML scalar"),
        (np.zeros(2), "value: a numpy array in a constructor argument is not saved"),
    ])
    def test_unsaveable_values(self, value, message):
        """Values that YAML cannot hold are SpecErrors with their path."""
        with pytest.raises(xser.SpecError) as info:
            to_tree(Node(value=value))
        assert str(info.value).startswith(message)

    def test_unregistered_object(self):
        """An object that is not a component is refused."""

        class Foreign:
            pass

        with pytest.raises(xser.SpecError, match="encoder: cannot save a value of type .*Foreign"):
            to_tree(Model(encoder=Foreign()))

    def test_hook_must_return_known_args(self):
        """xser_saved_args may only return constructor arguments."""

        @xser.serializable(tag="!SerHook")
        class Hooked:
            a: int = 1

            def xser_saved_args(self, args):
                return {"a": 1, "b": 2}

        try:
            with pytest.raises(xser.RegistryError, match=r"returned unknown argument\(s\) 'b'"):
                to_tree(Hooked())
        finally:
            from xser.model.registry import _unregister

            _unregister("!SerHook")
