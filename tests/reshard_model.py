"""The models of the resharding tests (``test_reshard.py``, ``reshard_child.py``, the tools' tests on checkpoints saved
by several ranks): every kind of state a rank holds; ``save`` saves one from N ranks in threads.

``Shard`` holds rows of ``W`` (each rank its share, ``xser.dist.rows``), a replicated ``b``, and a hash table ``emb``
(with an optimizer slot) sharded by id with RecIS's rule over ``SLICE["size"]`` buckets (a module setting, not a
constructor argument, so that a test loads with another slice size than the save's). Every value is a function of
the global row or id and the step, so any rank at any world size knows what it must hold.
"""

from __future__ import annotations

import numpy as np

import xser
import xser.dist
from threaded import run

ROWS, COLS, DIM = 23, 3, 4
#: the table's slice size, read when a Shard is made (tests change it between save and load; None: no slice)
SLICE = {"size": 12}
#: every id of the table: dense small ones, negative ones, and ones near the int64 limits
ALL_IDS = np.unique(np.concatenate([np.arange(0, 61), -np.arange(1, 40, 3), [2**62 + 5, -(2**62) - 7, 2**63 - 1, -(2**63)],
                                    np.random.default_rng(7).integers(-(10**12), 10**12, 40)])).astype(np.int64)


def w_rows(step: int, a: int, b: int, cols: int = COLS) -> np.ndarray:
    return np.arange(a, b, dtype=np.float32)[:, None] * 10 + np.arange(cols, dtype=np.float32) + step * 1000


def t_rows(step: int, ids: np.ndarray, dim: int = DIM) -> np.ndarray:
    return (ids % 1000).astype(np.float32)[:, None] * np.linspace(-1, 1, dim, dtype=np.float32) + step


def slice_of(c) -> xser.IdSlice | None:
    """This rank's slice at the current slice size (None: the table is declared without one)."""
    size = SLICE["size"]
    return None if size is None else xser.IdSlice(*xser.dist.rows(size, c), size)


@xser.serializable(tag="!ReshardShard")
class Shard:
    rows: int = ROWS
    cols: int = COLS
    dim: int = DIM

    def __attrs_post_init__(self):
        p = xser.params(self)
        self.W = p.add("W", (self.rows, self.cols), rows=xser.dist.rows(self.rows))
        self.b = p.add("b", (self.cols,))
        self.emb = p.add_table("emb", self.dim, slots=("m",), slice=slice_of(xser.dist.current()))


@xser.serializable(tag="!ReshardRows")
class Rows:
    """Float32 arrays only (what DyNet/XNMT, DiSMEC++ and Angel hold): rows of ``W`` per rank and a replicated ``b``."""

    rows: int = ROWS
    cols: int = COLS

    def __attrs_post_init__(self):
        p = xser.params(self)
        self.W = p.add("W", (self.rows, self.cols), rows=xser.dist.rows(self.rows))
        self.b = p.add("b", (self.cols,))


def fill(m, c, step: int, ids: np.ndarray = ALL_IDS) -> None:
    a, b = xser.dist.rows(m.rows, c)
    m.W[...] = w_rows(step, a, b, m.cols)
    m.b[...] = np.arange(m.cols, dtype=np.float32) + step
    if not hasattr(m, "emb"):
        return
    mine = np.sort(ids[slice_of(c).mask(ids)]) if slice_of(c) is not None else np.sort(ids)
    if mine.size:
        m.emb.set(mine, t_rows(step, mine, m.dim))
        m.emb.set(mine, -t_rows(step, mine, m.dim), slot="m")


def problems(m, c, step: int, ids: np.ndarray = ALL_IDS) -> list[str]:
    """What differs from step ``step``'s values at this rank's share (at the current slice size)."""
    a, b = xser.dist.rows(m.rows, c)
    out = []
    if m.W.shape != (b - a, m.cols) or not np.array_equal(m.W, w_rows(step, a, b, m.cols)):
        out.append(f"W rows {a}:{b} differ")
    if not np.array_equal(m.b, np.arange(m.cols, dtype=np.float32) + step):
        out.append("b differs")
    if not hasattr(m, "emb"):
        return out
    mine = np.sort(ids[slice_of(c).mask(ids)]) if slice_of(c) is not None else np.sort(ids)
    if not np.array_equal(m.emb.ids, mine):
        out.append(f"emb ids {m.emb.ids.tolist()} != {mine.tolist()}")
    elif mine.size and (not np.array_equal(m.emb.get(mine), t_rows(step, mine, m.dim))
                        or not np.array_equal(m.emb.get(mine, slot="m"), -t_rows(step, mine, m.dim))):
        out.append("emb rows differ")
    return out


def save(path: str, n: int, *, steps: int = 1, state: bool | list = True, training: bool = True, blocks=None, ids=ALL_IDS,
         make=Shard) -> str:
    """A checkpoint of ``make()`` saved by ``n`` ranks (threads) at steps 1..steps, with a CheckpointSaver (keep 3);
    ``state``: which ranks pass a training state (all, none, or a list of ranks); each passes its own ``training``
    dict (``{"rank": r, "epoch": 7}``) unless ``training`` is False."""

    def one(c):
        m = make()
        with xser.CheckpointSaver(path, keep=3, durable=False, coordinator=c, blocks=blocks) as s:
            for step in range(1, steps + 1):
                fill(m, c, step, ids)
                has = state is True or (isinstance(state, list) and c.rank in state)
                s.save(m, step=step, training={"rank": c.rank, "epoch": 7} if training else None,
                       training_state={"rng": np.full(3, 100 * c.rank + step, np.int64)} if has else None)

    run(n, one)
    return path
