"""YAML text <-> plain trees: safety, locations, and dump/parse round trips."""

from __future__ import annotations

import io
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xser
from strategies import plain
from xser.spec import Tagged, dump, parse, read
from xser.spec import yamlio
from xser.spec.yamlio import MAX_NODES

BAD = [
    ("a: !!python/object/apply:os.system [ls]\n", "f.yaml:1:4: tags that construct Python objects are never loaded: !!python/object/apply:os.system"),
    ("a: !!python/name:os.system ''\n", "f.yaml:1:4: tags that construct Python objects are never loaded: !!python/name:os.system"),
    ("a: !!set {1, 2}\n", "f.yaml:1:4: unsupported tag: !!set"),
    ("a: 1\nb: 2\na: 3\n", "f.yaml:3:1: duplicate key 'a' (first defined at line 1)"),
    ("a: [1\n", "f.yaml:2:1: YAML syntax error: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence)"),
    ("a: b: c\n", "f.yaml:1:5: YAML syntax error: mapping values are not allowed here"),
    ("a: &x [*x]\n", "f.yaml:1:4: recursive alias: a node contains itself"),
    ("a: !Foo [1]\n", "f.yaml:1:4: component !Foo must be followed by a mapping of arguments, got a list"),
    ("a: !Foo bar\n", "f.yaml:1:4: component !Foo must be followed by a mapping of arguments, got scalar 'bar'"),
    ("? [1]\n: 2\n", "f.yaml:1:3: mapping keys must be scalars"),
    ("a: *nope\n", "f.yaml:1:4: YAML syntax error: found undefined alias 'nope'"),
    ("a: !!int x\n", "f.yaml:1:4: bad int value 'x': invalid literal for int() with base 10: 'x'"),
]


class TestParse:
    @pytest.mark.parametrize("text, message", BAD, ids=[m for _, m in BAD])
    def test_bad_yaml_table(self, text, message):
        """Unsafe or malformed YAML is a SpecError with file:line:col."""
        with pytest.raises(xser.SpecError) as info:
            parse(text, "f.yaml")
        assert str(info.value) == message

    def test_alias_bomb_is_bounded(self):
        """A billion-laughs document is refused before any of it is converted (not after converting MAX_NODES nodes),
        at the innermost node that expands past MAX_NODES: a6 (10^7 nodes; a5 holds about 1.1 million)."""
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        for i in range(1, 12):
            lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
        calls = []
        real = yamlio._Converter.convert
        with mock.patch.object(yamlio._Converter, "convert", lambda self, node: calls.append(1) or real(self, node)):
            with pytest.raises(xser.SpecError) as info:
                parse("\n".join(lines) + "\n", "bomb.yaml")
        assert str(info.value) == f"bomb.yaml:7:5: document expands to more than {MAX_NODES} nodes (aliases nested too deeply?)"
        assert calls == []

    def test_aliases_just_under_the_limit_convert(self):
        """The count is of the expanded document: 1 + 10 * 11 + ... nodes under MAX_NODES still load, copied."""
        text = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\na1: &a1 [" + ", ".join(["*a0"] * 10) + "]\nb: [*a1, *a1]\n"
        tree = parse(text, "ok.yaml").tree
        assert tree["b"] == [[["x"] * 10] * 10] * 2 and tree["b"][0] is not tree["b"][1]

    def test_aliases_copy(self):
        """Anchors and aliases copy values (only !Ref shares objects)."""
        tree = parse("a: &x {k: [1]}\nb: *x\n").tree
        assert tree["a"] == tree["b"] and tree["a"] is not tree["b"]

    def test_merge_keys(self):
        """'<<' merges mappings; explicit keys win."""
        tree = parse("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  y: 3\n").tree
        assert tree["c"] == {"y": 3, "x": 1}

    def test_scalars_follow_yaml_1_2(self):
        """yes/no stay strings; ints, floats, bools and nulls are typed."""
        tree = parse("a: yes\nb: 0x10\nc: 1_000\nd: .inf\ne: ~\nf: true\ng: '12'\n").tree
        assert tree == {"a": "yes", "b": 16, "c": 1000, "d": float("inf"), "e": None, "f": True, "g": "12"}

    def test_tags_and_locations(self):
        """Tagged mappings become Tagged nodes; locations are 1-based."""
        doc = parse("x:\n  m: !Lin {a: 1}\n  e: !Empty\n", "f.yaml")
        assert doc.tree == {"x": {"m": Tagged("!Lin", {"a": 1}), "e": Tagged("!Empty", {})}}
        loc = doc.where(doc.tree["x"]["m"], "a")
        assert (loc.file, loc.line, loc.column) == ("f.yaml", 2, 15)  # the value "1"

    def test_copy_keeps_locations(self):
        """Doc.copy gives new containers that keep their locations."""
        doc = parse("x:\n  m: {a: 1}\n", "f.yaml")
        new = doc.copy(doc.tree)
        assert new == doc.tree and new["x"] is not doc.tree["x"]
        assert doc.where(new["x"]["m"], "a").line == 2

    def test_read_missing_file(self, tmp_path):
        """A missing file is a SpecError naming it."""
        with pytest.raises(xser.SpecError, match="file not found"):
            read(tmp_path / "nope.yaml")

    def test_read_not_utf8(self, tmp_path):
        """A file that is not UTF-8 is a SpecError, not a UnicodeDecodeError."""
        p = tmp_path / "bad.yaml"
        p.write_bytes(b"a: \xff\n")
        with pytest.raises(xser.SpecError, match="cannot read file"):
            read(p)


