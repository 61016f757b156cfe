"""PyTorch Lightning: ``xser.lightning.XserCheckpointIO`` (skipped without lightning).

Unit round trips of checkpoint dicts; refusals naming the key; removal; object stores; ``AsyncCheckpointIO``; a real
``Trainer`` on 2 CPU processes (DDP over gloo, under torchrun) that checkpoints and resumes from ``ckpt_path="last"``,
with and without ``AsyncCheckpointIO``; and the README's torchrun example.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")

import xser  # noqa: E402
import xser.torch  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO  # noqa: E402
from lightning_child import difference  # noqa: E402
from xser.cli import main  # noqa: E402
from xser.lightning import XserCheckpointIO  # noqa: E402

ROOT = str(Path(xser.__file__).resolve().parent.parent)
HERE = os.path.dirname(os.path.abspath(__file__))


def checkpoint() -> dict:
    """A checkpoint dict as Lightning makes one, with every kind of value the plugin stores."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 3, generator=g)
    state_dict = OrderedDict([
        ("net.0.weight", w),
        ("net.0.bias", torch.randn(4, generator=g, dtype=torch.float64)),
        ("head.weight", w),  # tied: one tensor under two keys
        ("emb.weight", torch.randn(5, 2, generator=g).to(torch.bfloat16)),
        ("half", torch.randn(3, generator=g).half()),
        ("proj.weight", torch.randn(3, 4, generator=g).t()),  # not contiguous
        ("norm.num_batches_tracked", torch.tensor(7)),
        ("mask", torch.tensor([True, False, True])),
        ("codes", torch.arange(6, dtype=torch.uint8).reshape(2, 3)),
        ("empty", torch.zeros(0, 3)),
        ("f8", torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn)),
        ("net", torch.tensor(3)),  # a tensor beside the module of the same name; "half" and "to" are Module methods
        ("to", torch.ones(1)),
        ("net._extra_state", {"version": 2}),  # not a tensor: kept with the rest of the checkpoint
    ])
    return {
        "epoch": 1,
        "global_step": 10,
        "pytorch-lightning_version": "2.6.6",
        "state_dict": state_dict,
        "loops": {"fit_loop": {"state_dict": {}, "epoch_loop.state_dict": {"_batches_that_stepped": 10}}},
        "callbacks": {"ModelCheckpoint{'monitor': None, 'mode': 'min'}": {
            "best_model_path": "/runs/epoch=1-step=10.ckpt", "kth_value": torch.tensor(math.inf), "best_model_score": None}},
        "optimizer_states": [{
            "state": {0: {"step": torch.tensor(10.0), "exp_avg": torch.randn(4, 3, generator=g)},
                      1: {"step": torch.tensor(10.0), "exp_avg": torch.randn(4, generator=g)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8, "foreach": None, "amsgrad": False, "params": [0, 1]}],
        }],
        "lr_schedulers": [{"base_lrs": [0.1], "last_epoch": 1, "_last_lr": [0.05]}],
        "hparams_name": "kwargs",
        "hyper_parameters": {"lr": 0.1, "name": "tiny ✓", "sizes": (4, (3, [2, (1,)])), "none": None, "big": 2**70,
                             "inf": -math.inf, "nan": math.nan, "empty": {}, "nothing": [], "unit": ()},
        "extra": {"table": np.arange(6, dtype=np.float32).reshape(2, 3)},
    }


def test_round_trip_is_bit_exact(tmp_path):
    """Every tensor (dtypes, views, ties, 0-d, empty, keys of any name), the optimizer state (int keys), tuples, numbers, NaN, strings
    and numpy arrays come back as they were saved; the state_dict is an OrderedDict in its order."""
    path = str(tmp_path / "epoch=1-step=10.ckpt")
    saved = checkpoint()
    XserCheckpointIO().save_checkpoint(saved, path)
    back = XserCheckpointIO().load_checkpoint(path)
    assert difference(back, saved) is None
    assert list(back) == list(saved)
    assert type(back["state_dict"]) is OrderedDict and list(back["state_dict"]) == list(saved["state_dict"])
    assert type(back["hyper_parameters"]["sizes"][1][1][1]) is tuple
    assert back["state_dict"]["proj.weight"].is_contiguous()
    assert xser.checkpoints(path)[0].step == 10
    loaded = xser.load(path)  # the component itself, built from its spec
    assert difference(dict(loaded.state()), {k: v for k, v in saved["state_dict"].items() if isinstance(v, torch.Tensor)}) is None


