"""Checkpoints: rotation, retention policies, resume, duplicates, training state, crash safety."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xser
from components import Linear, Model
from helpers import fail_nth_write, save_steps
from xser.checkpoints.policy import AnyOf, KeepBest, KeepEvery, KeepLast
from xser.checkpoints.policy import retain as plan
from xser.storage.listing import Checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))


def model(value=0.0):
    lin = Linear(3, 2)
    lin.W[...] = value
    lin.b[...] = value
    return lin


def steps_on_disk(path):
    return [c.step for c in xser.checkpoints(path)]


def test_saver_deletes_what_it_prunes_after_the_save_returns(tmp_path, monkeypatch):
    """A CheckpointSaver's pruned checkpoint is deleted by the deleter thread: the save returns first (the checkpoint
    already out of the listing, under its trash name), the next save leaves it to that thread, close() waits for it."""
    import threading

    from xser.storage.disk import slots, trash

    go = threading.Event()
    real = slots.discard
    monkeypatch.setattr(slots, "discard", lambda d: (go.wait(30), real(d))[1])
    path = str(tmp_path / "m.yaml")
    lin = model()
    saver = xser.CheckpointSaver(path, keep=1)
    try:
        for step in (1, 2, 3):
            lin.W[...] = step
            saver.save(lin, step=step)
        assert steps_on_disk(path) == [3]
        held = sorted(n for n in os.listdir(tmp_path) if ".old-" in n or ".tmp-" in n)
        assert len(held) == 2 and all(trash.pending(str(tmp_path / n)) for n in held)
    finally:
        go.set()
        saver.close()
    assert sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data"] and not trash._pending


class TestRotation:
    def test_keep_last(self, tmp_path):
        """Each save becomes .data; older ones shift to .data.1, .data.2; keep=N bounds them."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        with xser.CheckpointSaver(path, keep=3) as saver:
            for step in range(1, 6):
                lin.W[...] = step
                saver.save(lin, step=step, metrics={"loss": 1.0 / step})
        assert steps_on_disk(path) == [5, 4, 3]
        assert sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data", "m.yaml.data.1", "m.yaml.data.2"]
        for k, step in enumerate([5, 4, 3]):
            assert np.all(xser.load(path, checkpoint=k).W == step)
            assert np.all(xser.read_params(path, checkpoint=k)[xser.params(lin).name]["W"] == step)
        assert np.all(xser.load(path).W == 5)

    def test_subcol_names_do_not_change(self, tmp_path):
        """All checkpoints share the one spec and its subcollection names."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        with xser.CheckpointSaver(path, keep=2) as saver:
            saver.save(lin, step=1)
            lin.W[...] = 1
            saver.save(lin, step=2)
        names = [set(xser.read_params(path, checkpoint=k)) for k in (0, 1)]
        assert names[0] == names[1] == {xser.params(lin).name}

    def test_keep_best_and_newest(self, tmp_path):
        """KeepBest keeps the best by a metric; the newest is always kept too."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        with xser.CheckpointSaver(path, keep=KeepBest(2, "bleu")) as saver:
            for step, bleu in [(1, 10.0), (2, 30.0), (3, 20.0), (4, 5.0)]:
                lin.W[...] = step
                saver.save(lin, step=step, metrics={"bleu": bleu})
        assert steps_on_disk(path) == [4, 3, 2]

    def test_keep_min_mode_and_every(self, tmp_path):
        """mode='min' keeps the lowest; KeepEvery keeps multiples of k; | combines."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        policy = KeepBest(1, "loss", mode="min") | KeepEvery(3)
        with xser.CheckpointSaver(path, keep=policy) as saver:
            for step, loss in [(1, 0.5), (2, 0.1), (3, 0.9), (4, 0.8), (5, 0.7), (6, 0.6), (7, 0.95)]:
                lin.W[...] = step
                saver.save(lin, step=step, metrics={"loss": loss})
        assert steps_on_disk(path) == [7, 6, 3, 2]

    def test_resume_applies_policy_to_existing(self, tmp_path):
        """A saver on an earlier run's directory prunes the existing checkpoints by its policy."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        save_steps(path, lin, range(1, 6), keep=5)
        again = xser.load(path)
        with xser.CheckpointSaver(path, keep=2) as saver:
            again.W[...] = 6
            report = saver.save(again, step=6)
        assert steps_on_disk(path) == [6, 5]
        assert len(report.removed) == 4

    def test_stale_checkpoints_beyond_policy_are_removed_whole(self, tmp_path):
        """An old run's .data.7 is a checkpoint (it has a manifest) and is pruned like the others."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        xser.save(lin, path)
        os.rename(path + ".data", path + ".data.7")
        with xser.CheckpointSaver(path, keep=2) as saver:
            lin.W[...] = 1
            saver.save(lin, step=1)
            lin.W[...] = 2
            saver.save(lin, step=2)
        assert sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data", "m.yaml.data.1"]

    def test_non_checkpoint_in_the_way(self, tmp_path):
        """A slot without a valid manifest is never deleted: the next save sets it aside, whole, and reports it."""
        path = str(tmp_path / "m.yaml")
        os.makedirs(path + ".data.1")
        (Path(path + ".data.1") / "notes.txt").write_text("mine")
        lin = model(1)
        with xser.CheckpointSaver(path, keep=3) as saver:
            first = saver.save(lin, step=1)
            lin.W[...] = 2
            second = saver.save(lin, step=2)
        (aside,) = first.set_aside
        assert os.path.basename(aside).startswith("m.yaml.data.damaged-1-") and second.set_aside == ()
        assert (Path(aside) / "notes.txt").read_text() == "mine"
        assert steps_on_disk(path) == [2, 1]

    def test_gap_is_closed_by_next_save(self, tmp_path):
        """After an interrupted rotation (a gap), listing keeps the order and the next save renumbers."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        save_steps(path, lin, (1, 2, 3), keep=5)
        os.rename(path + ".data.2", path + ".data.3")  # a crash after the first shift of the next save
        assert steps_on_disk(path) == [3, 2, 1]
        assert np.all(xser.load(path, checkpoint=2).W == 1)
        with xser.CheckpointSaver(path, keep=5) as saver:
            lin.W[...] = 4
            saver.save(lin, step=4)
        assert steps_on_disk(path) == [4, 3, 2, 1]
        assert [os.path.basename(c.path) for c in xser.checkpoints(path)] == [
            "m.yaml.data", "m.yaml.data.1", "m.yaml.data.2", "m.yaml.data.3"
        ]

    def test_missing_newest_falls_back_to_listing(self, tmp_path):
        """If .data is gone (a crash between shift and publish), checkpoint 0 is the newest that exists."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        save_steps(path, lin, (1, 2), keep=3)
        os.rename(path + ".data", path + ".data.5")
        os.rename(path + ".data.1", path + ".data.2")
        os.rename(path + ".data.5", path + ".data.1")
        assert steps_on_disk(path) == [2, 1]
        assert np.all(xser.load(path).W == 2)

    def test_checkpoint_out_of_range(self, tmp_path):
        """Asking for a checkpoint that does not exist says how many there are."""
        path = str(tmp_path / "m.yaml")
        xser.save(model(), path)
        with pytest.raises(xser.CheckpointError) as info:
            xser.load(path, checkpoint=3)
        assert str(info.value) == f"{path}: no checkpoint 3: the model has 1 (0 to 0)"
        with pytest.raises(xser.CheckpointError, match="checkpoint must be an int >= 0"):
            xser.load(path, checkpoint=-1)


class TestDuplicatesAndLinks:
    def test_identical_save_is_skipped(self, tmp_path):
        """A save that brings nothing new (same arrays, step and metrics) is reported and skipped."""
        path = str(tmp_path / "m.yaml")
        lin = model(1)
        with xser.CheckpointSaver(path, keep=3) as saver:
            saver.save(lin, step=1, metrics={"bleu": 1.0})
            report = saver.save(lin, step=1, metrics={"bleu": 1.0})
        assert report.skipped and report.path is None
        assert steps_on_disk(path) == [1]

    def test_unchanged_arrays_with_a_new_step_are_recorded(self, tmp_path):
        """An evaluation-only epoch (same arrays, new step and metrics) leaves a checkpoint; every file is a link."""
        path = str(tmp_path / "m.yaml")
        lin = model(1)
        with xser.CheckpointSaver(path, keep=KeepBest(1, "bleu") | KeepLast(1)) as saver:
            saver.save(lin, step=1, metrics={"bleu": 1.0})
            report = saver.save(lin, step=2, metrics={"bleu": 5.0})
            saver.save(lin, step=3, metrics={"bleu": 2.0})
        assert not report.skipped and (report.written, report.linked) == (0, 2)
        assert steps_on_disk(path) == [3, 2]  # KeepBest saw step 2's metric

    def test_unchanged_arrays_are_hard_linked(self, tmp_path):
        """Arrays that did not change are hard-linked from the previous checkpoint, not rewritten."""
        path = str(tmp_path / "m.yaml")
        lin = model(1)
        sub = xser.params(lin).name
        with xser.CheckpointSaver(path, keep=3) as saver:
            saver.save(lin, step=1)
            lin.W[...] = 2
            report = saver.save(lin, step=2)
        assert (report.written, report.linked) == (1, 1)
        b0, b1 = Path(path + ".data", sub, "b.npy"), Path(path + ".data.1", sub, "b.npy")
        assert b0.stat().st_ino == b1.stat().st_ino
        assert Path(path + ".data", sub, "W.npy").stat().st_ino != Path(path + ".data.1", sub, "W.npy").stat().st_ino
        assert np.all(xser.load(path, checkpoint=1).W == 1) and np.all(xser.load(path).W == 2)

    def test_spec_rewritten_only_when_changed(self, tmp_path):
        """The one spec file is written by the first save and again only when it changes."""
        path = str(tmp_path / "m.yaml")
        m = Model(encoder=model(1), dropout=0.1)
        with xser.CheckpointSaver(path, keep=3) as saver:
            assert saver.save(m, step=1).spec_written
            m.encoder.W[...] = 2
            assert not saver.save(m, step=2).spec_written
            m.dropout = 0.2
            m.encoder.W[...] = 3
            assert saver.save(m, step=3).spec_written
        assert "dropout: 0.2" in Path(path).read_text()


class TestStructure:
    def test_changed_model_is_an_error(self, tmp_path):
        """A model whose parameters no longer match the checkpoints is refused, naming the difference."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        with xser.CheckpointSaver(path, keep=3) as saver:
            saver.save(lin, step=1)
        other = Linear(4, 2)
        xser.params(other).name = xser.params(lin).name
        with xser.CheckpointSaver(path, keep=3) as saver:
            with pytest.raises(xser.CheckpointError) as info:
                saver.save(other, step=2)
        sub = xser.params(lin).name
        assert str(info.value) == (
            f"{path}: the model no longer matches checkpoint {path}.data: {sub}: param 'W' is (2, 4) float32 in the model, "
            f"(2, 3) float32 in the checkpoint. To continue the saved run, resume it: r = xser.resume({path!r}) gives the "
            "model (r.model), its training state and step; save r.model. To start a new model instead, "
            "CheckpointSaver(..., restart=True) replaces the checkpoint (they are removed only after the new model's "
            "first checkpoint is saved)"
        )
        assert steps_on_disk(path) == [1]

    def test_rerun_of_a_training_script(self, tmp_path):
        """Re-running a script against its own output: the message counts what restart would replace; the resume recipe works."""
        path = str(tmp_path / "m.yaml")
        save_steps(path, model(), (1, 2, 3), keep=5)
        fresh = model()  # a fresh build: new subcollection names
        with xser.CheckpointSaver(path, keep=5) as saver:
            with pytest.raises(xser.CheckpointError, match=r"new subcollections .* To continue the saved run.* replaces all 3 checkpoints"):
                saver.save(fresh, step=4)
            resumed = xser.resume(path).model  # the recipe the message gives
            resumed.W[...] = 4
            saver.save(resumed, step=4)
        assert steps_on_disk(path) == [4, 3, 2, 1]

    def test_restart_starts_a_new_model(self, tmp_path):
        """restart=True replaces every old checkpoint with the new model's first one."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        save_steps(path, lin, (1, 2), keep=3)
        with xser.CheckpointSaver(path, keep=3, restart=True) as saver:
            big = Linear(5, 5)
            saver.save(big, step=1)
            big.W[...] = 2
            saver.save(big, step=2)
        assert steps_on_disk(path) == [2, 1]
        assert xser.load(path).W.shape == (5, 5)

    def test_plain_save_checks_older_checkpoints(self, tmp_path):
        """xser.save replaces the newest; older checkpoints that no longer match make it fail."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        save_steps(path, lin, (1, 2), keep=3)
        xser.save(xser.load(path), path)  # same structure: fine
        assert steps_on_disk(path) == [None, 1]
        other = Linear(4, 4)
        with pytest.raises(xser.CheckpointError, match="no longer matches checkpoint .*m.yaml.data.1"):
            xser.save(other, path)

    def test_policy_validation(self):
        """Bad policies are refused early."""
        with pytest.raises(xser.CheckpointError, match="keep must be an int >= 1 or a policy"):
            xser.CheckpointSaver("unused.yaml", keep=0)
        with pytest.raises(xser.CheckpointError, match="mode must be"):
            KeepBest(1, "bleu", mode="maximum")

    def test_bad_step_and_metrics(self, tmp_path):
        """step must be an int; metrics numbers."""
        with xser.CheckpointSaver(str(tmp_path / "m.yaml")) as saver:
            with pytest.raises(xser.CheckpointError, match="step must be an int, got '3'"):
                saver.save(model(), step="3")
            with pytest.raises(xser.CheckpointError, match="metric 'bleu' must be a number, got 'high'"):
                saver.save(model(), metrics={"bleu": "high"})
        assert os.listdir(tmp_path) == []


