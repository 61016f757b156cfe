"""Checkpoint averaging."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import xser
from components import Linear, Model, Norm
from strategies import bit_equal, leaf_of
from xser.tools.average import average, select


def run_of(tmp_path, values, metrics=None, keep=10):
    """A model with one Linear and one Norm, checkpointed once per W value (newest last)."""
    path = str(tmp_path / "m.yaml")
    m = Model(encoder=Linear(5, 3), decoder=Norm(3))
    with xser.CheckpointSaver(path, keep=keep) as saver:
        for i, v in enumerate(values):
            m.encoder.W[...] = v
            m.decoder.count[...] = i + 1
            saver.save(m, step=i + 1, metrics=None if metrics is None else {"bleu": metrics[i]})
    return path, m


class TestMean:
    def test_unweighted_mean(self, tmp_path):
        """The result is the elementwise mean, computed in float64 and cast back."""
        rng = np.random.default_rng(0)
        values = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(4)]
        path, m = run_of(tmp_path, values)
        report = average(path, tmp_path / "avg.yaml")
        got = xser.load(tmp_path / "avg.yaml").encoder.W
        assert bit_equal(got, np.mean(np.stack(values).astype(np.float64), axis=0).astype(np.float32))
        assert len(report.checkpoints) == 4 and report.weights == (1.0,) * 4

    def test_weighted_mean_in_float64(self, tmp_path):
        """Weights multiply in the accumulator's precision, not the data's."""
        rng = np.random.default_rng(1)
        values = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(3)]
        path, _ = run_of(tmp_path, values)
        average(path, tmp_path / "avg.yaml", weights=[0.5, 0.25, 3.0])  # newest first
        v = [x.astype(np.float64) for x in values[::-1]]
        expected = ((v[0] * 0.5 + v[1] * 0.25 + v[2] * 3.0) / 3.75).astype(np.float32)
        assert bit_equal(xser.load(tmp_path / "avg.yaml").encoder.W, expected)

    def test_integers_are_copied_from_newest(self, tmp_path):
        """Integer arrays (step counters) are never averaged: they come from the newest selected checkpoint."""
        path, _ = run_of(tmp_path, [1.0, 2.0, 3.0])
        report = average(path, tmp_path / "avg.yaml", checkpoints=[1, 2])
        assert xser.load(tmp_path / "avg.yaml").decoder.count == 2
        assert any(c.endswith("/count") for c in report.copied)

    def test_spec_is_a_drop_in_replacement(self, tmp_path):
        """The output spec is the input's text; subcollection names are unchanged."""
        path, m = run_of(tmp_path, [1.0, 3.0])
        average(path, tmp_path / "avg.yaml")
        assert Path(tmp_path / "avg.yaml").read_text() == Path(path).read_text()
        assert np.all(xser.load(tmp_path / "avg.yaml").encoder.W == 2.0)

    def test_chunking_is_exact(self, tmp_path):
        """Chunk boundaries do not change the result (a tiny memory budget forces many chunks)."""
        rng = np.random.default_rng(2)
        values = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(3)]
        path, _ = run_of(tmp_path, values)
        average(path, tmp_path / "a.yaml")
        average(path, tmp_path / "b.yaml", memory_budget=1)
        assert bit_equal(xser.load(tmp_path / "a.yaml").encoder.W, xser.load(tmp_path / "b.yaml").encoder.W)

    def test_float32_accumulation(self, tmp_path):
        """accumulate='float32' is allowed and close to the float64 mean."""
        path, _ = run_of(tmp_path, [1.0, 2.0, 4.0])
        average(path, tmp_path / "a.yaml", accumulate="float32")
        assert np.allclose(xser.load(tmp_path / "a.yaml").encoder.W, 7 / 3)

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        arr=hnp.arrays(
            st.sampled_from([np.float16, np.float32, np.float64, np.complex64, np.dtype(">f4")]),
            hnp.array_shapes(min_dims=0, max_dims=3, max_side=5),
        ),
        n=st.integers(1, 5),
    )
    def test_mean_of_identical_checkpoints_is_the_checkpoint(self, tmp_path_factory, arr, n):
        """Averaging identical checkpoints gives the checkpoint back, bit for bit (nan, inf and -0.0 included)."""
        d = tmp_path_factory.mktemp("same")
        path = str(d / "m.yaml")
        xser.save(leaf_of({"x": arr}), path, durable=False)
        for extra in range(1, n):  # identical copies as older checkpoints (each its own id: another checkpoint)
            shutil.copytree(path + ".data", f"{path}.data.{extra}")
            mp = Path(f"{path}.data.{extra}/manifest.json")
            mp.write_text(mp.read_text().replace(json.loads(mp.read_text())["id"], f"{extra:032x}"))
        average(path, d / "avg.yaml", durable=False)
        (sub,) = xser.read_params(d / "avg.yaml").values()
        assert bit_equal(sub["x"], arr)


