"""Component classes shared by the tests (registered once, on import)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

import xser
from xser.storage.formats.npy import parse_dtype


@xser.serializable(tag="!TLinear")
class Linear:
    in_dim: int
    out_dim: int
    init: str = "glorot_uniform"

    def __attrs_post_init__(self):
        p = xser.params(self)
        self.W = p.add("W", (self.out_dim, self.in_dim), init=self.init)
        self.b = p.add("b", (self.out_dim,), init="zeros")


@xser.serializable(tag="!TNorm")
class Norm:
    """Running statistics: persistent, not trainable."""

    dim: int

    def __attrs_post_init__(self):
        p = xser.params(self)
        self.mean = p.add("running_mean", (self.dim,), init="zeros", trainable=False)
        self.count = p.add("count", (), init="zeros", dtype="int64", trainable=False)


@xser.serializable(tag="!TModel")
class Model:
    encoder: Any
    decoder: Any = None
    dropout: float = 0.1
    activation: Literal["relu", "tanh"] = "relu"
    sizes: list[int] = [1, 2]
    name: str | None = None


@xser.serializable(tag="!TNode")
class Node:
    """A generic tree node without parameters."""

    value: Any = None
    children: list = []


@xser.serializable(tag="!TLeaf")
class Leaf:
    """A component whose parameters are described by its arguments: {name: [dtype, shape]}."""

    spec: dict

    def __attrs_post_init__(self):
        p = xser.params(self)
        for name, (descr, shape) in self.spec.items():
            dtype = parse_dtype(descr)
            p.add(name, tuple(shape), dtype=dtype, init=np.zeros(tuple(shape), dtype))


@xser.serializable(tag="!TVocab")
class Vocab:
    """Given a file name in a config, saved as an explicit list (the processed-argument hook)."""

    vocab_file: str | None = None
    words: list[str] | None = None

    def __attrs_post_init__(self):
        if self.words is None and self.vocab_file is not None:
            with open(self.vocab_file, encoding="utf-8") as f:
                self.words = [line.strip() for line in f if line.strip()]

    def xser_saved_args(self, args):
        return {"vocab_file": None, "words": list(self.words or [])}


@xser.serializable(tag="!TCounter")
class Counter:
    """Counts calls of its initialiser, to prove loads never initialise."""

    calls = 0
    dim: int = 3

    def __attrs_post_init__(self):
        def init(shape, rng):
            Counter.calls += 1
            return np.full(shape, 7.0)

        xser.params(self).add("w", (self.dim,), init=init)