class TestTrainingState:
    def test_round_trip(self, tmp_path):
        """training_state (arrays and JSON values) comes back per checkpoint."""
        path = str(tmp_path / "m.yaml")
        rng = np.random.default_rng(3)
        state = {"step": 7, "adam": {"m": np.ones((2, 3), np.float32), "v": [np.zeros(2), 0.5]}, "rng": rng.bit_generator.state}
        lin = model(1)
        with xser.CheckpointSaver(path, keep=2) as saver:
            saver.save(lin, step=7, training_state=state)
            lin.W[...] = 2
            saver.save(lin, step=8)
        back = xser.load_training_state(path, checkpoint=1)
        assert back["step"] == 7 and back["rng"] == rng.bit_generator.state
        assert np.array_equal(back["adam"]["m"], state["adam"]["m"]) and back["adam"]["m"].dtype == np.float32
        assert np.array_equal(back["adam"]["v"][0], np.zeros(2)) and back["adam"]["v"][1] == 0.5
        with pytest.raises(xser.CheckpointError, match="saved without training_state"):
            xser.load_training_state(path)
        assert not os.path.exists(path + ".data/training_state")  # thin by default

    def test_bad_training_state(self, tmp_path):
        """Objects that are neither arrays nor JSON are refused, with nothing written."""
        path = str(tmp_path / "m.yaml")
        with xser.CheckpointSaver(path) as saver:
            with pytest.raises(xser.DataError, match=r"training_state.opt: cannot store a object"):
                saver.save(model(), training_state={"opt": object()})
            with pytest.raises(xser.DataError, match=r"keys must be strings not starting with '\$'"):
                saver.save(model(), training_state={"$array": 1})
        assert xser.checkpoints(path) == []