class TestSelection:
    def test_last_indices_best(self, tmp_path):
        """--last, --checkpoints and --best --metric pick the expected checkpoints (newest first)."""
        path, _ = run_of(tmp_path, [1.0, 2.0, 3.0, 4.0], metrics=[5.0, 9.0, 1.0, 7.0])
        assert [c.step for c in select(path, last=2)] == [4, 3]
        assert [c.step for c in select(path, indices=[3, 0])] == [4, 1]
        assert [c.step for c in select(path, best=2, metric="bleu")] == [4, 2]
        assert [c.step for c in select(path, best=1, metric="bleu", mode="min")] == [3]

    BAD = [
        (dict(checkpoints=[]), "the selection is empty"),
        (dict(checkpoints=[7]), "no checkpoint 7: the model has 3 (0 to 2)"),
        (dict(checkpoints=[1, 1]), "checkpoint 1 is selected twice"),
        (dict(last=0), "last must be >= 1, got 0"),
        (dict(last=4), "asked for the last 4 checkpoints, but the model has 3; choose at most 3, or no selection to average all 3"),
        (dict(best=4, metric="bleu"),
         "asked for the best 4 checkpoints by 'bleu', but only 3 record it as a number; choose at most 3"),
        (dict(best=2, metric="blue"), "no checkpoint records metric 'blue' as a number (recorded: bleu); did you mean 'bleu'?"),
        (dict(best=2), "best needs a metric"),
        (dict(last=1, best=1, metric="bleu"), "choose one of last, checkpoints and best"),
    ]

    @pytest.mark.parametrize("kw, message", BAD, ids=[m for _, m in BAD])
    def test_bad_selection(self, tmp_path, kw, message):
        """Each bad selection is a CheckpointError; nothing is written."""
        path, _ = run_of(tmp_path, [1.0, 2.0, 3.0], metrics=[1.0, 2.0, 3.0])
        with pytest.raises(xser.CheckpointError) as info:
            average(path, tmp_path / "avg.yaml", **kw)
        assert str(info.value) == f"{path}: {message}"
        assert not os.path.exists(tmp_path / "avg.yaml")

    @pytest.mark.parametrize("weights, message", [
        ([1.0], "1 weights for 2 selected checkpoints"),
        ([1.0, -1.0], "weights must not be negative, got [1.0, -1.0]"),
        ([2.0, -0.5], "weights must not be negative, got [2.0, -0.5]"),
        ([-1.0, -2.0], "weights must not be negative, got [-1.0, -2.0]"),
        ([0.0, 0.0], "weights sum to zero: [0.0, 0.0]"),
        ([1.0, float("nan")], "weights must be finite numbers, got [1.0, nan]"),
        ([float("inf"), 1.0], "weights must be finite numbers, got [inf, 1.0]"),
        ([float("-inf"), 1.0], "weights must be finite numbers, got [-inf, 1.0]"),
    ])
    def test_bad_weights(self, tmp_path, weights, message):
        """Weights must match the selection, be finite and non-negative, and not all be zero."""
        path, _ = run_of(tmp_path, [1.0, 2.0])
        with pytest.raises(xser.CheckpointError) as info:
            average(path, tmp_path / "avg.yaml", weights=weights)
        assert str(info.value) == f"{path}: {message}"
        assert not os.path.exists(tmp_path / "avg.yaml")

    @pytest.mark.parametrize("weights, accumulate, message", [
        ([1e308, 1e308], "float64", "the weights' sum inf is out of float64's range: [1e+308, 1e+308]"),
        ([1e300, 1.0], "float32", "weight 1e+300 is out of float32's range: [1e+300, 1.0]"),
        ([1.0, 1e-300], "float32", "weight 1e-300 is out of float32's range: [1.0, 1e-300]"),
        ([3e38, 3e38], "float32", "the weights' sum 6e+38 is out of float32's range: [3e+38, 3e+38]"),
    ])
    def test_weights_out_of_the_accumulators_range(self, tmp_path, weights, accumulate, message):
        """A weight that would round to 0 or inf in the accumulator, or weights whose sum overflows (every mean would
        be NaN or 0), are refused; a zero weight is allowed."""
        path, _ = run_of(tmp_path, [1.0, 2.0])
        with pytest.raises(xser.CheckpointError) as info:
            average(path, tmp_path / "avg.yaml", weights=weights, accumulate=accumulate)
        assert str(info.value) == f"{path}: {message}"
        assert not os.path.exists(tmp_path / "avg.yaml")
        average(path, tmp_path / "avg.yaml", weights=[0.0, 1e-300], accumulate="float64")
        assert np.all(xser.load(tmp_path / "avg.yaml").encoder.W == 1.0)

    def test_single_checkpoint_is_a_copy_with_a_note(self, tmp_path):
        """Averaging one checkpoint is allowed and says so."""
        path, _ = run_of(tmp_path, [1.0, 2.0])
        report = average(path, tmp_path / "avg.yaml", last=1)
        assert "only one checkpoint selected: the average is a copy of it" in report.notes
        assert np.all(xser.load(tmp_path / "avg.yaml").encoder.W == 2.0)

    def test_output_is_input(self, tmp_path):
        """The output may not be the input."""
        path, _ = run_of(tmp_path, [1.0])
        with pytest.raises(xser.CheckpointError, match="the output is the input model"):
            average(path, path)

    def test_output_exists(self, tmp_path):
        """An existing output is replaced only with force."""
        path, _ = run_of(tmp_path, [1.0, 3.0])
        average(path, tmp_path / "avg.yaml")
        with pytest.raises(xser.CheckpointError, match="the output model exists"):
            average(path, tmp_path / "avg.yaml", last=1)
        average(path, tmp_path / "avg.yaml", last=1, force=True)
        assert np.all(xser.load(tmp_path / "avg.yaml").encoder.W == 3.0)

    def test_model_without_checkpoints(self, tmp_path):
        """A spec without data is a clear error."""
        path, _ = run_of(tmp_path, [1.0])
        shutil.rmtree(path + ".data")
        with pytest.raises(xser.CheckpointError, match="the model has no checkpoints"):
            average(path, tmp_path / "avg.yaml")


