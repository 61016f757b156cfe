"""Command-line overrides of configs (xser.load_config(path, overrides=[...]), xser.split_overrides)."""

from __future__ import annotations

import ast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xser
from components import Linear
from xser.errors import did_you_mean

CONFIG = """\
small:
  lr: 0.1
  layers: !Repeat {times: 3, content: !TLinear {in_dim: 2, out_dim: 2}}
  width: !RandomParam {values: [4, 5]}
  model: !TModel
    encoder: !TLinear {in_dim: 4, out_dim: 8}
    sizes: [1, 2, 3]
big:
  model: !TModel {encoder: !TLinear {in_dim: 4, out_dim: 64}}
"""


@pytest.fixture
def config(tmp_path):
    (tmp_path / "c.yaml").write_text(CONFIG)
    return tmp_path / "c.yaml"


def test_overrides_change_what_is_built(config):
    exps = xser.load_config(config, overrides=[
        "small.model.encoder.out_dim=64", "small.lr=1e-3", "small.model.sizes.1=7", "small.model.dropout=0.5",
        "+small.note=hello", "~small.model.sizes.2", "big.model.encoder=!TLinear {in_dim: 2, out_dim: 3}",
    ])
    small = xser.build(exps["small"])
    assert small["model"].encoder.W.shape == (64, 4) and small["lr"] == 1e-3 and small["note"] == "hello"
    assert small["model"].sizes == [1, 7] and small["model"].dropout == 0.5
    big = xser.build(exps["big"])
    assert isinstance(big["model"].encoder, Linear) and big["model"].encoder.W.shape == (3, 2)
    assert xser.build(xser.load_config(config)["small"])["model"].encoder.W.shape == (8, 4)  # the file is unchanged


ERRORS = [
    ("smal.lr=1", "override 1 'smal.lr=1': unknown experiment 'smal' (experiments: small, big); did you mean 'small'?"),
    ("small.model.encoder.out_dm=3", "override 1 'small.model.encoder.out_dm=3': small.model.encoder: !TLinear has no "
     "argument 'out_dm'; did you mean 'out_dim'?"),
    ("small.lrr=1", "override 1 'small.lrr=1': small: no key 'lrr' (keys: lr, layers, width, model); did you mean 'lr'?; "
     "+small.lrr=VALUE adds one"),
    ("small.model.sizes.9=1", "override 1 'small.model.sizes.9=1': small.model.sizes has 3 items, no index 9"),
    ("small.lr.x=1", "override 1 'small.lr.x=1': small.lr is float 0.1, not a mapping, component or list: nothing to set inside"),
    ("small.lr", "override 1 'small.lr': an override is path=value (or +path=value to add a key, ~path to remove one)"),
    ("+small.lr=2", "override 1 '+small.lr=2': small.lr exists: set it without '+'"),
    ("small=1", "override 1 'small=1': small: give a key inside the experiment (for example small.model.dim=4)"),
    # a value that starts with a placeholder: YAML reads '{' as a mapping; no line:column of a one-line value
    ("small.out={EXP_DIR}/x", "override 1 'small.out={EXP_DIR}/x': value '{EXP_DIR}/x' (character 10): YAML syntax error: "
     "expected '<document start>', but found ('<scalar>',); a value that starts with a placeholder is a string only in "
     """quotes: small.out="{EXP_DIR}/x" (on a shell, in single quotes around it all: 'small.out="{EXP_DIR}/x"')"""),
    ("small.out={EXP_DIR}", "override 1 'small.out={EXP_DIR}': value '{EXP_DIR}' is YAML for a mapping {'EXP_DIR': None}; a "
     """value that starts with a placeholder is a string only in quotes: small.out="{EXP_DIR}" (on a shell, in single """
     """quotes around it all: 'small.out="{EXP_DIR}"')"""),
    ("+small.out={{EXP}}-{PID}", "override 1 '+small.out={{EXP}}-{PID}': value '{{EXP}}-{PID}' (character 8): YAML syntax error: "
     "expected '<document start>', but found ('<scalar>',); a value that starts with a placeholder is a string only in "
     """quotes: +small.out="{{EXP}}-{PID}" (on a shell, in single quotes around it all: '+small.out="{{EXP}}-{PID}"')"""),
    ("small.lr=[1,", "override 1 'small.lr=[1,': value '[1,' (character 4): YAML syntax error: expected the node content, "
     "but found '<stream end>' (while parsing a flow node)"),
    ("small.layers.tims=2", "override 1 'small.layers.tims=2': small.layers: !Repeat has no argument 'tims'; did you mean 'times'?"),
    ("small.width.valus=[2]", "override 1 'small.width.valus=[2]': small.width: !RandomParam has no argument 'valus'; did you "
     "mean 'values'?"),
]