class TestLock:
    def test_second_saver_is_refused(self, tmp_path):
        """Two savers on one model: the second gets a clear error."""
        path = str(tmp_path / "m.yaml")
        with xser.CheckpointSaver(path):
            with pytest.raises(xser.CheckpointError, match=r"m.yaml.lock: this process already has a CheckpointSaver on this model"):
                xser.CheckpointSaver(path)
            with pytest.raises(xser.CheckpointError, match="this process already has a CheckpointSaver"):
                xser.save(model(), path)
        with xser.CheckpointSaver(path) as saver:  # released: usable again
            saver.save(model(), step=1)
        assert not os.path.exists(path + ".lock")

    def test_closed_saver(self, tmp_path):
        """A closed saver refuses to save."""
        saver = xser.CheckpointSaver(str(tmp_path / "m.yaml"))
        saver.close()
        with pytest.raises(xser.CheckpointError, match="closed"):
            saver.save(model())

    def test_lock_of_killed_process_does_not_block(self, tmp_path):
        """A saver killed while holding the lock does not block the next one."""
        path = str(tmp_path / "m.yaml")
        code = f"import sys, time; sys.path.insert(0, {HERE!r}); import xser; s = xser.CheckpointSaver({path!r}); print('locked', flush=True); time.sleep(60)"
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(xser.CheckpointError, match=f"pid {proc.pid}"):
            xser.CheckpointSaver(path)
        proc.kill()
        proc.wait()
        proc.stdout.close()
        assert os.path.exists(path + ".lock")  # left behind, but not locked
        with xser.CheckpointSaver(path) as saver:
            saver.save(model(), step=1)