class TestStructure:
    def test_mismatch_names_both_sides(self, tmp_path):
        """A parameter whose shape differs between checkpoints: the error names both checkpoints and shapes."""
        path, m = run_of(tmp_path, [1.0, 2.0])
        sub = xser.params(m.encoder).name
        mp = Path(path + ".data.1", "manifest.json")
        man = json.loads(mp.read_text())
        man["subcollections"][sub]["W"]["shape"] = [5, 3]
        mp.write_text(json.dumps(man))
        with pytest.raises(xser.CheckpointError) as info:
            average(path, tmp_path / "avg.yaml")
        assert str(info.value) == (
            f"{path}.data.1: {sub}: param 'W' is (3, 5) float32 in {path}.data, (5, 3) float32 in {path}.data.1"
        )

    def test_missing_subcollection(self, tmp_path):
        """A subcollection missing in one checkpoint is named with both checkpoints."""
        path, m = run_of(tmp_path, [1.0, 2.0])
        sub = xser.params(m.decoder).name
        mp = Path(path + ".data.1", "manifest.json")
        man = json.loads(mp.read_text())
        del man["subcollections"][sub]
        mp.write_text(json.dumps(man))
        with pytest.raises(xser.CheckpointError, match=f"subcollection {sub} is in {path}.data but not in {path}.data.1"):
            average(path, tmp_path / "avg.yaml")


def test_progress_reports_every_byte(tmp_path):
    """progress(total) is called once; its update(n) calls add up to the total bytes averaged."""
    path, _ = run_of(tmp_path, [1.0, 2.0, 3.0])
    calls = []

    def start(total):
        calls.append(("total", total))
        return lambda n: calls.append(("read", n))

    average(path, tmp_path / "avg.yaml", progress=start)
    totals = [v for k, v in calls if k == "total"]
    assert len(totals) == 1 and sum(v for k, v in calls if k == "read") == totals[0] == 3 * (15 + 3 + 3) * 4


