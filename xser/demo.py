"""The bundled demo: a two-layer classifier on synthetic data, in plain numpy.

``xser demo OUTDIR`` builds the experiment in ``configs/demo.yaml`` and trains it with
minibatch SGD in two runs (the second resumes the first from its checkpoint: model,
optimizer position and step), saves checkpoints with a dev metric, loads the model back and
checks that it predicts exactly what the trained one did. Then it averages the kept
checkpoints, converts them into independent models, ensembles those, prints a table of test
accuracy and log-loss, and draws ``xser inspect --plot`` next to it. The task (overlapping
classes, 20% label noise) and the training (a constant learning rate, weight decay so that the
network does not learn the noise) leave SGD's late checkpoints scattered around a minimum, which is
where averaging and ensembling them help.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

import xser
from xser.storage.fsutil import makedirs_durable
from xser.storage.stores import store_for

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
    label_noise: float = 0.0  # this share of the training labels is replaced by random classes

    def splits(self):
        rng = np.random.default_rng(self.seed)
        centres = rng.normal(0.0, self.spread, (self.n_classes, self.in_dim))
        scale = rng.uniform(0.5, 5.0, self.in_dim)  # unevenly scaled features: standardising helps
        offset = rng.normal(0.0, 3.0, self.in_dim)

        def draw(n):
            y = rng.integers(0, self.n_classes, n)
            x = (centres[y] + rng.normal(0.0, 1.0, (n, self.in_dim))) * scale + offset
            return x.astype(np.float32), y

        (xtr, ytr), test = draw(self.n_train), draw(self.n_test)
        flip = rng.random(len(ytr)) < self.label_noise
        ytr = np.where(flip, rng.integers(0, self.n_classes, len(ytr)), ytr)
        return (xtr, ytr), test


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

    def step(self, x, y, lr, weight_decay=0.0):
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
            layer.W -= lr * (layer.dW + weight_decay * layer.W)  # in place: the declared arrays are what gets saved
            layer.b -= lr * layer.db
        return float(loss)


@xser.serializable(tag="!DemoSGD")
class SGD:
    """Minibatch SGD with a constant learning rate and weight decay (an L2 penalty on the weight matrices)."""

    epochs: int
    learning_rate: float
    batch_size: int = 32
    seed: int = 0
    weight_decay: float = 0.0

    def train(self, model: Classifier, x, y, report: Callable[[int, float], None], *, first: int = 1, last: int | None = None,
              rng_state: dict | None = None) -> dict:
        """Epochs ``first`` to ``last``; returns the shuffling generator's state, so a resumed run goes on identically."""
        rng = np.random.default_rng(self.seed)
        if rng_state is not None:
            rng.bit_generator.state = rng_state
        for epoch in range(first, (last or self.epochs) + 1):
            order = rng.permutation(len(y))
            losses = [
                model.step(x[idx], y[idx], self.learning_rate, self.weight_decay)
                for idx in (order[i : i + self.batch_size] for i in range(0, len(y), self.batch_size))
            ]
            report(epoch, float(np.mean(losses)), rng.bit_generator.state)
        return rng.bit_generator.state


def accuracy(model: Classifier, x, y) -> float:
    return float((model.predict(x) == y).mean())


def _bytes(path: str) -> int:
    return sum(store_for(path).list(path).values())


def log_loss(probs: np.ndarray, y) -> float:
    return float(-np.log(probs[np.arange(len(y)), y] + 1e-12).mean())


def probabilities(model: Classifier, x) -> np.ndarray:
    logits = model.forward(x)
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return p / p.sum(axis=1, keepdims=True)


def ensemble_predict(ens: xser.Ensemble, x) -> np.ndarray:
    """Average the members' class probabilities (combining outputs is model code, not xser's)."""
    return np.mean([probabilities(member["model"], x) for member in ens.members], axis=0).argmax(axis=1)


def run(config: str, outdir: str, experiment: str | None = None, say: Callable[[str], None] = print) -> dict:
    """Train with checkpoints (resuming once), save, load, average, convert and ensemble.

    Returns ``{"accuracy": final test accuracy, "rows": [(label, test accuracy, test log-loss), ...]}``.
    """
    from .tools.average import average
    from .tools.convert import convert_all
    from .tools.ensemble import ensemble

    experiments = xser.load_config(config)
    name = experiment or next(iter(experiments))
    if name not in experiments:
        raise xser.SpecError(f"no experiment {name!r} in {config} (has: {', '.join(experiments)})")
    outdir = os.path.abspath(outdir)
    try:
        makedirs_durable(outdir, durable=False)
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
    every = max(1, trainer.epochs // 10)
    stop = trainer.epochs // 2
    for attempt in ("first run", "second run"):  # the same loop twice: the second resumes the first
        run = xser.resume(path) if attempt == "second run" else None
        if run is None:
            first, rng_state = 1, None
        else:
            exp, rng_state, first = run.model, run.training_state["shuffle"], run.step + 1
            model = exp["model"]
            say(f"  {attempt}: resumed from {os.path.basename(run.checkpoint.path)} at epoch {run.step}")
        with xser.CheckpointSaver(path, keep=5, restart=attempt == "first run") as saver:

            def report(epoch, loss, state):
                if epoch % every == 0 or epoch == trainer.epochs:
                    train_acc = accuracy(model, xtr, ytr)
                    saver.save(exp, step=epoch, metrics={"train_loss": loss, "train_accuracy": train_acc}, training_state={"shuffle": state})
                    say(f"  epoch {epoch:3d}  loss {loss:.4f}  train accuracy {train_acc:.3f}  (checkpoint saved)")

            trainer.train(model, xtr, ytr, report, first=first, last=stop if attempt == "first run" else None, rng_state=rng_state)
        if attempt == "first run":
            say(f"  first run stops after epoch {stop} (as a job that ran out of time would)")
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
        p = probabilities(xser.load(path, checkpoint=c.index)["model"], xte)
        rows.append((f"checkpoint {c.index} (epoch {c.step})", float((p.argmax(1) == yte).mean()), log_loss(p, yte)))
    mean_acc, mean_loss = float(np.mean([r[1] for r in rows])), float(np.mean([r[2] for r in rows]))
    p = probabilities(xser.load(avg_path)["model"], xte)
    rows.append((f"mean of the {len(converted)} checkpoints", mean_acc, mean_loss))
    rows.append((f"average of {len(converted)} checkpoints", float((p.argmax(1) == yte).mean()), log_loss(p, yte)))
    ens = xser.load(ens_path)
    p = np.mean([probabilities(member["model"], xte) for member in ens.members], axis=0)
    rows.append((f"ensemble of {len(ens.members)} checkpoints", float((p.argmax(1) == yte).mean()), log_loss(p, yte)))
    width = max(len(r[0]) for r in rows)
    say("")
    say(f"  {'model':<{width}}  test accuracy  test log-loss")
    for label, value, loss in rows:
        say(f"  {label:<{width}}  {value:13.3f}  {loss:13.3f}")
    say("")
    say(f"average: {avg_path}; converted checkpoints: {os.path.dirname(converted[0].out)}/; ensemble: {ens_path}")
    try:
        from .tools.trajectory import plot, trajectory

        plot(trajectory(path), f"{root}.png")
        say(f"plot of the checkpoints (metrics, distance to the newest): {root}.png")
    except xser.DataError as e:
        say(f"no plot: {e.message}")
    say(f"inspect them with: xser inspect {path}")
    return {"accuracy": acc, "rows": rows}
