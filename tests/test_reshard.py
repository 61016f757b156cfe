"""Loading checkpoints saved by several ranks: per-rank training state, resharding rows and hash tables to any
world size (2->1, 2->3, 3->2 and the rest, with slice sizes other than the save's), reading only what a rank
owns. The saves and loads run as threads of this process (``threaded.py``); ``test_gloo_loads`` runs real gloo
jobs of 1, 2 and 3 processes (``reshard_child.py``)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import xser
from helpers import free_port
import xser.dist
from xser.model.tables import IdSlice, may_hold
from xser.storage.disk import dirhandle

from reshard_model import ALL_IDS, SLICE, Shard, problems, save, t_rows
from threaded import run

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def slice_size():
    SLICE["size"] = 12
    yield
    SLICE["size"] = 12


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Checkpoints saved by 1, 2 and 3 ranks (steps 1 and 2), the table in blocks of 5 rows."""
    SLICE["size"] = 12
    root = tmp_path_factory.mktemp("saved")
    return {n: save(str(root / f"m{n}.yaml"), n, steps=2, blocks={"*/emb@*": 5}) for n in (1, 2, 3)}


def loads(path: str, n: int, **kw) -> list:
    """Each rank's problems after loading ``path`` at world size ``n`` (the newest checkpoint is step 2)."""
    return run(n, lambda c: problems(xser.load(path, coordinator=c, **kw), c, 2))


class TestTrainingState:
    def test_each_rank_gets_its_own(self, saved):
        for n in (2, 3):
            got = run(n, lambda c: xser.load_training_state(saved[n], coordinator=c))
            assert [g["rng"].tolist() for g in got] == [[100 * r + 2] * 3 for r in range(n)]
            older = run(n, lambda c: xser.load_training_state(saved[n], checkpoint=1))  # xser.dist.current() in each thread
            assert [g["rng"].tolist() for g in older] == [[100 * r + 1] * 3 for r in range(n)]

    def test_resume_gives_each_rank_its_state_and_training(self, saved):
        got = run(3, lambda c: xser.resume(saved[3], coordinator=c))
        assert [(g.step, g.training_state["rng"][0], g.checkpoint.training, g.checkpoint.has_training_state) for g in got] == [
            (2, 100 * r + 2, {"rank": r, "epoch": 7}, True) for r in range(3)]
        assert run(3, lambda c: problems(xser.resume(saved[3], coordinator=c).model, c, 2)) == [[], [], []]

    def test_listing_shows_world_size_and_common_training(self, saved):
        ck = xser.checkpoints(saved[3])[0]
        assert (ck.world_size, ck.training, ck.has_training_state) == (3, {"epoch": 7}, True)
        assert xser.checkpoints(saved[1])[0].world_size == 1

    @pytest.mark.parametrize("n, at", [(2, 1), (2, 3), (3, 2)])
    def test_another_world_size_is_refused_naming_both(self, saved, n, at):
        data = os.path.abspath(saved[n][: -len(".yaml")] + ".yaml.data")
        text = (f"{data}: this checkpoint was saved by {n} processes (world size {n}) and is loaded at world size {at}: its "
                f"per-rank training state (RNG states, data positions) belongs to the ranks that saved it; load it at world "
                f"size {n}, or pass rank_state=\"drop\" to start it afresh (the model itself loads at any world size)")
        for fn in (xser.load_training_state, xser.resume):
            with pytest.raises(xser.CheckpointError) as info:
                run(at, lambda c: fn(saved[n], coordinator=c))
            assert all(str(e) == text for e in info.value.outcomes)

    def test_a_plain_load_of_a_multi_rank_checkpoint_is_refused(self, saved):
        with pytest.raises(xser.CheckpointError, match=r"saved by 2 processes \(world size 2\) and is loaded at world size 1"):
            xser.load_training_state(saved[2])
        with pytest.raises(xser.CheckpointError, match=r"saved by 3 processes \(world size 3\) and is loaded at world size 1"):
            xser.resume(saved[3])

    def test_drop(self, saved):
        assert xser.load_training_state(saved[2], rank_state="drop") is None
        got = run(3, lambda c: xser.resume(saved[2], coordinator=c, rank_state="drop"))
        assert [(g.training_state, g.checkpoint.training, g.checkpoint.has_training_state) for g in got] == [(None, {"epoch": 7}, True)] * 3
        assert run(3, lambda c: problems(xser.resume(saved[2], coordinator=c, rank_state="drop").model, c, 2)) == [[], [], []]
        # at the saving world size, "drop" changes nothing
        assert [g["rng"][0] for g in run(2, lambda c: xser.load_training_state(saved[2], rank_state="drop"))] == [2, 102]

    def test_one_process_checkpoint_at_world_size_two(self, saved):
        data = os.path.abspath(saved[1] + ".data")
        with pytest.raises(xser.CheckpointError) as info:
            run(2, lambda c: xser.load_training_state(saved[1]))
        assert str(info.value) == (
            f"{data}: this checkpoint was saved by one process (world size 1) and is loaded at world size 2: its training "
            "state would be the same on every rank (RNG states must differ); load it in one process, or pass "
            "rank_state=\"drop\" to start it afresh or rank_state=\"replicate\" to give every rank the saved one (the model "
            "itself loads at any world size)")
        got = run(2, lambda c: xser.load_training_state(saved[1], rank_state="replicate"))
        assert [g["rng"].tolist() for g in got] == [[2, 2, 2]] * 2
        assert run(2, lambda c: xser.load_training_state(saved[1], rank_state="drop")) == [None, None]
        got = run(2, lambda c: xser.resume(saved[1], rank_state="replicate"))
        assert [(g.training_state["rng"][0], g.checkpoint.training) for g in got] == [(2, {"rank": 0, "epoch": 7})] * 2

    def test_replicate_is_only_for_one_process_checkpoints(self, saved):
        with pytest.raises(xser.CheckpointError, match=r'start it afresh \(rank_state="replicate" is for a checkpoint saved by one '
                                                      r'process\) \(the model itself'):
            xser.load_training_state(saved[2], rank_state="replicate")

    def test_bad_rank_state(self, saved):
        with pytest.raises(xser.CheckpointError) as info:
            xser.resume(saved[2], rank_state="keep")
        assert str(info.value) == f"{saved[2]}: rank_state must be one of 'error', 'drop', 'replicate', got 'keep'"

    def test_training_dicts_that_differ_count_as_per_rank_state(self, tmp_path):
        path = save(str(tmp_path / "m.yaml"), 2, state=False)
        with pytest.raises(xser.CheckpointError, match="saved without training_state"):
            xser.load_training_state(path, rank_state="drop")
        with pytest.raises(xser.CheckpointError, match=r"its per-rank training metadata \(training=, which differs between the ranks\)"):
            xser.resume(path)
        assert xser.resume(path, rank_state="drop").checkpoint.training == {"epoch": 7}
        same = save(str(tmp_path / "same.yaml"), 2, state=False, training=False)
        assert xser.resume(same).training_state is None  # nothing per rank: nothing refused

    def test_a_rank_without_state(self, tmp_path):
        path = save(str(tmp_path / "m.yaml"), 2, state=[0])
        with pytest.raises(xser.CheckpointError) as info:
            run(2, lambda c: xser.load_training_state(path))
        assert str(info.value) == f"{os.path.abspath(path)}.data: rank 1 saved no training_state (other ranks did)"
        assert [g.training_state for g in run(2, lambda c: xser.resume(path))][1] is None