class TestOneCheckpointEach:
    def test_best_ignores_nan_like_retention(self, tmp_path):
        """--best and KeepBest rank with one function: a NaN score is never among the best."""
        from xser.checkpoints.policy import KeepBest

        path, _ = run_of(tmp_path, [1.0, 2.0, 3.0, 4.0], metrics=[5.0, float("nan"), 9.0, 7.0])
        chosen = select(path, best=2, metric="bleu")
        assert [c.step for c in chosen] == [4, 3]
        ckpts = xser.checkpoints(path)
        assert {ckpts[i].step for i in KeepBest(2, "bleu").keep(ckpts)} == {4, 3}
        with pytest.raises(xser.CheckpointError, match="no checkpoint records metric 'bleu' as a number"):
            select(run_of(tmp_path / "n", [1.0], metrics=[float("nan")])[0], best=1, metric="bleu")

    @pytest.mark.parametrize("fmt", ["dense-text", "sparse-text", "dynet-text", "colid-value-binary"])
    def test_every_format(self, tmp_path, fmt):
        """Checkpoints stored in any weight format are averaged (through the format's streaming reader)."""
        path = str(tmp_path / "m.yaml")
        lin = Linear(5, 3)
        rng = np.random.default_rng(3)
        values = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(3)]
        with xser.CheckpointSaver(path, keep=5, formats={"*/W": fmt}) as saver:
            for i, v in enumerate(values):
                lin.W[...] = v
                saver.save(lin, step=i + 1)
        average(path, tmp_path / "avg.yaml", memory_budget=64)  # tiny chunks: rows are cut across pieces
        expected = np.mean(np.stack(values).astype(np.float64), axis=0).astype(np.float32)
        assert bit_equal(xser.load(tmp_path / "avg.yaml").W, expected)

    def test_output_records_steps_and_ids(self, tmp_path):
        """The output says which checkpoints (step and id) it averaged; the ids are distinct."""
        path, _ = run_of(tmp_path, [1.0, 2.0, 3.0, 4.0])
        average(path, tmp_path / "avg.yaml", last=3)
        (out,) = xser.checkpoints(tmp_path / "avg.yaml")
        rec = out.training["averaged_from"]
        ids = {c.step: c.id for c in xser.checkpoints(path)}
        assert [(r["step"], r["id"], r["checkpoint"]) for r in rec] == [
            (4, ids[4], "m.yaml.data"), (3, ids[3], "m.yaml.data.1"), (2, ids[2], "m.yaml.data.2")
        ]

    def test_copies_of_one_checkpoint_count_once(self, tmp_path):
        """A directory copied by hand carries the same id: it is the same checkpoint, listed once."""
        path, _ = run_of(tmp_path, [1.0, 3.0])
        shutil.copytree(path + ".data", path + ".data.5")
        assert [c.step for c in xser.checkpoints(path)] == [2, 1]
        average(path, tmp_path / "avg.yaml")
        assert np.all(xser.load(tmp_path / "avg.yaml").encoder.W == 2.0)


class TestIdenticalBits:
    def test_signalling_nan_payloads_and_float32_extremes(self, tmp_path):
        """Identical checkpoints average to the identical bits: NaN payloads (signalling ones too) and -FLT_MAX
        with a float32 accumulator (whose sum would overflow to -inf)."""
        path = str(tmp_path / "m.yaml")
        x = np.array([np.finfo(np.float32).min, np.finfo(np.float32).max, 1.0, -0.0], np.float32)
        nans = np.array([0x7F800001, 0xFFA00005, 0x7FC0BEEF, 0x3F800000], np.uint32).view(np.float32)  # sNaN, -sNaN, qNaN payload, 1.0
        leaf = leaf_of({"x": x, "nans": nans})
        with xser.CheckpointSaver(path, keep=5) as saver:
            for step in range(3):
                saver.save(leaf, step=step)  # same arrays, new steps: three checkpoints, hard-linked
        for acc in ("float64", "float32"):
            average(path, tmp_path / f"{acc}.yaml", accumulate=acc)
            (sub,) = xser.read_params(tmp_path / f"{acc}.yaml").values()
            assert sub["x"].view(np.uint32).tolist() == x.view(np.uint32).tolist()
            assert sub["nans"].view(np.uint32).tolist() == nans.view(np.uint32).tolist()