class TestDump:
    @settings(max_examples=300, deadline=None)
    @given(plain)
    def test_plain_data_round_trips(self, value):
        """Any plain data (odd strings included) dumps to YAML that parses back equal."""
        assert parse(dump({"v": value})).tree == {"v": value}

    def test_key_order_is_kept(self):
        """Keys are written in insertion order, never sorted."""
        assert dump({"b": 1, "a": Tagged("!X", {"z": 1, "y": 2})}) == "b: 1\na: !X {z: 1, y: 2}\n"

    def test_odd_strings_are_quoted(self):
        """Strings that ruamel would mangle are double-quoted."""
        for s in ["?x", ":0", "a\x85b", "a\u2028b", "-", "#x", "true", "12", ""]:
            assert parse(dump({s: s})).tree == {s: s}


class TestFastComposer:
    """libyaml (ruamel.yaml.clib) composes, the pure parser words errors: both must give the same trees."""

    SCALARS = ["yes", "no", "on", "off", "0x10", "0o17", "017", "010", "1_000", "1:30", ".inf", "-.inf", ".nan", "~",
               "Null", "TRUE", "1e3", "+1", "-0", "0b101", "2001-12-14", "=", "'x'", '"\\x41"', "!!str 5",
               "!!float 1", "0.", ".5", "+.5e2", "1_0.0_1"]

    @pytest.mark.parametrize("value", SCALARS)
    def test_scalars_resolve_the_same(self, value):
        """Implicit and explicit scalar types resolve as the pure parser resolves them (YAML 1.2 core)."""
        import xser.spec.yamlio as y

        text = f"k: {value}\n"
        fast = parse(text).tree
        saved = y._CParser
        try:
            y._CParser = None
            pure = parse(text).tree
        finally:
            y._CParser = saved
        assert repr(fast) == repr(pure)

    @settings(max_examples=300, deadline=None)
    @given(tree=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3)
        | st.builds(lambda d: Tagged("!Comp", d), st.dictionaries(st.text(min_size=1, max_size=5), c, max_size=3)),
        max_leaves=12,
    ))
    def test_dumped_trees_compose_the_same(self, tree):
        """Whatever xser dumps, both composers read back the same tree, with the same locations."""
        import xser.spec.yamlio as y

        text = dump({"x": tree})
        fast = parse(text)
        saved = y._CParser
        try:
            y._CParser = None
            pure = parse(text)
        finally:
            y._CParser = saved
        assert fast.tree == pure.tree
        assert fast.where(fast.tree, "x") == pure.where(pure.tree, "x")


def test_dump_cache_tells_apart_trees_python_calls_equal():
    """A model saved again and again renders its unchanged spec once (``dumping._RENDERED``); trees that Python
    compares equal but YAML writes differently (1, 1.0, True; 0.0 and -0.0; key order) each get their own text."""
    from xser.spec import dumping

    trees = [{"a": 1}, {"a": 1.0}, {"a": True}, {"a": 0.0}, {"a": -0.0}, {"a": 1, "b": 2}, {"b": 2, "a": 1},
             Tagged("!X", {"w": [1, 2]}), Tagged("!X", {"w": [1.0, 2]}), Tagged("!Y", {"w": [1, 2]})]
    dumping._RENDERED.clear()
    first = [dump(t) for t in trees]
    assert len(set(first)) == len(trees)
    assert len(dumping._RENDERED) == len(trees)
    assert [dump(t) for t in trees] == first
    assert first[1] == "{a: 1.0}\n" and first[4] == "{a: -0.0}\n"
    nan = float("nan")
    assert dump({"a": nan}) == dump({"a": float("nan")}) == "{a: .nan}\n"


def test_dump_cache_tells_apart_shared_and_equal_objects():
    """One object under two keys is written as an anchor and an alias, two equal objects in full: the cache keeps
    them apart whichever is rendered first (its key records which containers are one object seen again)."""
    from xser.spec import dumping

    def fresh(tree):
        out = io.StringIO()
        dumping._dumper(False).dump(tree, out)
        return out.getvalue()

    shared = Tagged("!Linear", {"n": 2})
    trees = [{"x": shared, "y": shared}, {"x": Tagged("!Linear", {"n": 2}), "y": Tagged("!Linear", {"n": 2})},
             {"x": [1], "y": [1]}]
    lst = [1]
    trees.append({"x": lst, "y": lst})
    for order in (trees, trees[::-1]):
        dumping._RENDERED.clear()
        assert [dump(t) for t in order] == [fresh(t) for t in order]
    assert "*id001" in dump(trees[0]) and "&" not in dump(trees[1])