class TestReshard:
    @pytest.mark.parametrize("n", [1, 2, 3])
    @pytest.mark.parametrize("at", [1, 2, 3])
    @pytest.mark.parametrize("size", [12, 8, 5, 24])
    def test_rows_and_tables_at_any_world_and_slice_size(self, saved, n, at, size):
        """Every rank holds exactly its rows and the ids its slice (of any size) says, once; ``problems`` compares
        them with the values they were saved with."""
        SLICE["size"] = size
        assert loads(saved[n], at) == [[]] * at

    def test_a_plain_load_holds_everything(self, saved):
        for n in (2, 3):
            m = xser.load(saved[n])
            assert problems(m, xser.dist.Local(), 2) == [] and len(m.emb) == ALL_IDS.size

    def test_tables_by_ids_read_only_the_runs_that_can_hold_them(self, saved):
        SLICE["size"] = None  # the table declares no slice: tables= chooses
        sub = xser.params(xser.load(saved[3])).name
        want = np.array([-(2**63), 0, 13, 2**63 - 1, 999], np.int64)  # 999 is not in the table
        m = xser.load(saved[3], tables={f"{sub}/emb": want})
        have = np.sort(want[np.isin(want, ALL_IDS)])
        assert m.emb.ids.tolist() == have.tolist()
        assert np.array_equal(m.emb.get(have), t_rows(2, have)) and np.array_equal(m.emb.get(have, slot="m"), -t_rows(2, have))
        m = xser.load(saved[3], tables={f"{sub}/emb": IdSlice(3, 4, 7)})
        assert m.emb.ids.tolist() == np.sort(ALL_IDS[IdSlice(3, 4, 7).mask(ALL_IDS)]).tolist()

    def test_an_id_outside_the_slice_is_refused_at_insert(self):
        with xser.dist.using(_Rank(1, 2)):
            m = Shard()
        with pytest.raises(xser.DataError) as info:
            m.emb.get([6, 7, 5, 17], insert=True)
        assert str(info.value) == (f"{xser.params(m).name}: table 'emb': ids 5, 17 are outside this process's IdSlice(6, 12, 12) "
                                   "(id % 12 must be in [6, 12)): route each id to the rank whose slice holds it")
        assert len(m.emb) == 0

    def test_verify_checks_the_files_read(self, saved, tmp_path):
        import shutil

        copy = str(tmp_path / "m.yaml")
        shutil.copy(saved[2], copy)
        shutil.copytree(saved[2] + ".data", copy + ".data")
        sub = xser.params(xser.load(copy)).name
        with xser.CheckpointReader(copy) as reader:  # rank 0's first block of the slot
            first = reader._data.subcollections[sub]["emb@m"].blocks[0].file
        with open(os.path.join(copy + ".data", first), "r+b") as f:
            f.seek(-4, 2)
            f.write(b"\x00\x00\x80\x7f")
        assert run(2, lambda c: problems(xser.load(copy, coordinator=c), c, 2))[1] == []  # rank 1 never reads that file
        with pytest.raises(xser.DataError, match="checksum"):
            run(2, lambda c: xser.load(copy, coordinator=c, verify=True))


