"""@serializable and the tag registry."""

import attrs
import pytest

import xser
from xser.model.registry import _unregister, info_for, lookup


class TestSerializable:
    def test_default_tag_and_attrs(self):
        """A plain class becomes an attrs class registered as !ClassName."""

        @xser.serializable
        class RegA:
            x: int = 1

        try:
            assert attrs.has(RegA) and lookup("!RegA").cls is RegA and RegA().x == 1
        finally:
            _unregister("!RegA")

    def test_duplicate_tag(self):
        """Two different classes under one tag: RegistryError naming both."""

        @xser.serializable(tag="!RegDup")
        class One:
            pass

        try:
            with pytest.raises(xser.RegistryError, match="duplicate tag !RegDup: .*Two and .*One"):

                @xser.serializable(tag="!RegDup")
                class Two:
                    pass
        finally:
            _unregister("!RegDup")

    @pytest.mark.parametrize("tag", ["!Ensemble", "!TorchModule", "!AngelMatrix", "!DismecModel", "!RecisModel",
                                     "!SafetensorsWeights"])
    def test_a_plugin_tag_is_refused_before_its_plugin_loads(self, tag):
        """xser's own components register on first use (import xser is lazy): a user class under one of their tags is
        refused at its own decorator, as it was when they registered at import, not later where the plugin loads."""
        from xser.model.adapters import PLUGIN_TAGS

        with pytest.raises(xser.RegistryError) as info:

            @xser.serializable(tag=tag)
            class Mine:
                pass
        assert str(info.value) == (f"duplicate tag {tag}: test_registry.{type(self).__name__}."
                                   f"test_a_plugin_tag_is_refused_before_its_plugin_loads.<locals>.Mine and the component "
                                   f"{PLUGIN_TAGS[tag]} registers; give test_registry.{type(self).__name__}."
                                   f"test_a_plugin_tag_is_refused_before_its_plugin_loads.<locals>.Mine its own tag: "
                                   f"@xser.serializable(tag=\"!Mine2\")")

    def test_redefinition_replaces(self):
        """Re-running the same definition (a notebook cell) replaces the registration."""

        def define():
            @xser.serializable(tag="!RegRe")
            class Same:
                y: int = 0

            return Same

        try:
            first, second = define(), define()
            assert lookup("!RegRe").cls is second and info_for(first) is None
        finally:
            _unregister("!RegRe")

    @pytest.mark.parametrize("tag", ["Bad", "!", "!a b", "!Ref", "!LoadSerialized"])
    def test_bad_tags(self, tag):
        """Tags must look like !Name and not be reserved."""
        with pytest.raises(xser.RegistryError):

            @xser.serializable(tag=tag)
            class C:
                pass

    def test_reserved_field_name(self):
        """Fields may not use the keys xser writes."""
        with pytest.raises(xser.RegistryError, match="field name 'xser_id' is reserved"):

            @xser.serializable(tag="!RegRes")
            class C:
                xser_id: str = ""

    def test_slotted_attrs_class_refused(self):
        """An attrs class with slots cannot carry xser's bookkeeping."""
        with pytest.raises(xser.RegistryError, match="slots=False"):

            @xser.serializable(tag="!RegSlots")
            @attrs.define
            class C:
                x: int = 0

    def test_version_checks(self):
        """version must be an int >= 1; migrate needs version."""
        with pytest.raises(xser.RegistryError, match="version must be an int >= 1"):
            xser.serializable(tag="!RegV", version=0)(type("C", (), {}))
        with pytest.raises(xser.RegistryError, match="migrate= needs version="):
            xser.serializable(tag="!RegV", migrate=lambda a, v: a)(type("C", (), {}))

    def test_unknown_tag_suggests(self):
        """lookup of an unknown tag suggests the closest registered one."""
        with pytest.raises(xser.SpecError, match="unknown component '!TLinaer'; did you mean '!TLinear'"):
            lookup("!TLinaer")