def test_the_tools_read_it(tmp_path, capsys):
    """The state_dict is an ordinary xser model's parameters: the flat view has Lightning's keys (ties are one tensor),
    and inspect, avg, convert and the safetensors export work on it."""
    import safetensors.torch

    path = str(tmp_path / "last.ckpt")
    saved = checkpoint()
    XserCheckpointIO().save_checkpoint(saved, path)
    view = xser.torch.state_dict(path)
    tensors = dict(sorted((k, v) for k, v in saved["state_dict"].items() if isinstance(v, torch.Tensor)))
    assert difference(dict(sorted(view.items())), tensors) is None
    assert view["net.0.weight"] is view["head.weight"]
    assert main(["inspect", path]) == 0
    assert re.search(r"\n +head\.weight +\(4, 3\) +float32 .* \(stored once with LightningStateDict\.[0-9a-f]{8}/net\.0\.weight\)",
                     capsys.readouterr().out)
    assert main(["avg", path, "--out", str(tmp_path / "avg.yaml"), "--last", "1"]) == 0
    assert main(["convert", path, "--out", str(tmp_path / "frozen.yaml")]) == 0
    assert difference(dict(sorted(xser.torch.state_dict(tmp_path / "frozen.yaml").items())), tensors) is None
    assert main(["export", "safetensors", path, str(tmp_path / "hf")]) == 0
    exported = safetensors.torch.load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert difference(dict(sorted(exported.items())), tensors) is None


@pytest.mark.parametrize("bad, message", [
    ({"hyper_parameters": {"root": Path("/data")}},
     "checkpoint['hyper_parameters']['root']: cannot store a PosixPath (XserCheckpointIO stores tensors, numpy arrays, "
     "dicts, lists, tuples, str, int, float, bool and None)"),
    ({"callbacks": {"seen": {1, 2}}}, "checkpoint['callbacks']['seen']: cannot store a set (XserCheckpointIO stores "
     "tensors, numpy arrays, dicts, lists, tuples, str, int, float, bool and None)"),
    ({"x": {1: "a", "b": 2}}, "checkpoint['x']: key 1 (int): a dict's keys must be all str or all int"),
    ({"x": {(1, 2): 3}}, "checkpoint['x']: key (1, 2) (tuple): a dict's keys must be all str or all int"),
    ({"x": {"$array": 3}}, "checkpoint['x']['$array']: keys starting with '$' are xser's markers"),
    ({"state_dict": {"a/b": torch.ones(1)}},
     "checkpoint['state_dict']['a/b']: an xser parameter name is not empty and holds no '/' or '@'"),
    ({"state_dict": {"": torch.ones(1)}}, "checkpoint['state_dict']['']: an xser parameter name is not empty and holds no '/' or '@'"),
    ({"state_dict": {"w": torch.ones(2).to_sparse()}},
     "checkpoint['state_dict']['w']: cannot store a torch.sparse_coo tensor (dense tensors only)"),
    ({"optimizer_states": [{"x": torch.ones(2, device="meta")}]},
     "checkpoint['optimizer_states'][0]['x']: the tensor is on the meta device and has no data to save"),
    ({"x": np.array(["a"], dtype=object)}, "checkpoint['x']: object dtypes need pickle and are not supported"),
])
def test_what_cannot_be_stored_is_refused_by_key(tmp_path, bad, message):
    """A value the plugin cannot store is an error naming its key, before anything is written: a checkpoint already
    at the path stays as it was."""
    path = str(tmp_path / "last.ckpt")
    XserCheckpointIO().save_checkpoint(checkpoint(), path)
    with pytest.raises(xser.DataError) as e:
        XserCheckpointIO().save_checkpoint(bad, path)
    assert str(e.value) == f"{path}: {message}"
    assert difference(XserCheckpointIO().load_checkpoint(path), checkpoint()) is None


