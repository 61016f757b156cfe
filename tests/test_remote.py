"""Models on object stores: save, load, rotation, commit records, clean-up, conflicts (memory:// and S3 on moto)."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

pytest.importorskip("fsspec")

import xser  # noqa: E402
from components import Linear, Model  # noqa: E402
from xser.storage.objects import commit as objects  # noqa: E402
from xser.storage.stores import store_for  # noqa: E402
from xser.storage.stores.remote import FsspecStore  # noqa: E402


@pytest.fixture
def remote(remote_root):
    return remote_root


def model(value=0.0):
    lin = Linear(3, 2)
    lin.W[...] = value
    lin.b[...] = value
    return lin


def objects_under(url, options=None):
    store = store_for(url, options)
    return sorted(k[len(url):] for k in store.list(url.rsplit("/", 1)[0]) if k.startswith(url))


PREFIX = re.compile(r"^\.data/(\d{20})-([0-9a-f]{32})/")


def prefixes(url, options=None):
    return sorted({m.group(0)[len(".data/"):-1] for k in objects_under(url, options) if (m := PREFIX.match(k))})


class TestSaveLoad:
    def test_round_trip_and_layout(self, remote):
        url = remote.url("run/m.yaml")
        lin = model(1.5)
        xser.save(lin, url, storage_options=remote.options)
        back = xser.load(url, storage_options=remote.options)
        assert np.array_equal(back.W, lin.W) and np.array_equal(back.b, lin.b)
        names = objects_under(url, remote.options)
        (ck,) = prefixes(url, remote.options)
        assert ck.startswith("00000000000000000001-")
        sub = xser.params(lin).name
        assert names == sorted([
            "", ".data/commits/00000000000000000001.json", f".data/{ck}/manifest.json", f".data/{ck}/spec.yaml",
            f".data/{ck}/{sub}/W.npy", f".data/{ck}/{sub}/b.npy",
        ])
        record = json.loads(store_for(url, remote.options).read_bytes(url + ".data/commits/00000000000000000001.json", "r"))
        assert record["format"] == "xser-commit" and record["seq"] == 1
        assert [c["dir"] for c in record["checkpoints"]] == [ck]

    def test_save_replaces_newest(self, remote):
        url = remote.url("m.yaml")
        xser.save(model(1.0), url, storage_options=remote.options)
        xser.save(model(2.0), url, storage_options=remote.options)
        assert np.all(xser.load(url, storage_options=remote.options).W == 2.0)
        assert [c.index for c in xser.checkpoints(url, storage_options=remote.options)] == [0]
        (ck,) = prefixes(url, remote.options)
        assert ck.startswith("00000000000000000002-")  # the first checkpoint's objects are gone

    def test_read_params_rows(self, remote):
        url = remote.url("m.yaml")
        lin = Linear(3, 50)
        lin.W[...] = np.arange(150, dtype=lin.W.dtype).reshape(50, 3)
        xser.save(lin, url, storage_options=remote.options)
        sub = xser.params(lin).name
        got = xser.read_params(url, rows={f"{sub}/W": (10, 12)}, storage_options=remote.options)[sub]["W"]
        assert np.array_equal(got, lin.W[10:12])

    def test_mmap_reads_on_a_store(self, remote):
        url = remote.url("m.yaml")
        xser.save(model(3.0), url, storage_options=remote.options)
        back = xser.load(url, mmap=True, storage_options=remote.options)
        assert np.all(back.W == 3.0)

    def test_nested_model_and_verify(self, remote):
        url = remote.url("m.yaml")
        m = Model(encoder=Linear(2, 3), decoder=Linear(3, 2))
        xser.save(m, url, storage_options=remote.options)
        back = xser.load(url, verify=True, storage_options=remote.options)
        assert np.array_equal(back.encoder.W, m.encoder.W) and np.array_equal(back.decoder.W, m.decoder.W)

    def test_missing_model(self, remote):
        url = remote.url("none.yaml")
        with pytest.raises(xser.SpecError) as e:
            xser.load(url, storage_options=remote.options)
        assert str(e.value) == f"{url}: file not found"


class TestRotation:
    def test_keep_last_deletes_dropped_objects(self, remote):
        url = remote.url("m.yaml")
        lin = model()
        with xser.CheckpointSaver(url, keep=3, storage_options=remote.options) as saver:
            for step in range(1, 6):
                lin.W[...] = step
                saver.save(lin, step=step, metrics={"loss": 1.0 / step})
        assert [c.step for c in xser.checkpoints(url, storage_options=remote.options)] == [5, 4, 3]
        for k, step in enumerate([5, 4, 3]):
            assert np.all(xser.load(url, checkpoint=k, storage_options=remote.options).W == step)
        assert [p[:20] for p in prefixes(url, remote.options)] == [f"{n:020d}" for n in (3, 4, 5)]
        records = [k for k in objects_under(url, remote.options) if k.startswith(".data/commits/")]
        assert records == [f".data/commits/{n:020d}.json" for n in (3, 4, 5)]  # KEEP_RECORDS = 3

    def test_keep_best(self, remote):
        url = remote.url("m.yaml")
        lin = model()
        scores = [0.5, 0.9, 0.1, 0.3, 0.2]
        with xser.CheckpointSaver(url, keep=xser.KeepBest(1, "acc"), storage_options=remote.options) as saver:
            for step, acc in enumerate(scores, start=1):
                lin.W[...] = step
                saver.save(lin, step=step, metrics={"acc": acc})
        assert [c.step for c in xser.checkpoints(url, storage_options=remote.options)] == [5, 2]
        best = xser.load(url, checkpoint="best", metric="acc", storage_options=remote.options)
        assert np.all(best.W == 2)

    def test_unchanged_arrays_are_copied_on_the_server(self, remote):
        url = remote.url("m.yaml")
        lin = model(1.0)
        with xser.CheckpointSaver(url, keep=2, storage_options=remote.options) as saver:
            saver.save(lin, step=1)
            lin.W[...] = 2.0  # b unchanged
            report = saver.save(lin, step=2)
        assert (report.written, report.linked) == (1, 1)
        assert np.array_equal(xser.load(url, storage_options=remote.options).b, lin.b)

    def test_resume_and_training_state(self, remote):
        url = remote.url("m.yaml")
        lin = model(4.0)
        with xser.CheckpointSaver(url, keep=2, storage_options=remote.options) as saver:
            saver.save(lin, step=7, training_state={"m": np.arange(3.0)})
        r = xser.resume(url, storage_options=remote.options)
        assert r.step == 7 and np.all(r.model.W == 4.0)
        assert np.array_equal(r.training_state["m"], np.arange(3.0))
        assert xser.resume(remote.url("fresh.yaml"), storage_options=remote.options) is None

    def test_restart_replaces_everything(self, remote):
        url = remote.url("m.yaml")
        lin = model(1.0)
        with xser.CheckpointSaver(url, keep=3, storage_options=remote.options) as saver:
            saver.save(lin, step=1)
            lin.W[...] = 2.0
            saver.save(lin, step=2)
        with xser.CheckpointSaver(url, keep=3, restart=True, storage_options=remote.options) as saver:
            saver.save(Linear(4, 4), step=1)
        assert [c.step for c in xser.checkpoints(url, storage_options=remote.options)] == [1]
        assert len(prefixes(url, remote.options)) == 1


class TestCommit:
    def test_a_failed_save_leaves_the_previous_checkpoint_and_is_cleaned_up(self, remote, monkeypatch):
        url = remote.url("m.yaml")
        xser.save(model(1.0), url, storage_options=remote.options)
        calls = []

        def boom(op, path):
            calls.append((op, path))
            if op == "write" and path.endswith("manifest.json"):
                raise KeyboardInterrupt  # the save dies just before its manifest
        monkeypatch.setattr(FsspecStore, "on_request", staticmethod(boom))
        with pytest.raises(KeyboardInterrupt):
            xser.save(model(2.0), url, storage_options=remote.options)
        monkeypatch.setattr(FsspecStore, "on_request", None)
        assert np.all(xser.load(url, storage_options=remote.options).W == 1.0)
        xser.save(model(3.0), url, storage_options=remote.options)
        assert np.all(xser.load(url, storage_options=remote.options).W == 3.0)
        (ck,) = prefixes(url, remote.options)
        assert ck.startswith("00000000000000000002-")

    def test_a_concurrent_commit_makes_the_save_fail(self, remote):
        url = remote.url("m.yaml")
        xser.save(model(1.0), url, storage_options=remote.options)
        store = store_for(url, remote.options)
        # another saver commits 2 first (its record names the same checkpoint: enough to take the number)
        rec = json.loads(store.read_bytes(url + ".data/commits/00000000000000000001.json", "r"))
        rec["seq"] = 2
        store.put(url + ".data/commits/00000000000000000002.json", json.dumps(rec).encode(), create_only=True)
        real = objects.latest
        try:
            objects.latest = lambda store, path: (1, real(store, path)[1] | {"seq": 1})  # this saver read commit 1
            with pytest.raises(xser.CheckpointError) as e:
                xser.save(model(2.0), url, storage_options=remote.options)
        finally:
            objects.latest = real
        assert str(e.value) == (f"{url}: another process saved this model meanwhile (commit 2 exists); this save was not "
                                "committed and its objects are removed")
        assert np.all(xser.load(url, storage_options=remote.options).W == 1.0)

    def test_a_failed_clean_up_is_a_warning_and_the_next_save_finishes_it(self, remote, monkeypatch, caplog):
        url = remote.url("m.yaml")
        lin = model(1.0)
        with xser.CheckpointSaver(url, keep=1, storage_options=remote.options) as saver:
            saver.save(lin, step=1)

            def no_deletes(op, path):
                if op == "delete":
                    raise xser.StorageError("cannot delete: access denied (test)", xser.Location(path))
            monkeypatch.setattr(FsspecStore, "on_request", staticmethod(no_deletes))
            lin.W[...] = 2.0
            report = saver.save(lin, step=2)
            monkeypatch.setattr(FsspecStore, "on_request", None)
            assert report.removed_steps == (1,)
            assert "saved (commit 2), but removing what it replaced failed" in caplog.text
            assert len(prefixes(url, remote.options)) == 2  # the dropped checkpoint's objects are still there
            assert [c.step for c in xser.checkpoints(url, storage_options=remote.options)] == [2]
            lin.W[...] = 3.0
            saver.save(lin, step=3)
        assert [p[:20] for p in prefixes(url, remote.options)] == [f"{3:020d}"]

    def test_a_second_saver_is_refused_at_its_next_save(self, remote):
        """No lock on an object store: a CheckpointSaver that finds a commit it did not make (another saver's) refuses to
        save, as a second saver is refused on a local disk; what was committed stays whole."""
        url = remote.url("m.yaml")
        lin = model(1.0)
        first = xser.CheckpointSaver(url, keep=3, storage_options=remote.options)
        second = xser.CheckpointSaver(url, keep=3, storage_options=remote.options)
        first.save(lin, step=1)
        lin.W[...] = 2.0
        with pytest.raises(xser.CheckpointError) as e:
            second.save(lin, step=2)
        assert str(e.value) == (f"{url}: another process saved this model since this saver's last commit (0; the newest "
                                "is 1): one saver per model")
        lin.W[...] = 3.0
        first.save(lin, step=3)  # its own commits are no obstacle
        assert [c.step for c in xser.checkpoints(url, storage_options=remote.options)] == [3, 1]
        third = xser.CheckpointSaver(url, keep=3, storage_options=remote.options)  # a saver started later goes on
        third.save(lin, step=4)
        with pytest.raises(xser.CheckpointError):
            first.save(lin, step=5)

    def test_nothing_is_written_under_a_local_folder_named_after_the_scheme(self, tmp_path, monkeypatch):
        monkeypatch.chdir(tmp_path)
        with pytest.raises(xser.XserError):
            xser.save(model(), "nosuchscheme://bucket/m.yaml")
        assert os.listdir(tmp_path) == []


class TestSpecs:
    def test_load_serialized_from_a_store(self, remote):
        """A local config loads a component out of a model on a store; a config on the store finds a model beside it."""
        url = remote.url("run/m.yaml")
        m = Model(encoder=Linear(2, 3))
        m.encoder.W[...] = 7.0
        xser.save(m, url, storage_options=remote.options)
        store = store_for(url, remote.options)
        text = f"e:\n  enc: !LoadSerialized {{filename: {url}, path: encoder}}\n"
        store.put(remote.url("run/exp.yaml"), text.encode())
        exps = xser.load_config(remote.url("run/exp.yaml"), storage_options=remote.options)
        built = xser.build(exps["e"], storage_options=remote.options)
        assert np.all(built["enc"].W == 7.0)
        rel = "e:\n  enc: !LoadSerialized {filename: m.yaml, path: encoder}\n"
        store.put(remote.url("run/rel.yaml"), rel.encode())
        built = xser.build(xser.load_config(remote.url("run/rel.yaml"), storage_options=remote.options)["e"],
                           storage_options=remote.options)
        assert np.all(built["enc"].W == 7.0)


class TestMmap:
    def test_mmap_maps_a_local_copy_and_leaves_nothing_behind(self, remote, tmp_path, monkeypatch):
        """mmap=True on a store gives copy-on-write maps of unlinked local copies, bit-exact, verified on request."""
        import tempfile

        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        url = remote.url("m.yaml")
        lin = Linear(3, 40)
        lin.W[...] = np.arange(120, dtype=lin.W.dtype).reshape(40, 3)
        xser.save(lin, url, storage_options=remote.options)
        for verify in (False, True):
            back = xser.load(url, mmap=True, verify=verify, storage_options=remote.options)
            assert isinstance(back.W, np.memmap) and np.array_equal(back.W, lin.W)
            back.W[0, 0] = -1.0  # copy-on-write: the store's object is unchanged
        assert os.listdir(tmp_path) == []
        assert np.array_equal(xser.load(url, storage_options=remote.options).W, lin.W)


class TestTorch:
    def test_torch_modules_through_a_store_cpu_and_cuda(self, remote):
        """A torch module saves to and loads from a store bit-exactly, on the CPU and (where there is one) from and to
        a CUDA device: device tensors reach the store through one host copy each."""
        torch = pytest.importorskip("torch")
        import xser.torch  # noqa: F401

        lin = xser.torch.wrap(torch.nn.Linear(4, 3))
        url = remote.url("t.yaml")
        xser.save(lin, url, storage_options=remote.options)
        back = xser.load(url, storage_options=remote.options)
        assert torch.equal(back.module.weight, lin.module.weight) and torch.equal(back.module.bias, lin.module.bias)
        if torch.cuda.is_available():
            on_gpu = xser.load(url, device="cuda", storage_options=remote.options)
            assert on_gpu.module.weight.device.type == "cuda"
            with torch.no_grad():
                on_gpu.module.weight.mul_(2)
            again = remote.url("t2.yaml")
            xser.save(on_gpu, again, storage_options=remote.options)
            assert torch.equal(xser.load(again, storage_options=remote.options).module.weight, lin.module.weight * 2)


class TestSpool:
    def test_a_killed_save_s_spool_is_removed_by_the_next_one(self, remote, tmp_path, monkeypatch):
        """Spool directories carry their process id; a save removes those of processes that no longer run (a SIGKILLed
        save's), never a live one's, and its own when it is done."""
        import subprocess
        import sys
        import tempfile

        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        left = tmp_path / f"xser-spool-{int(dead.stdout)}-abcd"
        (left / "Linear.x").mkdir(parents=True)
        live = tmp_path / f"xser-spool-{os.getppid()}-efgh"
        live.mkdir()
        xser.save(model(1.0), remote.url("m.yaml"), storage_options=remote.options)
        assert sorted(os.listdir(tmp_path)) == [live.name]
