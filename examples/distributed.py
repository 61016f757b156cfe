"""Save one checkpoint from every rank of a job, then load it back at any world size.

Run on the CPU with two processes:

    torchrun --nproc-per-node 2 examples/distributed.py out/dist/model.yaml

Each rank holds its rows of a large matrix (``add(..., rows=)``), its ids of an embedding table
(``add_table(..., slice=)``: RecIS's ``id % size`` rule), a replicated bias, and its own RNG state.
Every rank writes its own part; rank 0 checks that the parts tile, writes the manifest and commits once.
"""

import sys

import numpy as np
import torch.distributed as dist

import xser
import xser.dist


@xser.serializable
class Ranker:
    rows: int = 1000
    dim: int = 16
    buckets: int = 64

    def __attrs_post_init__(self):
        p = xser.params(self)
        self.W = p.add("W", (self.rows, self.dim), rows=xser.dist.rows(self.rows), init="glorot_uniform")
        self.b = p.add("b", (self.dim,))  # replicated: every rank holds the same values
        self.emb = p.add_table("emb", self.dim, slice=xser.IdSlice(*xser.dist.rows(self.buckets), self.buckets))


def main(path: str) -> None:
    dist.init_process_group("gloo")  # torchrun gives rank, world size and the rendezvous
    c = xser.dist.TorchDistributed(timeout=60)
    with xser.dist.using(c):  # what xser.dist.rows() sees while the model is built
        model = Ranker()
    mine = xser.IdSlice(*xser.dist.rows(64, c), 64)  # the ids this rank serves
    rng = np.random.default_rng(c.rank)
    with xser.CheckpointSaver(path, keep=2, coordinator=c) as saver:
        for step in range(1, 4):
            model.W += 0.01  # a training step
            batch = rng.integers(0, 10_000, 256)
            model.emb.get(batch[mine.mask(batch)], insert=True)
            pending = saver.save(model, step=step, training={"seen": step * 256}, training_state={"rng": rng.integers(0, 2**31, 4)},
                                 blocking=False)
        report = pending.result()  # async: the snapshot was taken at save(); write and commit ran behind
    back = xser.load(path, coordinator=c)  # each rank reads only its rows and ids
    assert np.array_equal(back.W, model.W) and np.array_equal(back.emb.ids, model.emb.ids)
    if c.rank == 0:
        print(f"step 3 saved by {c.world_size} ranks in {report.path}; loaded back on every rank")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out/dist/model.yaml")
