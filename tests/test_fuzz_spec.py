"""Fuzzing the spec side: generated YAML-ish configs and overrides, and byte mutations of real specs.

The property is the one of ``tests/test_fuzz.py`` (whose rules and mutations this reuses): a result or an
``XserError``, within the deadline and the memory cap, no file opened outside the test's directory. The
generator builds configs from the pieces specs are made of (xser's own tags and the test components, standard
``!!`` tags, anchors and aliases, placeholders, odd scalars, flow and block layouts), so that most inputs get
past the YAML parser into references, sugar, overrides and the builder. ``--hypothesis-profile=fuzz`` runs
5,000 examples per test.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import xser
from test_fuzz import FUZZ, mutated, within_the_rules
from xser.spec import parse

TAGS = ["!TLinear", "!TModel", "!TNode", "!TLeaf", "!TNorm", "!Ref", "!Repeat", "!RandomParam", "!LoadSerialized", "!ModelPath",
        "!Nope", "!!float", "!!int", "!!str", "!!bool", "!!null", "!!binary", "!!timestamp", "!!map", "!!seq", "!!set",
        "!!omap", "!!pairs", "!!merge", "!!value", "!!python/name:os.system", "!", "!<tag:yaml.org,2002:int>"]
KEYS = ["in_dim", "out_dim", "encoder", "decoder", "dropout", "sizes", "name", "path", "default", "times", "content", "values",
        "drawn", "filename", "overwrite", "val", "xser_id", "xser_subcol_name", "xser_version", "spec", "value", "children",
        "dim", "a", "<<", "1", "~", "'q'"]
SCALARS = ["", "0", "1", "2", "-1", "1.5", "1e308", ".nan", "-.inf", "~", "null", "true", "no", "x", "enc", "'q'", '"d\\x00"',
           '"{EXP_DIR}/v"', "'{EXP}-{PID}'", "{{X}}", "99999999999999999999", "0x1F", "0o7", "-", "2001-12-14", "'<f4'",
           "Linear.0000abcd", "model.encoder", "'model.encoder'", "c.yaml", "e", "=", "'['", "*a", ":", "? x"]


def scalar() -> st.SearchStrategy[str]:
    return st.sampled_from(SCALARS)


def flow_node(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    pairs = st.lists(st.tuples(st.sampled_from(KEYS), children), max_size=4)
    mapping = pairs.map(lambda kv: "{" + ", ".join(f"{k}: {v}" for k, v in kv) + "}")
    seq = st.lists(children, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]")
    return st.one_of(mapping, seq)


@st.composite
def node(draw) -> str:
    """One flow node, with an optional tag and anchor (``&a``), that aliases (``*a``) may refer to."""
    text = draw(st.recursive(scalar(), flow_node, max_leaves=12))
    prefix = ""
    if draw(st.integers(0, 3)) == 0:
        prefix += "&a "
    if draw(st.integers(0, 1)):
        prefix += draw(st.sampled_from(TAGS)) + " "
    return prefix + text


@st.composite
def config(draw) -> str:
    """A config: experiments of block mappings whose values are flow nodes, block lists or nested block mappings."""
    lines = []
    for name in draw(st.lists(st.sampled_from(["e", "f", "1", "e.x"]), min_size=1, max_size=2, unique=True)):
        lines.append(f"{name}:")
        for key in draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True)):
            style = draw(st.integers(0, 3))
            if style == 0:
                lines.append(f"  {key}:")
                lines.extend(f"  - {draw(node())}" for _ in range(draw(st.integers(0, 3))))
            elif style == 1:
                lines.append(f"  {key}: {draw(st.sampled_from(TAGS))}")
                lines.extend(f"    {k}: {draw(node())}" for k in draw(st.lists(st.sampled_from(KEYS), max_size=3, unique=True)))
            else:
                lines.append(f"  {key}: {draw(node())}")
    return "\n".join(lines) + "\n"


@st.composite
def override(draw) -> str:
    path = ".".join(draw(st.lists(st.sampled_from(KEYS + ["e", "0", "1", "-1", ""]), min_size=1, max_size=4)))
    kind = draw(st.sampled_from(["", "+", "~"]))
    if kind == "~":
        return "~" + path
    value = draw(st.one_of(node(), st.sampled_from(["{EXP_DIR}/x", "{EXP}", "[", "{", "!Ref {name: {a: 1}}", "!!float", "a: b"])))
    return f"{kind}{path}={value}"


def load_and_build(cfg, overrides) -> None:
    for spec in xser.load_config(cfg, overrides=overrides).values():
        xser.build(spec, seed=0)


class TestGenerated:
    @FUZZ
    @given(text=config(), overrides=st.lists(override(), max_size=3))
    def test_configs_and_overrides(self, tmp_path_factory, text, overrides):
        """Generated configs, built, with generated overrides (paths into components, !Repeat, lists; values of every kind)."""
        root = tmp_path_factory.mktemp("g")
        cfg = root / "c.yaml"
        cfg.write_text(text)
        within_the_rules(lambda: load_and_build(cfg, []), root)
        within_the_rules(lambda: load_and_build(cfg, overrides), root)

    @FUZZ
    @given(text=config(), data=st.data())
    def test_mutated_generated_configs(self, tmp_path_factory, text, data):
        """The same configs with their bytes mutated: parse errors in every place, odd encodings, cut tokens."""
        root = tmp_path_factory.mktemp("g")
        cfg = root / "c.yaml"
        cfg.write_bytes(data.draw(mutated(text.encode())))
        within_the_rules(lambda: load_and_build(cfg, []), root)


class TestMutatedSpecs:
    @FUZZ
    @given(data=st.data())
    def test_overrides_of_a_real_config(self, tmp_path_factory, data):
        """Real overrides of a real config (every path kind, !Repeat and !RandomParam), their bytes mutated."""
        root = tmp_path_factory.mktemp("g")
        cfg = root / "c.yaml"
        cfg.write_text("e:\n  lr: 0.1\n  layers: !Repeat {times: 2, content: !TLinear {in_dim: 2, out_dim: 2}}\n"
                       "  width: !RandomParam {values: [4, 5]}\n  model: !TModel {encoder: !TLinear {in_dim: 2, out_dim: 3, "
                       "xser_id: x}, decoder: !Ref {name: x}, sizes: [1, 2]}\n")
        base = data.draw(st.sampled_from([
            "e.layers.times=3", "e.layers.content.out_dim=4", "e.width.values=[1, 2]", "e.model.decoder=!Ref {name: x}",
            "+e.note={EXP}", "~e.model.sizes.0", "e.model.encoder=!TLinear {in_dim: 1, out_dim: 1}", 'e.out="{EXP_DIR}/x"',
        ]))
        overrides = [data.draw(mutated(base.encode())).decode("utf-8", "replace")]
        within_the_rules(lambda: load_and_build(cfg, overrides), root)

    @FUZZ
    @given(data=st.data())
    def test_parse_of_mutated_real_specs(self, data):
        """The specs in tests/data (saved models of every format version, configs), mutated and parsed."""
        from pathlib import Path

        files = sorted(p for p in (Path(__file__).parent / "data").rglob("*.yaml") if p.is_file() and p.stat().st_size < 20000)
        victim = data.draw(st.sampled_from(files))
        raw = data.draw(mutated(victim.read_bytes()))
        try:
            parse(raw.decode("utf-8"), "f.yaml")
        except (xser.XserError, UnicodeDecodeError):
            pass


LEAKS = [  # inputs that raised other exceptions than XserError, and what they say now
    ("e:\n  a: !!float\n", "c.yaml:2:6: bad float value '': not a YAML float"),
    ("e:\n  a: !!int ''\n", "c.yaml:2:6: bad int value '': not a YAML int"),
    ("e:\n  a: !!bool ''\n", "c.yaml:2:6: bad bool value '': not a YAML bool"),
    ("e:\n  a: !!int _\n", "c.yaml:2:6: bad int value '_': not a YAML int"),
    ("e:\n  a: !!null x\n", "c.yaml:2:6: bad null value 'x': !!null takes ~, null or nothing"),
    ("e:\n  a: !!timestamp ''\n", """c.yaml:2:6: bad timestamp value '': failed to construct timestamp from \"\""""),
    ("e:\n  m: !TModel {encoder: !TLinear {in_dim: 2, out_dim: 2, xser_id: x}, decoder: !Ref {name: {a: 1}}}\n",
     "c.yaml:2:79: m.decoder: !Ref name must be a string (an xser_id), got {'a': 1}"),
]


@pytest.mark.parametrize("text, message", LEAKS)
def test_former_leaks(tmp_path, text, message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(xser.SpecError) as info:
        load_and_build(cfg, [])
    assert str(info.value) == f"{tmp_path}/{message}"


def test_ref_with_a_mapping_for_name_in_an_override(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("e:\n  m: !TModel {encoder: !TLinear {in_dim: 2, out_dim: 2, xser_id: x}}\n")
    with pytest.raises(xser.SpecError) as info:
        load_and_build(cfg, ["e.m.decoder=!Ref {name: {a: 1}}"])
    assert str(info.value) == "override 1 'e.m.decoder=!Ref {name: {a: 1}}': m.decoder: !Ref name must be a string (an xser_id), got {'a': 1}"
