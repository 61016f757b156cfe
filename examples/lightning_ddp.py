"""PyTorch Lightning on 2 CPU processes (DDP over gloo), its checkpoints saved as xser models, then resumed.

    torchrun --nproc-per-node 2 examples/lightning_ddp.py runs/lightning           # --async: save on a thread

A first fit runs 4 steps and checkpoints every 2 (``ModelCheckpoint(save_last=True)``); a second fit resumes from
``last.ckpt`` (``ckpt_path="last"``) and runs to step 8. Each checkpoint is a spec file (``last.ckpt``) and its data
directory (``last.ckpt.data/``): ``xser inspect runs/lightning/last.ckpt`` lists the tensors and the step,
``xser.torch.state_dict("runs/lightning/last.ckpt")`` gives the model's state_dict.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from torch.utils.data import DataLoader, TensorDataset

from xser.lightning import XserCheckpointIO


class Regressor(L.LightningModule):
    def __init__(self, dim: int = 8, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(dim, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def data() -> DataLoader:
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)  # 8 steps an epoch on each of 2 ranks


def trainer(out: str, steps: int, *, save_async: bool, callbacks: list | None = None) -> L.Trainer:
    io = XserCheckpointIO()
    return L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=steps,
        plugins=[AsyncCheckpointIO(io) if save_async else io],
        callbacks=[ModelCheckpoint(dirpath=out, save_last=True, every_n_train_steps=2), *(callbacks or [])],
        logger=False, enable_progress_bar=False, enable_model_summary=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the checkpoint directory (a local path or a URL)")
    parser.add_argument("--async", dest="save_async", action="store_true", help="save through Lightning's AsyncCheckpointIO")
    args = parser.parse_args()
    first = trainer(args.out, 4, save_async=args.save_async)
    first.fit(Regressor(), data())
    # With AsyncCheckpointIO, rank 0's fit returns once its pending saves are written; a second fit in the same
    # processes looks for "last" on every rank before its first barrier, so the other ranks wait for rank 0 here.
    first.strategy.barrier()
    second = trainer(args.out, 8, save_async=args.save_async)
    second.fit(Regressor(), data(), ckpt_path="last")  # the weights, optimizer, loops and callbacks of step 4
    if second.is_global_zero:
        print(f"resumed from {second.ckpt_path} and trained to step {second.global_step}")


if __name__ == "__main__":
    main()