class TestRecovery:
    def test_temporaries_are_cleaned_and_never_loaded(self, tmp_path):
        """Leftovers of interrupted saves are removed by the next saver and ignored by loads."""
        path = str(tmp_path / "m.yaml")
        xser.save(model(1), path)
        junk = [path + ".data.tmp-1-deadbeef", path + ".data.old-2-cafebabe", path + ".tmp-3-0badf00d"]
        os.makedirs(junk[0])
        os.makedirs(junk[1])
        Path(junk[2]).write_text("partial")
        assert len(xser.checkpoints(path)) == 1 and np.all(xser.load(path).W == 1)
        with xser.CheckpointSaver(path, keep=2) as saver:
            pass
        assert not any(os.path.exists(j) for j in junk)

    def test_spec_without_checkpoint_does_not_block(self, tmp_path):
        """A spec left without any published checkpoint (a crash before the first publish) is overwritten."""
        path = str(tmp_path / "m.yaml")
        Path(path).write_text("xser_format: 1\nname: old\nexperiment: !Old {}\n")
        with xser.CheckpointSaver(path, keep=2) as saver:
            saver.save(model(1), step=1)
        assert np.all(xser.load(path).W == 1)

    def test_write_error_keeps_earlier_checkpoints(self, tmp_path, monkeypatch):
        """ENOSPC at the n-th write: an XserError naming the path; earlier checkpoints intact."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        with xser.CheckpointSaver(path, keep=3) as saver:
            for step in (1, 2):
                lin.W[...] = step
                saver.save(lin, step=step)
            fail_nth_write(monkeypatch, 2)
            lin.W[...] = 3
            lin.b[...] = 3
            with pytest.raises(xser.DataError, match=r"m.yaml.data.tmp-.*: cannot write data directory: No space left on device"):
                saver.save(lin, step=3)
        monkeypatch.undo()
        assert steps_on_disk(path) == [2, 1]
        for k, v in ((0, 2), (1, 1)):
            assert np.all(xser.load(path, checkpoint=k, verify=True).W == v)
        assert sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data", "m.yaml.data.1"]

    def test_permission_denied(self, tmp_path, monkeypatch):
        """Permission denied while staging: a DataError naming the path; the old checkpoint still loads."""
        path = str(tmp_path / "m.yaml")
        lin = model(1)
        xser.save(lin, path)
        real = os.mkdir

        def denied(p, *a, **k):
            if ".tmp-" in str(p):
                raise PermissionError(13, "Permission denied", str(p))
            return real(p, *a, **k)

        monkeypatch.setattr(os, "mkdir", denied)
        lin.W[...] = 2
        with pytest.raises(xser.DataError, match=r"m.yaml.data.tmp-[0-9]+-[0-9a-f]{8}: cannot write data directory: Permission denied"):
            xser.save(lin, path)
        monkeypatch.undo()
        assert np.all(xser.load(path, verify=True).W == 1)

    def test_previous_file_vanished(self, tmp_path):
        """If an unchanged array's previous file is gone, the array is written instead of linked."""
        path = str(tmp_path / "m.yaml")
        lin = model(1)
        with xser.CheckpointSaver(path, keep=2) as saver:
            saver.save(lin, step=1)
            os.unlink(os.path.join(path + ".data", xser.params(lin).name, "b.npy"))
            lin.W[...] = 2
            report = saver.save(lin, step=2)
        assert (report.written, report.linked) == (2, 0)
        assert np.all(xser.load(path, verify=True).b == 1)


