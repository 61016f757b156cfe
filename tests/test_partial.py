"""PartialSaver: row blocks written as they are ready, by one or several workers, then one commit."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import xser
from components import Linear, Model

HERE = os.path.dirname(os.path.abspath(__file__))


def setup(tmp_path, rows=10):
    lin = Linear(4, rows)
    full = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    return lin, full, f"{xser.params(lin).name}/W", str(tmp_path / "m.yaml")


class TestPartialSaver:
    def test_blocks_then_finalize(self, tmp_path):
        """Blocks in any order; finalize publishes one model holding them (and the rest of the object)."""
        lin, full, key, path = setup(tmp_path)
        ps = xser.PartialSaver(path, lin)
        for first, stop in [(6, 10), (0, 3), (3, 6)]:
            ps.write_rows(key, first, full[first:stop])
        assert ps.missing() == {}
        ps.finalize(training={"labels": 10})
        m = xser.load(path, verify=True)
        assert np.array_equal(m.W, full) and np.array_equal(m.b, lin.b)
        assert sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data"]
        assert xser.checkpoints(path)[0].training == {"labels": 10}

    def test_gaps_are_refused_and_reported(self, tmp_path):
        """missing() lists the gaps; finalize refuses them and writes nothing."""
        lin, full, key, path = setup(tmp_path)
        ps = xser.PartialSaver(path, lin)
        ps.write_rows(key, 2, full[2:5])
        ps.write_rows(key, 8, full[8:])
        assert ps.missing() == {key: [(0, 2), (5, 8)]}
        with pytest.raises(xser.DataError) as info:
            ps.finalize()
        assert str(info.value) == f"{path}.data.partial: cannot finalize: {key}: rows 0-1, 5-7 are missing"
        assert not os.path.exists(path)

    def test_overlap_is_refused(self, tmp_path):
        """A block overlapping one already written (by any worker) is refused."""
        lin, full, key, path = setup(tmp_path)
        xser.PartialSaver(path, lin, worker="alpha").write_rows(key, 0, full[:5])
        with pytest.raises(xser.DataError, match=r"rows \(4, 6\) overlap the block \(0, 5\) written by alpha"):
            xser.PartialSaver(path, lin, worker="beta").write_rows(key, 4, full[4:6])

    def test_resume(self, tmp_path):
        """A new saver on the same path sees what an interrupted one wrote (DiSMEC++'s --continue)."""
        lin, full, key, path = setup(tmp_path)
        xser.PartialSaver(path, lin).write_rows(key, 0, full[:4])
        with open(os.path.join(path + ".data.partial", key.split("/")[0], "W@4-6.npy.tmp-1-deadbeef"), "wb") as f:
            f.write(b"half a block")  # an interrupted write: ignored
        again = xser.PartialSaver(path, lin)
        assert again.missing() == {key: [(4, 10)]}
        again.write_rows(key, 4, full[4:])
        again.finalize()
        assert np.array_equal(xser.load(path).W, full)

    def test_bad_rows(self, tmp_path):
        """Wrong shape, dtype, range or parameter name: clear errors."""
        lin, full, key, path = setup(tmp_path)
        ps = xser.PartialSaver(path, lin)
        with pytest.raises(xser.DataError, match=r"rows are \(2, 3\) float32; the parameter is \(10, 4\) float32"):
            ps.write_rows(key, 0, np.zeros((2, 3), np.float32))
        with pytest.raises(xser.DataError, match=r"rows are \(2, 4\) float64"):
            ps.write_rows(key, 0, np.zeros((2, 4)))
        with pytest.raises(xser.DataError, match=r"rows \(9, 11\) are outside the parameter's 10 rows"):
            ps.write_rows(key, 9, full[:2])
        with pytest.raises(xser.DataError, match=r"no parameter .*did you mean"):
            ps.write_rows(key.lower(), 0, full[:1])

    def test_several_workers(self, tmp_path):
        """Two worker processes write their own rows; the main process finalizes."""
        lin, full, key, path = setup(tmp_path, rows=12)
        spec_path = str(tmp_path / "layout.yaml")
        xser.save(lin, spec_path)  # the workers rebuild the same object layout from it
        code = (
            "import sys, numpy as np; sys.path.insert(0, {here!r}); import components, xser\n"
            "lin = xser.load({spec!r})\n"
            "ps = xser.PartialSaver({path!r}, lin, worker=sys.argv[1])\n"
            "first, stop = int(sys.argv[2]), int(sys.argv[3])\n"
            "ps.write_rows({key!r}, first, np.arange(first * 4, stop * 4, dtype=np.float32).reshape(-1, 4))\n"
        ).format(here=HERE, spec=spec_path, path=path, key=key)
        procs = [subprocess.Popen([sys.executable, "-c", code, w, str(a), str(b)]) for w, a, b in [("w0", 0, 6), ("w1", 6, 12)]]
        assert [p.wait() for p in procs] == [0, 0]
        ps = xser.PartialSaver(path, xser.load(spec_path))
        assert {n["worker"] for n in ps.written()[key]} == {"w0", "w1"}
        ps.finalize()
        assert np.array_equal(xser.load(path).W, full)

    def test_workers_join_without_the_object(self, tmp_path):
        """Workers that only know the path join the partial save; the layout recorded by the first saver checks them."""
        lin, full, key, path = setup(tmp_path, rows=12)
        ps = xser.PartialSaver(path, lin, worker="main")
        code = (
            "import sys, numpy as np; sys.path.insert(0, {here!r}); import xser\n"
            "ps = xser.PartialSaver.join({path!r}, worker=sys.argv[1])\n"
            "first, stop = int(sys.argv[2]), int(sys.argv[3])\n"
            "ps.write_rows({key!r}, first, np.arange(first * 4, stop * 4, dtype=np.float32).reshape(-1, 4))\n"
        ).format(here=HERE, path=path, key=key)
        procs = [subprocess.Popen([sys.executable, "-c", code, w, str(a), str(b)]) for w, a, b in [("w0", 0, 5), ("w1", 5, 12)]]
        assert [p.wait() for p in procs] == [0, 0]
        ps.finalize()
        assert np.array_equal(xser.load(path).W, full)

    def test_object_built_again_is_adopted(self, tmp_path):
        """An object built again (other random subcollection names, same components) takes over the partial save:
        keys in its own names or the recorded ones, written()/missing() in its own names."""
        lin, full, key, path = setup(tmp_path, rows=12)
        xser.PartialSaver(path, lin).write_rows(key, 0, full[:4])
        again = Linear(4, 12)
        mine = f"{xser.params(again).name}/W"
        assert mine != key
        ps = xser.PartialSaver(path, again)
        assert ps.missing() == {mine: [(4, 12)]}
        assert [n["first"] for n in ps.written()[mine]] == [0]
        ps.write_rows(mine, 4, full[4:8])
        ps.write_rows(key, 8, full[8:])  # the recorded name works too
        ps.finalize()
        m = xser.load(path)
        assert np.array_equal(m.W, full) and np.array_equal(m.b, again.b)
        assert sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data"]

    @pytest.mark.parametrize("other, detail", [
        (lambda: Linear(4, 13), "this object has !TLinear at the root with W (13, 4) float32, b (13,) float32, the partial save "
                                "has !TLinear at the root with W (12, 4) float32, b (12,) float32"),
        (lambda: Model(encoder=Linear(4, 12)), "this object has !TLinear at encoder with W (12, 4) float32, b (12,) float32, the "
                                               "partial save has no component there"),
    ])
    def test_another_object_is_refused(self, tmp_path, other, detail):
        """An object whose components differ (place, class, parameter shapes or dtypes) is refused, saying how."""
        lin, _, _, path = setup(tmp_path, rows=12)
        xser.PartialSaver(path, lin)
        with pytest.raises(xser.DataError) as info:
            xser.PartialSaver(path, other())
        assert str(info.value).startswith(f"{path}.data.partial: the object's parameters differ from the partial save in "
                                          f"progress ({detail}")
        assert str(info.value).endswith("); build the object as the run that started it did, or use PartialSaver.join(path)")
        with pytest.raises(xser.DataError, match="finalize needs the model object"):
            xser.PartialSaver.join(path).finalize()


ROWS, BLOCK = 12, 4


def _script(path: str) -> None:
    """The user's script: build the object (new random names on every run), write the blocks not written yet, finalize."""
    lin = Linear(4, ROWS)
    lin.b[...] = 7
    full = np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4)
    ps = xser.PartialSaver(path, lin)
    key = f"{xser.params(lin).name}/W"
    done = {n["first"] for n in ps.written().get(key, [])}
    for first in range(0, ROWS, BLOCK):
        if first not in done:
            ps.write_rows(key, first, full[first:first + BLOCK])
    ps.finalize(training={"labels": ROWS})


