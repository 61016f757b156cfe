"""The bundled demo: a two-layer classifier on synthetic data, in plain numpy.

``xser demo OUTDIR`` builds the experiment in ``configs/demo.yaml``, trains it for a
few epochs with minibatch SGD, saves it, loads it back and checks that the loaded
model predicts exactly what the trained one did.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

import xser

__all__ = ["Classifier", "Linear", "SGD", "Standardize", "SyntheticData", "run"]


@xser.serializable(tag="!DemoData")
class SyntheticData:
    """Gaussian blobs, one per class; deterministic given ``seed``."""

    n_train: int
    n_test: int
    in_dim: int
    n_classes: int
    seed: int = 0
    spread: float = 1.0

    def splits(self):
        rng = np.random.default_rng(self.seed)
        centres = rng.normal(0.0, self.spread, (self.n_classes, self.in_dim))
        scale = rng.uniform(0.5, 5.0, self.in_dim)  # unevenly scaled features: standardising helps
        offset = rng.normal(0.0, 3.0, self.in_dim)

        def draw(n):
            y = rng.integers(0, self.n_classes, n)
            x = (centres[y] + rng.normal(0.0, 1.0, (n, self.in_dim))) * scale + offset
            return x.astype(np.float32), y

        return draw(self.n_train), draw(self.n_test)


@xser.serializable(tag="!DemoStandardize")
class Standardize:
    """Feature standardisation with running statistics: persistent state, not trainable."""

    dim: int
    momentum: float = 0.1

    def __attrs_post_init__(self):
        p = xser.params(self)
        self.mean = p.add("running_mean", (self.dim,), init="zeros", trainable=False)
        self.var = p.add("running_var", (self.dim,), init="ones", trainable=False)

    def forward(self, x, training):
        if training:
            self.mean += self.momentum * (x.mean(axis=0) - self.mean)
            self.var += self.momentum * (x.var(axis=0) - self.var)
        return (x - self.mean) / np.sqrt(self.var + 1e-5)


@xser.serializable(tag="!DemoLinear")
class Linear:
    in_dim: int
    out_dim: int
    init: str = "glorot_uniform"

    def __attrs_post_init__(self):
        p = xser.params(self)
        self.W = p.add("W", (self.out_dim, self.in_dim), init=self.init)
        self.b = p.add("b", (self.out_dim,), init="zeros")

    def forward(self, x):
        self.x = x  # activation cache: lives on the object, never saved
        return x @ self.W.T + self.b

    def backward(self, grad):
        self.dW = grad.T @ self.x  # gradients: never saved either
        self.db = grad.sum(axis=0)
        return grad @ self.W


@xser.serializable(tag="!DemoClassifier")
class Classifier:
    standardize: Standardize
    hidden: Linear
    output: Linear

    def forward(self, x, training=False):
        h = self.hidden.forward(self.standardize.forward(x, training))
        self.mask = h > 0
        return self.output.forward(h * self.mask)

    def predict(self, x):
        return self.forward(x).argmax(axis=1)

    def step(self, x, y, lr):
        logits = self.forward(x, training=True)
        logits = logits - logits.max(axis=1, keepdims=True)
        prob = np.exp(logits)
        prob /= prob.sum(axis=1, keepdims=True)
        loss = -np.log(prob[np.arange(len(y)), y] + 1e-12).mean()
        grad = prob
        grad[np.arange(len(y)), y] -= 1.0
        grad /= len(y)
        gh = self.output.backward(grad) * self.mask
        self.hidden.backward(gh)
        for layer in (self.hidden, self.output):
            layer.W -= lr * layer.dW  # in place: the declared arrays are what gets saved
            layer.b -= lr * layer.db
        return float(loss)


@xser.serializable(tag="!DemoSGD")
class SGD:
    epochs: int
    learning_rate: float
    batch_size: int = 32
    seed: int = 0

    def train(self, model: Classifier, x, y, report: Callable[[int, float], None]) -> None:
        rng = np.random.default_rng(self.seed)
        for epoch in range(1, self.epochs + 1):
            order = rng.permutation(len(y))
            losses = [
                model.step(x[idx], y[idx], self.learning_rate)
                for idx in (order[i : i + self.batch_size] for i in range(0, len(y), self.batch_size))
            ]
            report(epoch, float(np.mean(losses)))


def accuracy(model: Classifier, x, y) -> float:
    return float((model.predict(x) == y).mean())


def _bytes(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total


def probabilities(model: Classifier, x) -> np.ndarray:
    logits = model.forward(x)
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return p / p.sum(axis=1, keepdims=True)


def ensemble_predict(ens: xser.Ensemble, x) -> np.ndarray:
    """Average the members' class probabilities (combining outputs is model code, not xser's)."""
    return np.mean([probabilities(member["model"], x) for member in ens.members], axis=0).argmax(axis=1)


def run(config: str, outdir: str, experiment: str | None = None, say: Callable[[str], None] = print) -> float:
    """Train with checkpoints, save, load, average, convert and ensemble; returns the final test accuracy."""
    from .tools.average import average
    from .tools.convert import convert_all
    from .tools.ensemble import ensemble

    experiments = xser.load_config(config)
    name = experiment or next(iter(experiments))
    if name not in experiments:
        raise xser.SpecError(f"no experiment {name!r} in {config} (has: {', '.join(experiments)})")
    outdir = os.path.abspath(outdir)
    try:
        os.makedirs(outdir, exist_ok=True)
    except OSError as e:
        raise xser.CheckpointError(f"cannot make the output directory: {e.strerror or e}", xser.Location(e.filename or outdir)) from None
    exp = xser.build(experiments[name], placeholders={"OUT": outdir}, seed=0)
    data, model, trainer = exp["data"], exp["model"], exp["train"]
    (xtr, ytr), (xte, yte) = data.splits()
    n_params = sum(a.size for layer in (model.hidden, model.output) for _, a in xser.params(layer).items())
    say(f"experiment {name!r} from {config}")
    say(f"  data: {len(ytr)} training and {len(yte)} test points, {data.in_dim} features, {data.n_classes} classes")
    say(f"  model: {data.in_dim} -> {model.hidden.out_dim} -> {model.output.out_dim}, {n_params} trainable parameters")
    say(f"  test accuracy before training: {accuracy(model, xte, yte):.3f}")
    path = exp["model_file"]
    every = max(1, trainer.epochs // 5)
    with xser.CheckpointSaver(path, keep=5, restart=True) as saver:

        def report(epoch, loss):
            train_acc = accuracy(model, xtr, ytr)
            if epoch % every == 0 or epoch == trainer.epochs:
                saver.save(exp, step=epoch, metrics={"loss": loss, "train_accuracy": train_acc})
                say(f"  epoch {epoch:3d}  loss {loss:.4f}  train accuracy {train_acc:.3f}  (checkpoint saved)")

        trainer.train(model, xtr, ytr, report)
    acc = accuracy(model, xte, yte)
    predictions = model.predict(xte)
    say(f"  test accuracy after training: {acc:.3f}")
    say(f"saved {path} with checkpoints {', '.join(os.path.basename(c.path) for c in xser.checkpoints(path))}")
    say(f"  ({_bytes(path + '.data')} bytes each: parameters and running statistics only;")
    say("   the activation caches and gradients on the objects were not saved)")
    again = xser.load(path)
    same = bool(np.array_equal(again["model"].predict(xte), predictions))
    say(f"loaded it back: predictions identical: {'yes' if same else 'NO'}")
    if not same:
        raise xser.DataError("the loaded model does not predict what the saved one did", xser.Location(path))

    root = os.path.splitext(path)[0]
    avg_path = f"{root}.avg.yaml"
    average(path, avg_path, force=True)
    converted = convert_all(path, os.path.join(outdir, "converted", os.path.basename(path)), force=True)
    ens_path = f"{root}.ensemble.yaml"
    ensemble([r.out for r in converted], ens_path, force=True)
    rows = []
    for c in xser.checkpoints(path):
        m = xser.load(path, checkpoint=c.index)["model"]
        rows.append((f"checkpoint {c.index} (epoch {c.step})", accuracy(m, xte, yte)))
    rows.append((f"average of {len(converted)} checkpoints", accuracy(xser.load(avg_path)["model"], xte, yte)))
    ens = xser.load(ens_path)
    rows.append((f"ensemble of {len(ens.members)} checkpoints", float((ensemble_predict(ens, xte) == yte).mean())))
    width = max(len(r[0]) for r in rows)
    say("")
    say(f"  {'model':<{width}}  test accuracy")
    for label, value in rows:
        say(f"  {label:<{width}}  {value:.3f}")
    say("")
    say(f"average: {avg_path}; converted checkpoints: {os.path.dirname(converted[0].out)}/; ensemble: {ens_path}")
    say(f"inspect them with: xser inspect {path}")
    return acc