class TestToolsVerify:
    def corrupt(self, path, name, param="W"):
        f = Path(path) / name / f"{param}.npy"
        data = bytearray(f.read_bytes())
        os.unlink(f)  # hard links: replace the file, never write into it
        data[-1] ^= 1
        f.write_bytes(bytes(data))
        return f

    def test_avg_refuses_a_corrupt_input(self, tmp_path):
        """A flipped bit in an averaged checkpoint is a checksum error; nothing is written."""
        path, m = run_of(tmp_path, [1.0, 2.0])
        self.corrupt(path + ".data.1", xser.params(m.encoder).name)
        with pytest.raises(xser.DataError, match="checksum mismatch"):
            average(path, tmp_path / "avg.yaml")
        assert not os.path.exists(tmp_path / "avg.yaml")
        average(path, tmp_path / "avg.yaml", verify=False)  # asked for: no check

    def test_convert_and_ensemble_refuse_a_corrupt_input(self, tmp_path):
        """Linking is no excuse: convert and ensemble check the files they link."""
        from xser.tools.convert import convert
        from xser.tools.ensemble import ensemble

        path, m = run_of(tmp_path, [1.0])
        self.corrupt(path + ".data", xser.params(m.decoder).name, "running_mean")
        with pytest.raises(xser.DataError, match="checksum mismatch"):
            convert(path, tmp_path / "c.yaml")
        with pytest.raises(xser.DataError, match="checksum mismatch"):
            ensemble([path], tmp_path / "e.yaml")
        assert not os.path.exists(tmp_path / "c.yaml") and not os.path.exists(tmp_path / "e.yaml")


class TestSavedByRanks:
    def test_tables_of_several_runs_are_merged_by_id(self, tmp_path, monkeypatch):
        """A checkpoint saved by 3 ranks holds its table as 3 runs, each sorted only within itself; the average of two
        such checkpoints (read in 2-row bands, so the merge streams) holds every id once, in order, each row the mean
        of its rows; it is one run (no ranks' slices in its manifest) and loads at another world size."""
        import xser.tools.average_tables as at
        from reshard_model import ALL_IDS, save, t_rows, w_rows
        from threaded import run

        monkeypatch.setattr(at, "BAND_ROWS", 2)
        path = save(str(tmp_path / "m.yaml"), 3, steps=2, blocks={"*/emb@*": 5})
        average(path, tmp_path / "avg.yaml", durable=False)
        (sub, got), = xser.read_params(tmp_path / "avg.yaml").items()
        ids = np.sort(ALL_IDS)
        assert got["emb@id"].tolist() == ids.tolist()
        mean = lambda a, b: ((a.astype(np.float64) + b.astype(np.float64)) / 2).astype(np.float32)  # noqa: E731
        assert np.array_equal(got["emb@embedding"], mean(t_rows(1, ids), t_rows(2, ids)))
        assert np.array_equal(got["emb@m"], mean(-t_rows(1, ids), -t_rows(2, ids)))
        assert np.array_equal(got["W"], mean(w_rows(1, 0, 23), w_rows(2, 0, 23)))
        with open(tmp_path / "avg.yaml.data" / "manifest.json") as f:
            assert "attrs" not in json.load(f)["subcollections"][sub]["emb@id"]
        halves = run(2, lambda c: xser.load(tmp_path / "avg.yaml", coordinator=c).emb.ids.tolist())
        assert halves == [[i for i in ids.tolist() if (i % 2**64) % 12 < 6], [i for i in ids.tolist() if (i % 2**64) % 12 >= 6]]