CHILD = """
import sys
sys.path.insert(0, {here!r})
import components, xser
resumed = xser.resume({path!r})  # a run after a kill continues the saved model (a new Linear would not match it)
lin = resumed.model if resumed is not None else components.Linear(64, 64)
saver = xser.CheckpointSaver({path!r}, keep=xser.KeepLast(3) | xser.KeepEvery(5), durable={durable})
step = {start}
while True:
    step += 1
    lin.W[...] = step
    lin.b[...] = step
    saver.save(lin, step=step, metrics={{"score": float(step % 7)}})
    print(step, flush=True)
"""


@pytest.mark.parametrize("durable", [False, True])
def test_killed_savers_leave_whole_checkpoints(tmp_path, durable):
    """SIGKILL at random moments: every listed checkpoint loads as exactly one saved state, newest first."""
    path = str(tmp_path / "m.yaml")
    rng = random.Random(7)
    start = 0
    deadline = time.monotonic() + 60
    kills = 0
    while time.monotonic() < deadline and kills < 8:
        code = CHILD.format(here=HERE, path=path, durable=durable, start=start)
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline(), "the saver did not save (it must resume the model a killed run left)"
        time.sleep(rng.uniform(0.0, 0.15))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        kills += 1
        listed = xser.checkpoints(path)
        assert listed, "no checkpoint survived"
        steps = []
        for c in listed:
            m = xser.load(path, checkpoint=c.index, verify=True)
            k = int(m.W.flat[0])
            assert np.all(m.W == k) and np.all(m.b == k), "a mix of two states"
            assert c.step == k
            steps.append(k)
        assert steps == sorted(steps, reverse=True) and len(set(steps)) == len(steps)
        start = steps[0] + 1000  # later runs resume with larger steps
    assert kills >= 5


