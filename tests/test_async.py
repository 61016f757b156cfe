"""Async saves: ``CheckpointSaver.save(..., blocking=False)`` (xser/checkpoints/asyncsave.py)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xser
from xser.checkpoints.asyncsave import PendingSave

HERE = os.path.dirname(os.path.abspath(__file__))


@xser.serializable(tag="!AsyncModel")
class AsyncModel:
    shapes: list = [[3, 4], [5], []]
    dtypes: list = ["float32", "int64", "float64"]

    def __attrs_post_init__(self):
        p = xser.params(self)
        self.ws = [p.add(f"w{i}", tuple(s), dtype=d) for i, (s, d) in enumerate(zip(self.shapes, self.dtypes))]
        self.t = p.add_table("emb", 2, slots=("m",))


def fill(m: AsyncModel, value: int) -> None:
    for w in m.ws:
        w[...] = value
    ids = np.array([3, 1, 7], np.int64)
    m.t.get(ids, insert=True)
    m.t.set(ids, np.full((3, 2), value, np.float32))
    m.t.set(ids, np.full((3, 2), -value, np.float32), slot="m")


def values(m: AsyncModel) -> list:
    ids = m.t.ids
    return [w.copy() for w in m.ws] + [ids, m.t.get(ids), m.t.get(ids, slot="m")]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b))


def test_changes_after_save_returns_never_reach_the_checkpoint(tmp_path):
    """Every array (parameters, a table and its slot, the training state) changed in place right after save returns."""
    path = str(tmp_path / "m.yaml")
    m = AsyncModel()
    rng = np.arange(4, dtype=np.int64)
    with xser.CheckpointSaver(path, keep=3) as saver:
        expected = []
        for step in (1, 2, 3):
            fill(m, step)
            rng[...] = step
            expected.append(values(m))
            pending = saver.save(m, step=step, training_state={"rng": rng}, blocking=False)
            assert isinstance(pending, PendingSave)
            fill(m, 100 + step)  # in place, while the save may still be writing
            rng[...] = 100 + step
            m.t.get(np.array([50], np.int64), insert=True)  # a new id too
        report = pending.result()
    assert report.path == path + ".data"
    for k, step in enumerate((3, 2, 1)):
        back = xser.load(path, checkpoint=k)
        assert same(values(back), expected[step - 1])
        assert np.array_equal(xser.load_training_state(path, checkpoint=k)["rng"], np.full(4, step, np.int64))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=st.lists(st.lists(st.integers(0, 4), max_size=3), min_size=1, max_size=4),
       dtype=st.sampled_from(["float32", "float16", "int8", "bool", "complex64"]))
def test_any_shapes_and_dtypes_are_isolated(tmp_path_factory, shapes, dtype):
    path = str(tmp_path_factory.mktemp("m") / "m.yaml")
    m = AsyncModel(shapes=shapes, dtypes=[dtype] * len(shapes))
    with xser.CheckpointSaver(path, keep=1) as saver:
        fill(m, 1)
        expected = values(m)
        pending = saver.save(m, blocking=False)
        fill(m, 0)
        pending.result()
    assert same(values(xser.load(path)), expected)


def test_one_tensor_under_two_names_is_copied_once(tmp_path):
    path = str(tmp_path / "m.yaml")
    m = AsyncModel(shapes=[[4], [4]], dtypes=["float32", "float32"])
    p = xser.params(m)
    p["w1"] = p["w0"]  # tied: one array, two names
    m.ws[0][...] = 5
    with xser.CheckpointSaver(path) as saver:
        saver.save(m, blocking=False).result()
        assert [k for k in saver._buffer.arrays if "@" not in k[2]] == [("param", "the root", "w0")]
    back = xser.load(path)
    assert back.ws[0].tolist() == [5.0] * 4 and back.ws[1].tolist() == [5.0] * 4


def test_the_host_buffer_is_reused_while_shapes_stay_the_same(tmp_path):
    path = str(tmp_path / "m.yaml")
    m = AsyncModel(shapes=[[64, 64], [8]], dtypes=["float32", "float64"])
    with xser.CheckpointSaver(path, keep=2) as saver:
        fill(m, 0)
        saver.save(m, step=0, blocking=False).result()
        first = {k: id(a) for k, a in saver._buffer.arrays.items()}
        size = saver._buffer.nbytes
        for step in range(1, 21):
            fill(m, step)
            saver.save(m, step=step, blocking=False)
        saver.wait()
        assert {k: id(a) for k, a in saver._buffer.arrays.items()} == first  # the same arrays, never new ones
        assert saver._buffer.nbytes == size
        m.t.get(np.array([9, 10], np.int64), insert=True)  # the table grows: only its buffers are made again
        saver.save(m, step=21, blocking=False).result()
        now = {k: id(a) for k, a in saver._buffer.arrays.items()}
        assert {k for k in now if now[k] != first.get(k)} == {("param", "the root", n) for n in ("emb@id", "emb@embedding", "emb@m")}
    assert [c.step for c in xser.checkpoints(path)] == [21, 20]


def _mismatching_model(path: str) -> AsyncModel:
    xser.save(AsyncModel(), path)
    return AsyncModel(shapes=[[9]], dtypes=["float32"])  # no longer matches the checkpoint


MISMATCH = "the model no longer matches checkpoint"


def test_a_background_error_is_raised_by_result_and_only_once(tmp_path):
    path = str(tmp_path / "m.yaml")
    m = _mismatching_model(path)
    saver = xser.CheckpointSaver(path)
    pending = saver.save(m, blocking=False)
    with pytest.raises(xser.CheckpointError, match=MISMATCH):
        pending.result()
    assert pending.done()
    saver.close()  # seen already: close does not raise it again
    assert not saver._lock.held


@pytest.mark.parametrize("then", ["save", "close", "with", "wait"])
def test_an_unseen_background_error_is_raised_by_what_comes_next(tmp_path, then):
    path = str(tmp_path / "m.yaml")
    m = _mismatching_model(path)
    if then == "with":
        with pytest.raises(xser.CheckpointError, match=MISMATCH):
            with xser.CheckpointSaver(path) as saver:
                saver.save(m, blocking=False)
        assert not saver._lock.held
        return
    saver = xser.CheckpointSaver(path)
    saver.save(m, blocking=False)
    with pytest.raises(xser.CheckpointError, match=MISMATCH):
        if then == "save":
            saver.save(AsyncModel())
        elif then == "close":
            saver.close()
        else:
            saver.wait()
    saver.close()  # raised once: closing now is quiet
    assert not saver._lock.held


def test_a_failing_with_block_keeps_its_own_exception(tmp_path, caplog):
    path = str(tmp_path / "m.yaml")
    m = _mismatching_model(path)
    with caplog.at_level(logging.ERROR, logger="xser"), pytest.raises(KeyError, match="mine"):
        with xser.CheckpointSaver(path) as saver:
            saver.save(m, blocking=False)
            raise KeyError("mine")
    assert MISMATCH in caplog.text
    assert not saver._lock.held


def test_one_save_is_pending_at_a_time(tmp_path):
    path = str(tmp_path / "m.yaml")
    m = AsyncModel()
    with xser.CheckpointSaver(path, keep=5) as saver:
        first = saver.save(m, step=1, blocking=False)
        second = saver.save(m, step=2, blocking=False)
        assert first.done()  # the second waited for it before taking its snapshot
        second.result()
    assert [c.step for c in xser.checkpoints(path)] == [2, 1]


def test_a_closed_saver_refuses_async_saves(tmp_path):
    saver = xser.CheckpointSaver(str(tmp_path / "m.yaml"))
    saver.close()
    with pytest.raises(xser.CheckpointError, match="this CheckpointSaver is closed"):
        saver.save(AsyncModel(), blocking=False)


def test_torch_tensors_are_copied_off_at_save(tmp_path):
    torch = pytest.importorskip("torch")
    from xser.torch import wrap

    path = str(tmp_path / "m.yaml")
    module = wrap(torch.nn.Linear, 3, 2)
    with torch.no_grad():
        module.module.weight.fill_(1.0)
        module.module.bias.fill_(2.0)
    with xser.CheckpointSaver(path) as saver:
        pending = saver.save(module, blocking=False)
        with torch.no_grad():
            module.module.weight.add_(10.0)  # in place, on the tensor the optimizer holds
            module.module.bias.mul_(0.0)
        pending.result()
    back = xser.load(path)
    assert back.module.weight.tolist() == [[1.0] * 3] * 2 and back.module.bias.tolist() == [2.0, 2.0]


def test_cuda_tensors_are_copied_into_pinned_host_memory(tmp_path):
    """On a GPU: the snapshot copies each CUDA tensor into pinned host memory the saver keeps; changes made on the
    device right after save returns never reach the checkpoint."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from xser.torch import wrap

    path = str(tmp_path / "m.yaml")
    module = wrap(torch.nn.Linear, 64, 32).to("cuda")
    with torch.no_grad():
        module.module.weight.fill_(1.5)
        module.module.bias.fill_(-2.0)
    with xser.CheckpointSaver(path, keep=2) as saver:
        for step in (1, 2):
            pending = saver.save(module, step=step, blocking=False)
            with torch.no_grad():
                module.module.weight.add_(100.0)  # on the device, at once
            pending.result()
        buffers = [a for k, a in saver._buffer.arrays.items() if k[0] == "param"]
        assert buffers and all(torch.from_numpy(a).is_pinned() for a in buffers)
    back = xser.load(path, checkpoint=0)
    assert back.module.weight.unique().tolist() == [101.5] and back.module.bias.unique().tolist() == [-2.0]
    assert xser.load(path, checkpoint=1).module.weight.unique().tolist() == [1.5]