_SMALL_DTYPES = ["<f4", "<f2", "<f8", "<c8", "bfloat16", "<i4"]


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], phases=[Phase.generate])
@given(seed=st.integers(0, 2**32 - 1), weighted=st.booleans())
def test_many_small_arrays_average_like_one_at_a_time(tmp_path_factory, monkeypatch, seed, weighted):
    """A model of many small arrays (packed by the save) averages into packed containers, batch by batch, to the same
    bits as each array averaged alone by the chunk loop: mixed dtypes, -0.0, inf, NaN payloads (a signalling NaN kept
    only in an array every checkpoint holds bit for bit, even when its neighbours in the batch differ), empty arrays,
    integers copied from the newest checkpoint."""
    import xser.tools.average as avg

    tmp = tmp_path_factory.mktemp("many")
    rng = np.random.default_rng(seed)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3.5], np.float64)
    names = {f"p{i}": (_SMALL_DTYPES[int(rng.integers(len(_SMALL_DTYPES)))], (int(rng.integers(0, 7)),)) for i in range(100)}
    frozen = {k for k in names if rng.random() < 0.3}  # the same bits in every checkpoint

    def values(step):
        out = {}
        for k, (descr, shape) in names.items():
            dt = np.dtype(descr) if descr != "bfloat16" else xser.storage.dtypes.ml_dtype("bfloat16")
            r = np.random.default_rng((seed, 0 if k in frozen else step, int(k[1:])))
            if dt.kind == "i":
                out[k] = r.integers(-9, 9, shape).astype(dt)
                continue
            a = np.where(r.random(shape) < 0.3, r.choice(specials, shape), r.standard_normal(shape)).astype(dt)
            if a.size and dt == np.float32 and k in frozen:
                a.view(np.uint32)[0] = 0x7F800001  # a signalling NaN: any arithmetic would quiet it
            out[k] = a
        return out

    path = str(tmp / "m.yaml")
    leaf = leaf_of(values(0))
    with xser.CheckpointSaver(path, keep=3) as saver:
        for step in range(3):
            for k, a in values(step).items():
                xser.params(leaf)[k] = a
            saver.save(leaf, step=step)
    ws = [0.5, 2.0, 1.25] if weighted else None
    average(path, tmp / "new.yaml", weights=ws)
    with monkeypatch.context() as mp:
        mp.setattr(avg, "small_enough", lambda *a: False)  # every array alone, through the chunk loop,
        mp.setattr(avg, "copied_small", lambda *a: None)  # integers linked with their container
        average(path, tmp / "old.yaml", weights=ws)
    new, old = xser.read_params(tmp / "new.yaml"), xser.read_params(tmp / "old.yaml")
    for sub in old:
        assert sorted(new[sub]) == sorted(old[sub])
        for k in old[sub]:
            assert bit_equal(new[sub][k], old[sub][k]), k
    assert any(f.endswith(".safetensors") for f in os.listdir(tmp / "new.yaml.data"))  # packed as a save packs
    assert not any(f.endswith(".safetensors") for f in os.listdir(tmp / "old.yaml.data"))


def test_a_read_error_in_a_packed_input_names_that_input(tmp_path, monkeypatch):
    """An I/O error while the batched average reads a packed input container is a DataError at that container and
    tensor, not a write error at the output it was computing."""
    from xser.storage import fsutil

    arrays = {f"w{i}": np.full((2,), 7.0, np.float32) for i in range(80)}
    leaf = leaf_of(arrays)
    path = str(tmp_path / "m.yaml")
    with xser.CheckpointSaver(path, keep=3, durable=False) as s:
        for step in (1, 2):
            for a in arrays.values():
                a += 1
            s.save(leaf, step=step)
    inputs = sorted(str(p) for p in tmp_path.glob("m.yaml.data*/model-000000-of-000001.safetensors"))
    assert len(inputs) == 2

    def preadv(*a):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(fsutil.os, "preadv", preadv)
    with pytest.raises(xser.DataError) as info:
        average(path, str(tmp_path / "avg.yaml"), last=2, durable=False, verify=False)
    sub = xser.params(leaf).name
    assert str(info.value) in [f"{c}: cannot read tensor '{sub}/w0': Input/output error" for c in inputs]