class _Rank:
    """A coordinator that only knows its place (for building a rank's model outside a job)."""

    def __init__(self, rank: int, n: int) -> None:
        self.rank, self.world_size, self.timeout = rank, n, 1.0


class TestMayHold:
    @pytest.mark.parametrize("saved_size, wanted_size", [(12, 12), (12, 8), (12, 5), (6, 24), (7, 7), (1, 3)])
    def test_exact_against_brute_force(self, saved_size, wanted_size):
        """A saved slice may hold wanted ids exactly when some id of it is wanted (checked over every residue)."""
        ids = np.arange(-3 * saved_size * wanted_size, 3 * saved_size * wanted_size, dtype=np.int64)
        for a in range(saved_size + 1):
            for b in range(a, saved_size + 1):
                s = IdSlice(a, b, saved_size)
                for c in range(wanted_size + 1):
                    for d in range(c, min(wanted_size, c + 3) + 1):
                        w = IdSlice(c, d, wanted_size)
                        assert may_hold(s, w) == bool((s.mask(ids) & w.mask(ids)).any()), (s, w)

    def test_ids(self):
        assert may_hold(IdSlice(0, 6, 12), [5, 18]) and not may_hold(IdSlice(0, 6, 12), [6, 19])
        assert may_hold(IdSlice(3, 4, 12), [-1]) and not may_hold(IdSlice(4, 12, 12), [-1]) and not may_hold(IdSlice(0, 6, 12), [])  # -1 as uint64: 2**64 - 1, bucket 3

    def test_bad_slices_attribute(self, saved, tmp_path):
        import shutil

        copy = str(tmp_path / "m.yaml")
        shutil.copy(saved[2], copy)
        shutil.copytree(saved[2] + ".data", copy + ".data")
        mpath = os.path.join(copy + ".data", "manifest.json")
        with open(mpath) as f:
            m = json.load(f)
        sub = next(iter(m["subcollections"]))
        m["subcollections"][sub]["emb@id"]["attrs"]["xser"]["slices"][1][3] += 1
        with open(mpath, "w") as f:
            json.dump(m, f)
        with pytest.raises(xser.DataError) as info:
            run(2, lambda c: xser.load(copy, coordinator=c))
        assert str(info.value).startswith(f"{os.path.abspath(copy)}.data/{sub}: {sub}/emb@id: attrs.xser.slices must be "
                                          "[[begin, end, size, first row, rows], ...] tiling its")


# ---------------------------------------------------------------- what a rank reads


@pytest.fixture
def counted(monkeypatch):
    """Bytes read from each array file of a checkpoint, per thread: ``{thread id: Counter(file -> bytes)}``."""
    log: dict = collections.defaultdict(collections.Counter)
    real = dirhandle.DirHandle.open_file

    def open_file(self, rel, **kw):
        f = real(self, rel, **kw)
        return _Counting(f, rel, log[threading.get_ident()]) if "/" in rel else f

    monkeypatch.setattr(dirhandle.DirHandle, "open_file", open_file)
    return log


class _Counting:
    def __init__(self, f, rel, counter) -> None:
        self._f, self._rel, self._counter = f, rel, counter
        counter[rel] += 0

    def read(self, n=-1):
        b = self._f.read(n)
        self._counter[self._rel] += len(b)
        return b

    def readinto(self, b):
        n = self._f.readinto(b)
        self._counter[self._rel] += n or 0
        return n

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


BIG_IDS = np.arange(0, 6000, dtype=np.int64) * 7 - 2000
HEADER = 128  # an .npy header


def big() -> Shard:
    return Shard(rows=3000, cols=64, dim=16)