def test_saving_again_never_takes_the_checkpoint_from_its_name(tmp_path):
    """``last.ckpt`` saved again: the spec file is there at every moment (another rank, or another job, looking for
    "last" always finds it), and its modification time is the newest save's (Lightning picks "last" by it)."""
    path = str(tmp_path / "last.ckpt")
    io = XserCheckpointIO()
    io.save_checkpoint(checkpoint(), path)
    os.utime(path, ns=(10**18, 10**18))
    missing, stop = [], threading.Event()

    def look() -> None:
        while not stop.is_set():
            if not os.path.exists(path):
                missing.append(path)

    watcher = threading.Thread(target=look)
    watcher.start()
    try:
        for step in range(11, 16):
            io.save_checkpoint({**checkpoint(), "global_step": step}, path)
    finally:
        stop.set()
        watcher.join()
    assert missing == []
    assert os.stat(path).st_mtime_ns > 10**18
    assert io.load_checkpoint(path)["global_step"] == 15


def test_remove_checkpoint(tmp_path):
    """The spec, every checkpoint slot and the leftovers of interrupted saves go; a set-aside damaged slot stays (xser
    never deletes one); a path with nothing there is no error and makes no directory."""
    path = str(tmp_path / "epoch=0-step=2.ckpt")
    model = xser.lightning.LightningStateDict(tensors={"w": ["float32", [2]]})
    with xser.CheckpointSaver(path, keep=3) as saver:
        for step in (1, 2, 3):
            saver.save(model, step=step)
    os.makedirs(path + ".data.tmp-1-0000abcd")
    os.makedirs(path + ".data.damaged-0000abcd")
    XserCheckpointIO().save_checkpoint(checkpoint(), str(tmp_path / "last.ckpt"))
    XserCheckpointIO().remove_checkpoint(path)
    assert sorted(os.listdir(tmp_path)) == ["epoch=0-step=2.ckpt.data.damaged-0000abcd", "last.ckpt", "last.ckpt.data"]
    XserCheckpointIO().remove_checkpoint(tmp_path / "nowhere" / "x.ckpt")
    assert not (tmp_path / "nowhere").exists()


def test_a_removal_waits_for_a_save_of_the_same_path(tmp_path, monkeypatch):
    """``AsyncCheckpointIO`` saves on its thread while Lightning removes on the training thread: a removal of the path
    being saved waits for that save (the model's lock would refuse it), then removes it."""
    from xser.checkpoints.saver import CheckpointSaver

    path = str(tmp_path / "epoch=0-step=2.ckpt")
    started, release = threading.Event(), threading.Event()
    save = CheckpointSaver.save

    def slow(self, *args, **kwargs):
        started.set()
        release.wait(30)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(CheckpointSaver, "save", slow)
    io, errors = XserCheckpointIO(), []
    saving = threading.Thread(target=io.save_checkpoint, args=(checkpoint(), path))
    saving.start()
    assert started.wait(30)

    def remove() -> None:
        try:
            io.remove_checkpoint(path)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    removing = threading.Thread(target=remove)
    removing.start()
    time.sleep(0.2)  # the removal reaches the save's lock meanwhile
    release.set()
    saving.join(30)
    removing.join(30)
    assert errors == []
    assert os.listdir(tmp_path) == []


def test_object_stores(remote_root):
    """On memory:// and S3: a save (its storage_options from the call), a load and a removal (the plugin's options)
    of every object of the model."""
    from xser.storage.stores import store_for

    url = remote_root.url("run", "last.ckpt")
    io = XserCheckpointIO(storage_options=remote_root.options)
    XserCheckpointIO().save_checkpoint(checkpoint(), url, storage_options=remote_root.options)
    assert difference(io.load_checkpoint(url), checkpoint()) is None
    store = store_for(url, remote_root.options)
    assert store.exists(url) and store.list(url + ".data")
    io.remove_checkpoint(url)
    assert store.list(remote_root.url("run")) == {}


def test_loading_errors_and_map_location(tmp_path):
    path = str(tmp_path / "last.ckpt")
    with pytest.raises(xser.CheckpointError) as e:
        XserCheckpointIO().load_checkpoint(path)
    assert str(e.value) == f"{path}: no checkpoint here"
    xser.save(xser.lightning.LightningStateDict(tensors={"w": ["float32", [2]]}), path)
    with pytest.raises(xser.DataError) as e:
        XserCheckpointIO().load_checkpoint(path)
    assert str(e.value) == (f"{path}: this model was not saved by XserCheckpointIO (its component is not a !LightningStateDict "
                            "with the checkpoint as training state)")
    XserCheckpointIO().save_checkpoint(checkpoint(), path)
    meta = XserCheckpointIO().load_checkpoint(path, map_location="meta")
    assert meta["state_dict"]["net.0.weight"].device.type == "meta"
    assert meta["optimizer_states"][0]["state"][1]["exp_avg"].device.type == "meta"
    same = XserCheckpointIO().load_checkpoint(path, map_location=lambda storage, location: storage)
    assert difference(same, checkpoint()) is None