def _reference_mean(xs: list[np.ndarray], ws: list[float], dtype: np.dtype) -> np.ndarray:
    """The weighted mean of each element alone, in Python scalars of the accumulator's precision, in checkpoint order
    (newest first): what the average computes for an element the checkpoints do not all hold bit for bit."""
    from xser.storage.dtypes import round_into, tag_of

    real = np.dtype(dtype.char.lower()) if dtype.kind == "c" else dtype
    acc_t = np.longdouble if real == np.float64 and np.finfo(np.longdouble).nmant > 52 else np.float64
    parts = [x.view(np.dtype(dtype.byteorder + "f" + str(dtype.itemsize // 2))) if dtype.kind == "c" else x for x in xs]
    acc = np.empty(parts[0].size, acc_t)
    total = acc_t(sum(ws))
    with np.errstate(all="ignore"):
        for j in range(acc.size):
            s = acc_t(parts[0][j]) * acc_t(ws[0])
            for p, w in zip(parts[1:], ws[1:]):
                s = s + acc_t(p[j]) * acc_t(w)
            acc[j] = s / total
    out = np.empty(xs[0].shape, dtype)
    outr = out.view(parts[0].dtype) if dtype.kind == "c" else out
    if tag_of(dtype) is not None:
        round_into(outr, acc)
    else:
        np.copyto(outr, acc, casting="unsafe")
    return out


_NAN_DTYPES = ["<f2", "<f4", "<f8", "<c8", "bfloat16"]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], phases=[Phase.generate])
@given(seed=st.integers(0, 2**32 - 1), descr=st.sampled_from(_NAN_DTYPES), weighted=st.booleans())
def test_every_element_averages_alone_whatever_the_layout(tmp_path_factory, monkeypatch, seed, descr, weighted):
    """Each element of an average depends on that element of each checkpoint only, never on its neighbours, its place
    in a SIMD loop, the batch or the chunk: an element every checkpoint holds bit for bit is those bits (a signalling
    NaN, a NaN payload, -0.0, a float64 that weights would round); any other element that averages to NaN is numpy's
    NaN (an addition of two NaNs gives the sign and payload of whichever operand the CPU loop puts first, which numpy
    chooses by position); the rest is the weighted mean. The same bits batched, one array at a time and chunk by
    chunk."""
    import xser.tools.average as avg

    tmp = tmp_path_factory.mktemp("alone")
    rng = np.random.default_rng(seed)
    dt = np.dtype(descr) if descr != "bfloat16" else xser.storage.dtypes.ml_dtype("bfloat16")
    real = np.dtype(dt.char.lower()) if dt.kind == "c" else dt
    k = real.itemsize
    u = np.dtype(f"<u{k}")
    nan_bits = {2: [0x7E00, 0xFE00, 0x7C01, 0x7E5A], 4: [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC0BEEF],
                8: [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x7FF80000DEADBEEF]}[k]
    if descr == "bfloat16":
        nan_bits = [0x7FC0, 0xFFC0, 0x7F81, 0x7FDA]
    # weights of 0, 1e-300 and 1e300 too: inf * 0 is NaN, and a subnormal float32 times 1e-300 is not a normal float64
    weights = [float(w) for w in rng.choice([0.0, 1e-300, 0.1, 0.7, 1.0, 2.5, 3.0, 1e300], 3)] if weighted else [1.0, 1.0, 1.0]
    if not sum(weights):
        weights[0] = 0.7
    sizes = [int(n) for n in rng.integers(0, 41, 70)]

    inf = int(np.array(np.inf, np.float32).astype(dt).view(u)) if descr == "bfloat16" else int(np.array(np.inf, real).view(u))

    def element(kind: int, r) -> list:
        """One element's value (real-part bits) in each of the 3 checkpoints."""
        one = lambda: int(np.array(r.standard_normal() * 10.0 ** int(r.integers(-3, 4)), real).view(u)) if descr != "bfloat16" \
            else int(np.array(r.standard_normal(), np.float32).astype(dt).view(u))
        if kind == 0:  # held bit for bit by every checkpoint
            b = int(r.choice(nan_bits + [one(), one(), 1 << (8 * k - 1), 1, inf]))  # 1: the smallest subnormal
            return [b, b, b]
        if kind == 1:  # NaNs that differ
            return [int(r.choice(nan_bits)) for _ in range(3)]
        if kind == 2:  # a NaN among numbers, or inf and -inf
            pick = r.integers(3)
            return [int(r.choice(nan_bits)) if i == pick else one() for i in range(3)] if r.random() < 0.5 \
                else [inf, inf | (1 << (8 * k - 1)), one()]
        return [one(), one(), one()]

    values = [{}, {}, {}]  # newest checkpoint first
    for i, n in enumerate(sizes):
        r = np.random.default_rng((seed, i))
        cells = [element(int(r.integers(4)), r) for _ in range(n * (2 if dt.kind == "c" else 1))]
        for c in range(3):
            bits = np.array([cell[c] for cell in cells], u)
            values[c][f"p{i}"] = bits.view(dt) if dt.kind != "c" else bits.view(real).view(dt)
    path = str(tmp / "m.yaml")
    leaf = leaf_of(values[2])
    with xser.CheckpointSaver(path, keep=3) as saver:
        for step in range(3):
            for name, a in values[2 - step].items():
                xser.params(leaf)[name] = a
            saver.save(leaf, step=step)
    average(path, tmp / "batched.yaml", weights=weights)
    with monkeypatch.context() as mp:
        mp.setattr(avg, "small_enough", lambda *a: False)
        average(path, tmp / "alone.yaml", weights=weights)
        average(path, tmp / "chunks.yaml", weights=weights, memory_budget=1)
    outs = [next(iter(xser.read_params(tmp / f"{n}.yaml").values())) for n in ("batched", "alone", "chunks")]
    canonical = np.array(np.nan, np.float32).astype(dt).view(u) if descr == "bfloat16" else np.array(np.nan, real).view(u)
    for i in range(len(sizes)):
        name = f"p{i}"
        xs = [values[c][name] for c in range(3)]
        bits = [x.view(u) if dt.kind != "c" else x.view(real).view(u) for x in xs]
        held = (bits[0] == bits[1]) & (bits[0] == bits[2])
        expected = _reference_mean(xs, weights, dt)
        eb = expected.view(u) if dt.kind != "c" else expected.view(real).view(u)
        eb = eb.copy()
        is_nan = np.isnan(expected.astype(np.float32) if descr == "bfloat16" else expected.view(real) if dt.kind == "c" else expected)
        eb[is_nan] = canonical
        eb[held] = bits[0][held]
        for o in outs:
            got = o[name]
            gb = got.view(u) if dt.kind != "c" else got.view(real).view(u)
            assert got.dtype == dt and got.shape == xs[0].shape, name
            assert gb.tolist() == eb.tolist(), (name, [hex(b) for b in gb], [hex(b) for b in eb])


def test_long_double_padding_is_neither_compared_nor_written(tmp_path):
    """A long double (x87: 10 bytes of value in 12 or 16) is compared by its value bytes, so checkpoints holding the
    same values with different padding give those values back, and the average's padding is zero whatever the memory
    held: the same bytes (and checksum) at any memory budget."""
    ld = np.dtype(np.longdouble)
    if np.finfo(ld).nmant != 63:
        pytest.skip("long double is not x87 extended precision here")
    rng = np.random.default_rng(3)
    vals = rng.standard_normal(1000).astype(ld)
    vals[::7] = np.nan
    path = str(tmp_path / "m.yaml")
    leaf = leaf_of({"x": vals.copy(), "c": vals.astype(np.clongdouble)})
    with xser.CheckpointSaver(path, keep=3) as saver:
        for step in range(3):
            for name in ("x", "c"):
                a = xser.params(leaf)[name]
                b = a.reshape(-1).view(np.uint8).reshape(-1, ld.itemsize)
                b[:, 10:] = rng.integers(0, 256, b[:, 10:].shape, dtype=np.uint8)  # other padding, same values
            saver.save(leaf, step=step)
    for budget, out in ((None, "a"), (1, "b"), (1 << 20, "c")):
        kw = {} if budget is None else {"memory_budget": budget}
        average(path, tmp_path / f"{out}.yaml", weights=[0.1, 0.2, 0.7], **kw)
    got = [next(iter(xser.read_params(tmp_path / f"{o}.yaml").values())) for o in "abc"]
    for name in ("x", "c"):
        raw = [g[name].reshape(-1).view(np.uint8).reshape(-1, ld.itemsize) for g in got]
        want = vals if name == "x" else vals.astype(np.clongdouble)
        w = want.reshape(-1).view(np.uint8).reshape(-1, ld.itemsize)
        for r in raw:
            assert r[:, :10].tobytes() == w[:, :10].tobytes(), name  # held: the values exactly, NaNs included
            assert not r[:, 10:].any(), name
        assert raw[0].tobytes() == raw[1].tobytes() == raw[2].tobytes()