def test_each_rank_reads_its_rows_and_the_runs_its_slice_meets(tmp_path, counted):
    """2 -> 3 ranks: rows of W read exactly (plus headers); the table's runs of saved ranks whose slice cannot hold a
    rank's ids are never opened, and those read are read once; 2 -> 2 and 2 -> 1 read exactly what each rank holds."""
    path = save(str(tmp_path / "big.yaml"), 2, ids=BIG_IDS, make=big, state=False, training=False)
    entries = xser.CheckpointReader(path)._data.subcollections
    sub = next(iter(entries))
    e = entries[sub]
    row_w, row_t = 64 * 4, 8 + 2 * 16 * 4
    slices = e["emb@id"].attrs["xser"]["slices"]
    assert [s[:3] for s in slices] == [[0, 6, 12], [6, 12, 12]]
    run_bytes = [s[4] * row_t for s in slices]

    def load(c):
        counted[threading.get_ident()].clear()
        m = xser.load(path, coordinator=c)
        assert problems(m, c, 1, BIG_IDS) == []
        got = dict(counted[threading.get_ident()])
        return m, got

    def files(got, part):
        return {f: n for f, n in got.items() if f.split("/")[-1].startswith(part + "@")}

    for at, runs_read in ((3, [[0], [0, 1], [1]]), (2, [[0], [1]])):
        for r, (m, got) in enumerate(run(at, load)):
            a, b = xser.dist.rows(3000, _Rank(r, at))
            w = sum(files(got, "W").values())
            assert (b - a) * row_w <= w <= (b - a) * row_w + 2 * HEADER
            table = {f: n for f, n in got.items() if "emb@" in f}
            opened = {k for k, bl in enumerate(slices) for f in table if _in_run(entries[sub], f, bl)}
            assert sorted(opened) == runs_read[r], (at, r)
            read = sum(table.values())
            assert read <= sum(run_bytes[k] for k in runs_read[r]) + 3 * HEADER * len(table)
            owned = len(m.emb) * row_t
            if at == 2:
                assert read <= owned + 3 * HEADER * len(table)
    counted.clear()
    m = xser.load(path)  # one process: every byte once (prefetched on the pool's threads)
    total = sum(sum(c.values()) for c in counted.values())
    held = 3000 * row_w + 64 * 4 + len(m.emb) * row_t
    assert held <= total <= held + HEADER * sum(len(c) for c in counted.values())


def _in_run(entries: dict, f: str, sl: list) -> bool:
    """Whether file ``f`` holds rows of the run ``sl`` (``[begin, end, size, first, rows]``) of the table."""
    for name, e in entries.items():
        for b in e.blocks:
            if b.file == f and b.start is not None and "emb@" in name:
                return sl[3] <= b.start[0] < sl[3] + sl[4]
    return False


# ---------------------------------------------------------------- real processes



@pytest.mark.campaign  # (test_dist.py loads in real gloo jobs of 1, 2 and 3 ranks in the default run)
def test_gloo_loads(saved):
    """The 2-rank checkpoint loaded by a gloo job of 3 processes at slice size 8: each rank holds its rows and the ids
    its slice says; its training state is refused, naming both world sizes. (Threads cover the other world sizes;
    each process here spends seconds importing torch.)"""
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]))
    port = free_port()
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "reshard_child.py"), str(r), "3", str(port), saved[2], "8"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(3)]
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    data = os.path.abspath(saved[2] + ".data")
    assert out == [{"rank": r, "problems": [], "state": (
        f"CheckpointError: this checkpoint was saved by 2 processes (world size 2) and is loaded at world size 3: its per-rank "
        f"training state (RNG states, data positions) belongs to the ranks that saved it; load it at world size 2, or pass "
        f"rank_state=\"drop\" to start it afresh (the model itself loads at any world size)")} for r in range(3)], data


@xser.serializable(tag="!FewRows")
class FewRows:
    """Fewer rows than ranks: some rank holds none."""

    n: int = 2

    def __attrs_post_init__(self):
        self.W = xser.params(self).add("W", (self.n, 3), rows=xser.dist.rows(self.n))


def test_a_rank_without_rows_saves_and_loads_nothing(tmp_path):
    path = str(tmp_path / "m.yaml")

    def saving(c):
        m = FewRows()
        first, stop = xser.dist.rows(2)
        m.W[...] = np.arange(first, stop, dtype=np.float32)[:, None]
        xser.save(m, path, coordinator=c)

    run(3, saving)
    loaded = run(3, lambda c: xser.load(path, coordinator=c).W)
    assert [w.shape for w in loaded] == [(1, 3), (1, 3), (0, 3)]
    assert [w[:, 0].tolist() for w in loaded] == [[0.0], [1.0], []]
