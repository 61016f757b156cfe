"""Path and name resolution inside spec trees."""

import pytest

import xser
from xser.model.refs import NotFound, Resolver, parse_path
from xser.spec import parse


def resolver(text):
    doc = parse(text, "f.yaml")
    return Resolver(doc.tree, doc)


class TestResolver:
    def test_canonical_follows_refs(self):
        """A path through references resolves to where the value really is."""
        r = resolver("a: {b: !Ref {path: c}}\nc: {d: 1}\ne: !Ref {path: a.b.d}\n")
        assert r.canonical(("e",), None) == ("c", "d")

    def test_names(self):
        """xser_id names map to paths."""
        r = resolver("x: [!N {xser_id: first}]\ny: !Ref {name: first}\n")
        assert r.ids == {"first": ("x", 0)} and r.canonical(("y",), None) == ("x", 0)

    def test_not_found(self):
        """A missing step raises NotFound with the reason."""
        with pytest.raises(NotFound) as info:
            resolver("a: {b: 1}\n").canonical(("a", "c"), None)
        assert info.value.why == "a has no key 'c'"

    def test_integer_keys(self):
        """Digits in a path also find integer mapping keys."""
        assert resolver("a: {1: x}\n").canonical(("a", "1"), None) == ("a", 1)

    @pytest.mark.parametrize("text", ["a..b", ".a", "a."])
    def test_bad_paths(self, text):
        """Empty path segments are errors."""
        with pytest.raises(xser.SpecError, match="bad path"):
            parse_path(text, None)

    def test_empty_path_is_root(self):
        """'' is the root."""
        assert parse_path("", None) == ()