def test_async_checkpoint_io(tmp_path):
    """Wrapped in Lightning's ``AsyncCheckpointIO``: the save runs on its thread, tensors changed in place right after
    ``save_checkpoint`` returns do not reach the checkpoint, and an error of the background save is raised at teardown."""
    path = str(tmp_path / "last.ckpt")
    io = AsyncCheckpointIO(XserCheckpointIO())
    saved = checkpoint()
    io.save_checkpoint(saved, path)
    expected = checkpoint()
    for t in (saved["state_dict"]["net.0.bias"], saved["optimizer_states"][0]["state"][0]["exp_avg"]):
        t.add_(1)
    io.save_checkpoint({"hyper_parameters": {"root": Path("/data")}}, str(tmp_path / "bad.ckpt"))
    with pytest.raises(xser.DataError) as e:
        io.teardown()
    assert str(e.value) == (f"{tmp_path / 'bad.ckpt'}: checkpoint['hyper_parameters']['root']: cannot store a PosixPath "
                            "(XserCheckpointIO stores tensors, numpy arrays, dicts, lists, tuples, str, int, float, bool and None)")
    assert difference(XserCheckpointIO().load_checkpoint(path), expected) is None
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt", "last.ckpt.data"]


def torchrun(args: list[str], cwd: Path, timeout: float = 240) -> str:
    """``torchrun --nproc-per-node 2 ARGS`` (``python -m torch.distributed.run``) on this checkout; its output. A run
    past ``timeout`` is killed with all its processes and fails the test."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun {' '.join(args)} ran past {timeout} s:\n{out[-6000:]}")
    assert proc.returncode == 0, out[-6000:]
    return out


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """One torchrun launch of tests/lightning_child.py: the checked fits (sync and async), then the README example.
    (directory, output)."""
    out = tmp_path_factory.mktemp("ddp")
    return out, torchrun([os.path.join(HERE, "lightning_child.py"), str(out)], out)


def test_trainer_ddp_resumes_from_last(ddp_run):
    """A real Trainer on 2 CPU processes (DDP over gloo): checkpoints every 2 steps with save_last, then a second fit
    from ckpt_path="last" starts at step 4 with the weights and optimizer state the first ended with, bit for bit;
    only rank 0 saves; the top-1 checkpoint before the newest is removed. With and without AsyncCheckpointIO."""
    out, _ = ddp_run
    for mode in ("sync", "async"):
        ranks = [json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in (0, 1)]
        saves = [["epoch=0-step=2.ckpt", "last.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"],
                 ["epoch=0-step=6.ckpt", "last.ckpt", "epoch=0-step=8.ckpt", "last.ckpt"]]
        seen = {"ckpt_path": "last.ckpt", "start_step": 4, "weights_differ": None, "optimizer_differs": None, "end_step": 8}
        assert ranks[1] == {"saves": [[], []], **seen}
        assert ranks[0] == {"saves": saves, **seen, "files": ["epoch=0-step=8.ckpt", "epoch=0-step=8.ckpt.data", "last.ckpt",
                                                               "last.ckpt.data"],
                            "last": {"global_step": 8, "epoch": 0, "weights_differ": None, "hyper_parameters": {"dim": 8, "lr": 0.05}}}


def test_readme_example_under_torchrun(ddp_run):
    """``torchrun --nproc-per-node 2 examples/lightning_ddp.py OUT``, as the README gives it (run as ``__main__`` with
    that command line in the same launch): trains, resumes from last.ckpt, and leaves xser models that xser reads."""
    out, output = ddp_run
    run = out / "example"
    assert f"resumed from {run / 'last.ckpt'} and trained to step 8" in output
    last = str(run / "last.ckpt")
    assert [c.step for c in xser.checkpoints(last)] == [8]
    assert list(xser.torch.state_dict(last)) == ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]
    assert XserCheckpointIO().load_checkpoint(last)["hyper_parameters"] == {"dim": 8, "lr": 0.05}
    assert sorted(os.listdir(run)) == ["epoch=0-step=8.ckpt", "epoch=0-step=8.ckpt.data", "last.ckpt", "last.ckpt.data"]
