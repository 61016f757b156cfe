"""The demo model: training improves it, saving keeps only parameters and running statistics."""

import importlib.util

import numpy as np

import xser
from xser import demo


def test_training_beats_chance_and_round_trips(tmp_path):
    """The demo learns (accuracy well above 1/3) and the saved model predicts identically."""
    lines = []
    from xser.cli import _default_config

    result = demo.run(_default_config(), str(tmp_path), say=lines.append)
    assert result["accuracy"] > 0.5  # 5 classes, 20% of the training labels noise
    again = xser.load(tmp_path / "demo.yaml")
    sub = xser.read_params(tmp_path / "demo.yaml")
    names = sorted(k for params in sub.values() for k in params)
    assert names == ["W", "W", "b", "b", "running_mean", "running_var"]
    assert not hasattr(again["model"].hidden, "dW")  # gradients were not saved
    assert again["train"].epochs == 20 and isinstance(again["data"], demo.SyntheticData)


def test_averaging_and_ensembling_help(tmp_path):
    """The demo is an honest showcase: its average and its ensemble beat the last checkpoint and the mean checkpoint."""
    from xser.cli import _default_config

    rows = {label.split(" (")[0].split(" of ")[0]: (acc, loss) for label, acc, loss in demo.run(_default_config(), str(tmp_path), say=lambda s: None)["rows"]}
    last, mean, avg, ens = rows["checkpoint 0"], rows["mean"], rows["average"], rows["ensemble"]
    assert avg[0] > max(last[0], mean[0]) and ens[0] > max(last[0], mean[0])
    assert avg[1] < min(last[1], mean[1]) and ens[1] < min(last[1], mean[1])
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"


def test_resuming_equals_training_without_a_break(tmp_path):
    """The demo stops after half the epochs and resumes: the result is what one uninterrupted run gives, bit for bit."""
    from xser.cli import _default_config

    demo.run(_default_config(), str(tmp_path), say=lambda s: None)
    exp = xser.build(xser.load_config(_default_config())["demo"], placeholders={"OUT": str(tmp_path / "x")}, seed=0)
    (xtr, ytr), _ = exp["data"].splits()
    exp["train"].train(exp["model"], xtr, ytr, lambda *a: None)
    saved = xser.load(tmp_path / "demo.yaml")["model"]
    for a, b in ((saved.hidden.W, exp["model"].hidden.W), (saved.output.W, exp["model"].output.W), (saved.standardize.mean, exp["model"].standardize.mean)):
        assert np.array_equal(a, b)


def test_standardize_statistics_are_not_trainable(tmp_path):
    """Running statistics are saved as non-trainable state."""
    s = demo.Standardize(3)
    s.forward(np.ones((4, 3), np.float32), training=True)
    xser.save(s, tmp_path / "s.yaml")
    decls = xser.params(xser.load(tmp_path / "s.yaml")).decls
    assert not decls["running_mean"].trainable and not decls["running_var"].trainable
    assert np.allclose(xser.load(tmp_path / "s.yaml").mean, 0.1)
