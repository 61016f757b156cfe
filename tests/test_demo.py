"""The demo model: training improves it, saving keeps only parameters and running statistics."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import xser
from xser import demo


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One run of the bundled demo, shared by the tests that only read what it wrote: (its directory, its result)."""
    from xser.cli import _default_config

    out = tmp_path_factory.mktemp("demo")
    return out, demo.run(_default_config(), str(out), say=lambda s: None)


def test_training_beats_chance_and_round_trips(ran):
    """The demo learns (accuracy well above 1/3) and the saved model predicts identically."""
    tmp_path, result = ran
    assert result["accuracy"] > 0.5  # 5 classes, 20% of the training labels noise
    again = xser.load(tmp_path / "demo.yaml")
    sub = xser.read_params(tmp_path / "demo.yaml")
    names = sorted(k for params in sub.values() for k in params)
    assert names == ["W", "W", "b", "b", "running_mean", "running_var"]
    assert not hasattr(again["model"].hidden, "dW")  # gradients were not saved
    assert again["train"].epochs == 20 and isinstance(again["data"], demo.SyntheticData)


def _claims(rows):
    """(last checkpoint, the others, their mean, the average, the ensemble) as (test accuracy, test log-loss) pairs."""
    by = {label.split(" (")[0].split(" of ")[0]: (acc, loss) for label, acc, loss in rows}
    others = [(acc, loss) for label, acc, loss in rows if label.startswith("checkpoint ") and not label.startswith("checkpoint 0 ")]
    return by["checkpoint 0"], others, by["mean"], by["average"], by["ensemble"]


def test_averaging_and_ensembling_help(ran):
    """The demo is an honest showcase: its average and its ensemble beat the last checkpoint and the mean checkpoint,
    on accuracy and on log-loss, and the last checkpoint is not the worst of the five (on either)."""
    tmp_path, result = ran
    rows = result["rows"]
    assert len(rows) == 8
    last, others, mean, avg, ens = _claims(rows)
    assert len(others) == 4
    assert avg[0] > max(last[0], mean[0]) and ens[0] > max(last[0], mean[0])
    assert avg[1] < min(last[1], mean[1]) and ens[1] < min(last[1], mean[1])
    assert last[0] > min(a for a, _ in others) and last[1] < max(lo for _, lo in others)
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_claims_hold_for_other_seeds(tmp_path, seed):
    """Not a lucky seed: with other shuffling seeds the average and the ensemble still beat the last and the mean
    checkpoint (which checkpoint is worst is chance there)."""
    from xser.cli import _default_config

    text = Path(_default_config()).read_text()
    assert text.count("seed: 3, weight_decay") == 2
    (tmp_path / "c.yaml").write_text(text.replace("seed: 3, weight_decay", f"seed: {seed}, weight_decay"))
    last, _, mean, avg, ens = _claims(demo.run(str(tmp_path / "c.yaml"), str(tmp_path / "out"), say=lambda s: None)["rows"])
    assert avg[0] > max(last[0], mean[0]) and ens[0] > max(last[0], mean[0])
    assert avg[1] < min(last[1], mean[1]) and ens[1] < min(last[1], mean[1])


def test_the_plot_has_one_axis_per_metric(ran):
    """The demo's plot puts the training loss and the training accuracy on axes of their own."""
    pytest.importorskip("matplotlib", reason="plots need the plot extra")
    from xser.tools.trajectory import figure, trajectory

    tmp_path, _ = ran
    axes = figure(trajectory(tmp_path / "demo.yaml")).get_axes()
    assert [a.get_ylabel() for a in axes] == ["train_accuracy", "train_loss", "relative L2 distance\nto the newest checkpoint"]
    steps = [c.step for c in reversed(xser.checkpoints(tmp_path / "demo.yaml"))]
    for ax, name in zip(axes, ("train_accuracy", "train_loss")):
        (line,) = ax.get_lines()
        assert list(line.get_xdata()) == steps == [12, 14, 16, 18, 20]
        assert list(line.get_ydata()) == [c.metrics[name] for c in reversed(xser.checkpoints(tmp_path / "demo.yaml"))]


def test_resuming_equals_training_without_a_break(ran):
    """The demo stops after half the epochs and resumes: the result is what one uninterrupted run gives, bit for bit."""
    from xser.cli import _default_config

    tmp_path, _ = ran
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