class TestPlan:
    @given(
        n=st.integers(1, 6),
        metrics=st.lists(st.one_of(st.none(), st.floats(-10, 10)), min_size=0, max_size=12),
        best=st.integers(0, 3),
        every=st.integers(1, 4),
    )
    @settings(max_examples=200, deadline=None)
    def test_plan_properties(self, n, metrics, best, every):
        """Never more than asked, never drops the newest, and stable under resume (idempotent)."""
        ckpts = [
            Checkpoint(i, f"d{i}", len(metrics) - i, "", {} if m is None else {"bleu": m}) for i, m in enumerate(metrics)
        ]
        for policy, bound in [(KeepLast(n), n), (KeepBest(best, "bleu"), best + 1), (KeepEvery(every), None),
                              (AnyOf((KeepLast(n), KeepBest(best, "bleu"))), n + best)]:
            kept = plan(ckpts, policy)
            if not ckpts:
                assert kept == []
                continue
            assert kept[0] == 0
            if bound is not None:
                assert len(kept) <= max(bound, 1)
            again = [Checkpoint(i, c.path, c.step, c.created, c.metrics) for i, c in enumerate(ckpts[j] for j in kept)]
            assert plan(again, policy) == list(range(len(again)))


class TestContract:
    def test_removed_steps_are_reported(self, tmp_path):
        """SaveReport names the pruned checkpoints by step too (directory names shift during rotation)."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        with xser.CheckpointSaver(path, keep=2) as saver:
            reports = []
            for step in (1, 2, 3):
                lin.W[...] = step
                reports.append(saver.save(lin, step=step))
        assert [r.removed_steps for r in reports] == [(), (), (1,)]

    def test_bad_policy_arguments_are_checkpoint_errors(self):
        """Invalid policy arguments are CheckpointErrors naming the argument, not attrs' ValueError."""
        with pytest.raises(xser.CheckpointError, match="KeepBest: mode must be 'max' or 'min', got 'best'"):
            KeepBest(2, "bleu", mode="best")
        with pytest.raises(xser.CheckpointError, match="KeepLast: n must be an int >= 0, got -1"):
            KeepLast(-1)
        with pytest.raises(xser.CheckpointError, match="KeepEvery: k must be an int >= 1, got 0"):
            KeepEvery(0)

    def test_unknown_and_nan_metrics_are_said_once(self, tmp_path, caplog):
        """A KeepBest metric a save does not report, or reports as NaN, is logged once each."""
        import logging

        path = str(tmp_path / "m.yaml")
        lin = model()
        with caplog.at_level(logging.WARNING, logger="xser"):
            with xser.CheckpointSaver(path, keep=KeepBest(1, "bleu")) as saver:
                for step in (1, 2):
                    lin.W[...] = step
                    saver.save(lin, step=step, metrics={"blue": 1.0})
                for step in (3, 4):
                    lin.W[...] = step
                    saver.save(lin, step=step, metrics={"bleu": float("nan")})
        messages = [r.getMessage() for r in caplog.records]
        assert sum("reports no such metric (reported: blue)" in m for m in messages) == 1
        assert sum("metric 'bleu' is NaN" in m for m in messages) == 1