def _slow_saves(monkeypatch):
    """Background saves wait for the returned event before they start."""
    import threading

    from xser.checkpoints import saver as saver_module

    gate = threading.Event()
    real = saver_module.save_locked

    def slow(*a, **kw):
        gate.wait(30)
        return real(*a, **kw)

    monkeypatch.setattr(saver_module, "save_locked", slow)
    return gate


def _interrupt_waits(pending: PendingSave, gate) -> None:
    """Ctrl-C while the caller waits for ``pending``, as long as the save is held at ``gate``."""
    future = pending._future
    real = future.result

    def result(timeout=None):
        if not gate.is_set():
            raise KeyboardInterrupt
        return real(timeout)

    future.result = result


def test_an_interrupted_wait_leaves_the_save_pending(tmp_path, monkeypatch):
    """Ctrl-C while waiting for a pending save: the save goes on, and nothing else starts (or lets the lock go) until
    it is done; its checkpoint holds its own snapshot, never a later one's."""
    path = str(tmp_path / "m.yaml")
    m = AsyncModel()
    gate = _slow_saves(monkeypatch)
    saver = xser.CheckpointSaver(path, keep=5)
    fill(m, 1)
    first = saver.save(m, step=1, blocking=False)
    _interrupt_waits(first, gate)
    with pytest.raises(KeyboardInterrupt):
        saver.save(m, step=2, blocking=False)  # waits for step 1 first: interrupted
    with pytest.raises(KeyboardInterrupt):
        saver.close()  # likewise: the lock stays, and the save is still pending
    assert saver._pending is first and not first.done() and saver._lock.held
    gate.set()
    fill(m, 3)
    saver.save(m, step=3, blocking=False).result()
    saver.close()
    assert [c.step for c in xser.checkpoints(path)] == [3, 1]
    assert same(values(xser.load(path, checkpoint=1))[:3], [np.full(s, 1, d) for s, d in [((3, 4), "float32"), ((5,), "int64"), ((), "float64")]])