def _in_a_process(fn, kill_at: int | None = None) -> bool:
    """Run ``fn`` in a forked process, SIGKILLed just before its ``kill_at``-th filesystem call; True if it finished."""
    from crash_child import arm

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if kill_at is not None:
                arm(kill_at)
            fn()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_a_killed_script_run_again_finishes_the_save(tmp_path):
    """The script killed before each filesystem call of a partial save in turn (layout, blocks, notes, finalize's
    publish, removing the blocks); run again, it resumes and gives exactly what an uninterrupted run gives."""
    whole = str(tmp_path / "whole" / "m.yaml")
    os.makedirs(os.path.dirname(whole))
    assert _in_a_process(lambda: _script(whole))
    (expected,) = xser.read_params(whole).values()
    for limit in range(1, 500):
        d = tmp_path / str(limit)
        d.mkdir()
        path = str(d / "m.yaml")
        finished = _in_a_process(lambda: _script(path), kill_at=limit)
        assert _in_a_process(lambda: _script(path)), f"run again after a kill at call {limit}, the script failed"
        (got,) = xser.read_params(path, verify=True).values()
        assert got.keys() == expected.keys() and all(np.array_equal(got[k], expected[k]) for k in got), limit
        assert xser.checkpoints(path)[0].training == {"labels": ROWS}
        assert sorted(os.listdir(d)) == ["m.yaml", "m.yaml.data"], limit
        if finished:
            break
    else:
        raise AssertionError("the script never finished")
    assert limit > 20  # a kill came before every call of the save