@pytest.mark.parametrize("override, message", ERRORS)
def test_override_errors(config, override, message):
    with pytest.raises(xser.SpecError) as info:
        xser.load_config(config, overrides=[override])
    assert str(info.value) == message


def test_override_values_are_type_checked_at_the_override(config):
    exps = xser.load_config(config, overrides=["small.model.encoder.out_dim=wide"])
    with pytest.raises(xser.SpecError) as info:
        xser.build(exps["small"])
    assert str(info.value) == "override 1 'small.model.encoder.out_dim=wide': model.encoder.out_dim: expected int, got str 'wide'"


def test_unknown_experiment_lists_the_experiments(config):
    with pytest.raises(xser.SpecError) as info:
        xser.load_config(config)["smal"]
    assert str(info.value) == f"{config}: no experiment 'smal' in this config (experiments: small, big); did you mean 'small'?"


def test_split_overrides():
    assert xser.split_overrides(["--epochs", "3", "small.lr=0.1", "+small.x=1", "~small.y", "out/dir", "--name=x"]) == (
        ["small.lr=0.1", "+small.x=1", "~small.y"], ["--epochs", "3", "out/dir", "--name=x"])


def test_overrides_into_repeat_and_random_param(config):
    """!Repeat and !RandomParam take overrides of their own arguments and of what they hold."""
    exps = xser.load_config(config, overrides=["small.layers.times=2", "small.layers.content.out_dim=8", "small.width.values=[7]"])
    small = xser.build(exps["small"], seed=0)
    assert [layer.W.shape for layer in small["layers"]] == [(8, 2), (8, 2)] and small["width"] == 7


@pytest.mark.parametrize("value, built", [('"{EXP_DIR}/x"', "{dir}/x"), ("'{EXP}-{PID}'", "small-{pid}"), ("a{EXP}", "asmall")])
def test_quoted_placeholder_values(config, value, built):
    import os

    small = xser.build(xser.load_config(config, overrides=[f"+small.out={value}"])["small"])
    assert small["out"] == built.format(dir=config.parent, pid=os.getpid())


def test_errors_inside_a_value_name_the_override_and_the_key(config):
    exps = xser.load_config(config, overrides=["small.model.sizes=[1, x]"])
    with pytest.raises(xser.SpecError) as info:
        xser.build(exps["small"])
    assert str(info.value) == "override 1 'small.model.sizes=[1, x]': model.sizes.1: expected int, got str 'x'"


@settings(max_examples=200, deadline=None)
@given(word=st.text(min_size=1, max_size=8), others=st.lists(st.text(max_size=8), max_size=6))
def test_did_you_mean_never_proposes_the_rejected_word(word, others):
    for choices in (others + [word], [word] + others, [word, word.upper(), word.lower()] + others):
        hint = did_you_mean(word, choices)
        assert hint == "" or hint.startswith("; did you mean ") and hint != f"; did you mean {word!r}?"
        if hint:
            assert ast.literal_eval(hint[len("; did you mean "):-1]) in choices


def test_builtin_tags_are_not_offered_as_components():
    from xser.model.registry import lookup

    with pytest.raises(xser.SpecError) as info:
        lookup("!Repeat")
    assert str(info.value) == "!Repeat is one of xser's own tags (arguments: times, content), not a component class; it cannot be used here"
    with pytest.raises(xser.SpecError) as info:
        lookup("!repeat")
    assert str(info.value) == "unknown component '!repeat'; did you mean '!Repeat'?"
