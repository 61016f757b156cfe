"""Command-line overrides of configs (xser.load_config(path, overrides=[...]), xser.split_overrides)."""

from __future__ import annotations

import pytest

import xser
from components import Linear

CONFIG = """\
small:
  lr: 0.1
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
    ("small.lrr=1", "override 1 'small.lrr=1': small: no key 'lrr' (keys: lr, model); did you mean 'lr'?; +small.lrr=VALUE adds one"),
    ("small.model.sizes.9=1", "override 1 'small.model.sizes.9=1': small.model.sizes has 3 items, no index 9"),
    ("small.lr.x=1", "override 1 'small.lr.x=1': small.lr is float 0.1, not a mapping, component or list: nothing to set inside"),
    ("small.lr", "override 1 'small.lr': an override is path=value (or +path=value to add a key, ~path to remove one)"),
    ("+small.lr=2", "override 1 '+small.lr=2': small.lr exists: set it without '+'"),
    ("small=1", "override 1 'small=1': small: give a key inside the experiment (for example small.model.dim=4)"),
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