def test_an_interrupted_result_does_not_swallow_the_save_error(tmp_path, monkeypatch):
    path = str(tmp_path / "m.yaml")
    m = _mismatching_model(path)
    gate = _slow_saves(monkeypatch)
    saver = xser.CheckpointSaver(path)
    pending = saver.save(m, blocking=False)
    _interrupt_waits(pending, gate)
    with pytest.raises(KeyboardInterrupt):
        pending.result()
    gate.set()
    with pytest.raises(xser.CheckpointError, match=MISMATCH):
        saver.close()  # the save's own error, seen by nobody yet
    assert not saver._lock.held


def test_tied_torch_weights_are_copied_and_stored_once(tmp_path):
    torch = pytest.importorskip("torch")
    from xser.torch import wrap

    seq = wrap(torch.nn.Sequential, wrap(torch.nn.Linear, 4, 4), wrap(torch.nn.Linear, 4, 4))
    seq.module[1].module.weight = seq.module[0].module.weight  # tied
    blocking, pending = str(tmp_path / "b.yaml"), str(tmp_path / "a.yaml")
    xser.save(seq, blocking)
    with xser.CheckpointSaver(pending) as saver:
        saver.save(seq, blocking=False).result()
    files = [sorted(f for _, _, fs in os.walk(p + ".data") for f in fs if f.endswith(".npy")) for p in (blocking, pending)]
    assert files[0] == files[1] and len(files[1]) == 3  # one weight (stored once) and two biases


@xser.serializable(tag="!AsyncShard")
class AsyncShard:
    n: int = 6

    def __attrs_post_init__(self):
        self.W = xser.params(self).add("W", (self.n, 2), rows=xser.dist.rows(self.n))


def test_two_savers_share_one_coordinator(tmp_path):
    """An async save pending on one saver while another saver (same coordinator) saves: the saves run one after the
    other on every rank, each checkpoint whole (a job of 3 ranks as threads)."""
    import xser.dist
    from threaded import run

    def job(c):
        m, ema = AsyncShard(), AsyncShard()
        first, stop = xser.dist.rows(6)
        with xser.CheckpointSaver(str(tmp_path / "m.yaml"), coordinator=c) as a, \
                xser.CheckpointSaver(str(tmp_path / "ema.yaml"), coordinator=c) as b:
            for step in (1, 2, 3):
                m.W[...] = np.arange(first, stop)[:, None] + step
                ema.W[...] = -m.W
                pending = a.save(m, step=step, blocking=False)
                b.save(ema, step=step)
                m.W[...] = 0
            pending.result()

    run(3, job)
    assert xser.read_params(str(tmp_path / "m.yaml")).popitem()[1]["W"][:, 0].tolist() == [3, 4, 5, 6, 7, 8]
    assert xser.read_params(str(tmp_path / "ema.yaml")).popitem()[1]["W"][:, 0].tolist() == [-3, -4, -5, -6, -7, -8]