def _check_removed(path, before, report, after):
    """``report.removed_checkpoints`` is exactly what the save took away, as it was listed before the save."""
    new = [] if report.skipped else [report.id]
    gone = [c for c in before if c.id not in {a.id for a in after}]
    assert {c.id for c in before} | set(new) >= {a.id for a in after}
    assert [c.id for c in report.removed_checkpoints] == [c.id for c in gone]  # newest first, as listed before
    for was, r in zip(gone, report.removed_checkpoints):
        assert r.path == path + ".data" + ("" if was.path.endswith(".data") else was.path[was.path.rindex("."):])
        assert os.path.abspath(r.path) == was.path  # the name it had before this save, in the form of `path`
        assert (r.index, r.step, r.metrics, r.created) == (was.index, was.step, was.metrics, was.created)
    assert report.removed == tuple(r.path for r in report.removed_checkpoints)
    assert report.removed_steps == tuple(r.step for r in report.removed_checkpoints)


POLICIES = {
    "keep1": 1, "keep2": 2, "keep3": 3, "keep4": 4,
    "best1": KeepBest(1, "acc"),
    "last1|best2": KeepLast(1) | KeepBest(2, "acc", mode="min"),
    "every3|last2": KeepEvery(3) | KeepLast(2),
}


class TestRemovedReport:
    @pytest.mark.parametrize("shards", [None, 2], ids=["unpacked", "packed"])
    @pytest.mark.parametrize("policy", list(POLICIES))
    def test_removed_names_what_the_save_removed(self, tmp_path, policy, shards):
        """Every save: the removed records are the dropped checkpoints' ids, steps and the slot names they had
        before the save (a KeepBest survivor keeps a lower slot than a dropped newer one: names do not follow order)."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        accs = [0.5, 0.9, 0.1, 0.7, 0.3, 0.95, 0.2, 0.6, 0.05, 0.8]
        seen = set()
        with xser.CheckpointSaver(path, keep=POLICIES[policy], shards=shards) as saver:
            for step, acc in enumerate(accs, start=1):
                lin.W[...] = step
                before = xser.checkpoints(path)
                report = saver.save(lin, step=step, metrics={"acc": acc})
                after = xser.checkpoints(path)
                _check_removed(path, before, report, after)
                seen |= set(report.removed)
        assert len(seen) >= 1

    def test_save_and_restart_name_what_they_replaced(self, tmp_path):
        """xser.save replaces the newest (named .data); restart=True removes every checkpoint of the old model."""
        path = str(tmp_path / "m.yaml")
        lin = model()
        save_steps(path, lin, [1, 2, 3], keep=3)
        before = xser.checkpoints(path)
        with xser.CheckpointSaver(path, keep=3, restart=True) as saver:
            report = saver.save(Linear(4, 4), step=10)
        _check_removed(path, before, report, xser.checkpoints(path))
        assert report.removed == (path + ".data", path + ".data.1", path + ".data.2")
        assert report.removed_steps == (3, 2, 1)

    @pytest.mark.parametrize("policy", ["keep2", "last1|best2"])
    def test_after_a_killed_save(self, tmp_path, policy):
        """A save killed before each of its filesystem calls, in turn; the next save's report names, by the names
        they had then, exactly the checkpoints it removed (not those the killed save removed)."""
        from crash_child import arm

        accs = [0.5, 0.9, 0.1, 0.7, 0.3]
        for limit in range(1, 200):
            d = tmp_path / str(limit)
            d.mkdir()
            path = str(d / "m.yaml")
            lin = model()
            with xser.CheckpointSaver(path, keep=POLICIES[policy], durable=False) as saver:
                for step, acc in enumerate(accs[:4], start=1):
                    lin.W[...] = step
                    saver.save(lin, step=step, metrics={"acc": acc})
            pid = os.fork()
            if pid == 0:  # the killed saver
                try:
                    s = xser.CheckpointSaver(path, keep=POLICIES[policy], durable=False)
                    arm(limit)
                    lin.W[...] = 5
                    s.save(lin, step=5, metrics={"acc": accs[4]})
                finally:
                    os._exit(0)
            _, status = os.waitpid(pid, 0)
            before = xser.checkpoints(path)
            with xser.CheckpointSaver(path, keep=POLICIES[policy], durable=False) as saver:
                lin.W[...] = 6
                report = saver.save(lin, step=6, metrics={"acc": 0.0})
            _check_removed(path, before, report, xser.checkpoints(path))
            if os.WIFEXITED(status):  # the save survived: it made fewer calls than limit
                assert limit > 5
                break
        else:
            raise AssertionError("the save never finished")
