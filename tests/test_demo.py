"""The demo model: training improves it, saving keeps only parameters and running statistics."""

import numpy as np

import xser
from xser import demo


def test_training_beats_chance_and_round_trips(tmp_path):
    """The demo learns (accuracy well above 1/3) and the saved model predicts identically."""
    lines = []
    from xser.cli import _default_config

    acc = demo.run(_default_config(), str(tmp_path), say=lines.append)
    assert acc > 0.6
    again = xser.load(tmp_path / "demo.yaml")
    sub = xser.read_params(tmp_path / "demo.yaml")
    names = sorted(k for params in sub.values() for k in params)
    assert names == ["W", "W", "b", "b", "running_mean", "running_var"]
    assert not hasattr(again["model"].hidden, "dW")  # gradients were not saved
    assert again["train"].epochs == 15 and isinstance(again["data"], demo.SyntheticData)


def test_standardize_statistics_are_not_trainable(tmp_path):
    """Running statistics are saved as non-trainable state."""
    s = demo.Standardize(3)
    s.forward(np.ones((4, 3), np.float32), training=True)
    xser.save(s, tmp_path / "s.yaml")
    decls = xser.params(xser.load(tmp_path / "s.yaml")).decls
    assert not decls["running_mean"].trainable and not decls["running_var"].trainable
    assert np.allclose(xser.load(tmp_path / "s.yaml").mean, 0.1)
