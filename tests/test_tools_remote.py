"""The tools (avg, convert, ensemble, inspect, CheckpointReader, trajectory) on object stores, mixing local and remote
paths freely: every result is compared bit for bit with the same operation done on a local disk (memory:// and S3 on
moto)."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

pytest.importorskip("fsspec")

import xser  # noqa: E402
from components import Linear, Model, Norm  # noqa: E402
from xser.errors import CheckpointError, DataError  # noqa: E402
from xser.storage.stores import store_for  # noqa: E402
from xser.storage.stores.remote import FsspecStore  # noqa: E402
from xser.tools.average import average  # noqa: E402
from xser.tools.convert import convert, convert_all  # noqa: E402
from xser.tools.ensemble import ensemble  # noqa: E402
from xser.tools.inspect import foreign_kind, not_a_model_directory, open_model, tensor_lines, verify_model  # noqa: E402
from xser.tools.reader import CheckpointReader  # noqa: E402
from xser.tools.trajectory import plot, trajectory  # noqa: E402


@pytest.fixture
def remote(remote_root):
    return remote_root


def twin_runs(local, url, options, n=4, shape=(40, 30), seed=0):
    """One model checkpointed ``n`` times, to a local path and to a URL alike (same names, same bytes)."""
    rng = np.random.default_rng(seed)
    m = Model(encoder=Linear(shape[1], shape[0]), decoder=Norm(shape[0]))
    with xser.CheckpointSaver(local, keep=10) as a, xser.CheckpointSaver(url, keep=10, storage_options=options) as b:
        for i in range(n):
            m.encoder.W[...] = rng.standard_normal(shape).astype(np.float32)
            m.encoder.b[...] = rng.standard_normal(shape[0]).astype(np.float32)
            m.decoder.count[...] = i + 1
            for saver in (a, b):
                saver.save(m, step=i + 1, metrics={"bleu": float(i % 3)})
    return m


def tensors(path, options=None, checkpoint=None):
    """Every tensor of a saved model by name (through CheckpointReader), in memory."""
    with CheckpointReader(path, checkpoint, storage_options=options if path.startswith(("memory:", "s3:")) else None) as r:
        return {n: r.read_tensor(n) for n in r.tensor_names()}


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(x.dtype == b[k].dtype and x.shape == b[k].shape and x.tobytes() == b[k].tobytes()
                                        for k, x in a.items())


def opts(path, options):
    return options if "://" in path else None


class TestAverage:
    @pytest.mark.parametrize("where", ["remote->local", "local->remote", "remote->remote"])
    def test_bit_exact_with_the_local_average(self, remote, tmp_path, where):
        local, url = str(tmp_path / "m.yaml"), remote.url("run/m.yaml")
        twin_runs(local, url, remote.options)
        average(local, tmp_path / "avg.yaml", last=3, weights=[0.5, 0.25, 3.0])
        src = url if where.startswith("remote") else local
        out = remote.url("avg.yaml") if where.endswith("remote") else str(tmp_path / "out.yaml")
        report = average(src, out, last=3, weights=[0.5, 0.25, 3.0], storage_options=remote.options)
        assert report.out == out and len(report.checkpoints) == 3
        assert same_bits(tensors(out, remote.options), tensors(str(tmp_path / "avg.yaml")))
        loaded = xser.load(out, storage_options=opts(out, remote.options))
        assert np.array_equal(loaded.encoder.W, xser.load(tmp_path / "avg.yaml").encoder.W)

    def test_reads_in_chunks_never_whole_files(self, remote, tmp_path, monkeypatch):
        """The remote checkpoints are read in ranged pieces of at most the chunk the memory budget allows, as a local
        average reads them: no array file is downloaded whole into memory."""
        url = remote.url("m.yaml")
        twin_runs(str(tmp_path / "m.yaml"), url, remote.options, n=3, shape=(200, 100))
        sizes = []
        fs = store_for(url, remote.options).fs
        real = fs.cat_file

        def cat_file(path, start=None, end=None, **kw):  # every GET, with the bytes it brought
            data = real(path, start=start, end=end, **kw)
            if path.endswith("/W.npy"):
                sizes.append(len(data))
            return data

        monkeypatch.setattr(fs, "cat_file", cat_file)
        average(url, tmp_path / "avg.yaml", memory_budget=1 << 16, storage_options=remote.options)
        file_size = 200 * 100 * 4
        assert sizes and max(sizes) <= 1 << 16 and sum(sizes) >= 3 * file_size
        assert len(sizes) > 3 * 4

    def test_fortran_order_arrays(self, remote, tmp_path):
        """A Fortran-order .npy object (read in C-order row bands out of a map locally) averages as it does locally."""
        local, url = str(tmp_path / "m.yaml"), remote.url("m.yaml")
        lin = Linear(30, 20)
        with xser.CheckpointSaver(local, keep=3) as a, xser.CheckpointSaver(url, keep=3, storage_options=remote.options) as b:
            for i in range(2):
                lin.W = np.asfortranarray(np.random.default_rng(i).standard_normal((20, 30)).astype(np.float32))
                a.save(lin)
                b.save(lin)
        average(local, tmp_path / "want.yaml")
        average(url, tmp_path / "got.yaml", storage_options=remote.options)
        assert same_bits(tensors(str(tmp_path / "got.yaml")), tensors(str(tmp_path / "want.yaml")))
        assert trajectory(url, storage_options=remote.options)["checkpoints"][1]["distance_to_newest"] == \
            trajectory(local)["checkpoints"][1]["distance_to_newest"]

    def test_the_output_is_the_input(self, remote):
        url = remote.url("m.yaml")
        with pytest.raises(CheckpointError) as e:
            average(url, url + "/", storage_options=remote.options)
        assert e.value.message == "the output is the input model; choose another --out"

    def test_remote_spec_that_is_no_saved_model(self, remote):
        url = remote.url("config.yaml")
        store_for(url, remote.options).put(url, b"experiment: !TLinear {}\n")
        with pytest.raises(CheckpointError) as e:
            average(url, remote.url("avg.yaml"), storage_options=remote.options)
        assert e.value.message == "not a saved xser model (no xser_format key)"


def _array_objects(ops):
    return [(op, url) for op, url in ops if url.endswith(".npy")]


class TestConvert:
    def test_server_side_copy_on_one_store(self, remote, monkeypatch):
        """A remote checkpoint converted onto the same store: every array object is copied on the server (one "copy"
        request each) and none is read by this process, verify included."""
        url = remote.url("m.yaml")
        lin = Model(encoder=Linear(5, 3), decoder=Norm(3))
        xser.save(lin, url, storage_options=remote.options)
        ops = []
        monkeypatch.setattr(FsspecStore, "on_request", staticmethod(lambda op, u: ops.append((op, u))))
        report = convert(url, remote.url("c.yaml"), storage_options=remote.options, verify=True)
        monkeypatch.setattr(FsspecStore, "on_request", None)
        arrays = _array_objects(ops)
        assert sorted(op for op, _ in arrays) == ["copy"] * 4
        assert not [u for op, u in ops if op in ("read", "write") and u.endswith(".npy")]
        back = tensors(remote.url("c.yaml"), remote.options)
        src = tensors(url, remote.options)
        assert same_bits(back, {f"{report.renamed[k.split('/')[0]]}/{k.split('/')[1]}": v for k, v in src.items()})

    @pytest.mark.parametrize("where", ["remote->local", "local->remote"])
    def test_across_stores(self, remote, tmp_path, where):
        local, url = str(tmp_path / "m.yaml"), remote.url("m.yaml")
        twin_runs(local, url, remote.options, n=2)
        src, out = (url, str(tmp_path / "c.yaml")) if where == "remote->local" else (local, remote.url("c.yaml"))
        report = convert(src, out, checkpoint=1, storage_options=remote.options)
        got = tensors(out, remote.options)
        want = tensors(local, checkpoint=1)
        assert same_bits(got, {f"{report.renamed[k.split('/')[0]]}/{k.split('/')[1]}": v for k, v in want.items()})

    def test_a_corrupt_object_copied_through_this_process_is_refused(self, remote, tmp_path):
        """Remote -> local copies through this process: the checksum is checked as the object streams."""
        url = remote.url("m.yaml")
        xser.save(Model(encoder=Linear(5, 3), decoder=Norm(3)), url, storage_options=remote.options)
        (ck,) = xser.checkpoints(url, storage_options=remote.options)
        store = store_for(url, remote.options)
        w = next(k for k in store.list(ck.path) if k.endswith("/W.npy"))
        raw = bytearray(store.read_bytes(w, "W"))
        raw[-1] ^= 1
        store.delete([w])
        store.put(w, bytes(raw))
        with pytest.raises(DataError) as e:
            convert(url, tmp_path / "c.yaml", storage_options=remote.options)
        assert e.value.message.startswith("checksum mismatch: xxh3_64 ") and e.value.location.file == w
        assert not os.path.exists(tmp_path / "c.yaml.data")
        convert(url, tmp_path / "c.yaml", storage_options=remote.options, verify=False)  # asked not to check: copied

    def test_convert_all_to_another_store(self, remote, tmp_path):
        local, url = str(tmp_path / "m.yaml"), remote.url("m.yaml")
        twin_runs(local, url, remote.options, n=3)
        reports = convert_all(url, tmp_path / "all.yaml", storage_options=remote.options)
        assert [r.out for r in reports] == [str(tmp_path / f"all.{k}.yaml") for k in range(3)]
        for k, r in enumerate(reports):
            want = tensors(local, checkpoint=k)
            assert same_bits(tensors(r.out), {f"{r.renamed[n.split('/')[0]]}/{n.split('/')[1]}": v for n, v in want.items()})


class TestEnsemble:
    @pytest.mark.parametrize("out_remote", [False, True])
    def test_members_local_and_remote(self, remote, tmp_path, out_remote):
        a, b = str(tmp_path / "a.yaml"), remote.url("b.yaml")
        ma, mb = Linear(4, 2), Linear(4, 2)
        ma.W[...] = 1.0
        mb.W[...] = 2.0
        xser.save(ma, a)
        xser.save(mb, b, storage_options=remote.options)
        out = remote.url("ens.yaml") if out_remote else str(tmp_path / "ens.yaml")
        r = ensemble([a, b], out, storage_options=remote.options)
        assert r.members == (a, b)
        ens = xser.load(out, storage_options=opts(out, remote.options))
        assert [float(x.W[0, 0]) for x in ens.members] == [1.0, 2.0]
        (ck,) = xser.checkpoints(out, storage_options=opts(out, remote.options))
        assert ck.training["ensemble_of"] == [a, b]


class TestInspect:
    def test_remote_layout_in_lines_and_json(self, remote):
        url = remote.url("run/m.yaml")
        lin = Linear(3, 2)
        with xser.CheckpointSaver(url, keep=2, storage_options=remote.options) as s:
            for i in range(3):
                s.save(lin, step=i)
        view = open_model(url, storage_options=remote.options)
        try:
            lines, js = view.lines(), view.as_json()
        finally:
            view.data.close()
        cks = xser.checkpoints(url, storage_options=remote.options)
        scheme = remote.kind
        record = f"{url}.data/commits/00000000000000000003.json"
        assert js["remote"] == {"store": scheme, "commit": 3, "record": record, "checkpoints": [c.path + "/" for c in cks]}
        assert [c.path.rsplit("/", 1)[1][:20] for c in cks] == ["00000000000000000003", "00000000000000000002"]
        i = lines.index(f"  commit record 3 ({record})")
        assert lines[i - 1] == (f"  store: {scheme}:// (an object store: each checkpoint under its own prefix, published by a "
                                "commit record)")
        assert lines[i + 1 : i + 4] == ["  checkpoint prefixes (newest first):", f"    0  {cks[0].path}/", f"    1  {cks[1].path}/"]

    def test_local_json_has_no_remote_key(self, tmp_path):
        xser.save(Linear(3, 2), tmp_path / "m.yaml")
        view = open_model(tmp_path / "m.yaml")
        try:
            assert "remote" not in view.as_json() and not any("commit record" in x for x in view.lines())
        finally:
            view.data.close()

    def test_verify_and_tensor_lines(self, remote, tmp_path):
        local, url = str(tmp_path / "m.yaml"), remote.url("m.yaml")
        twin_runs(local, url, remote.options, n=2)
        lines = verify_model(url, storage_options=remote.options)
        assert len(lines) == 2 and all("5 files match their checksums; spec and data belong together" in x for x in lines)
        got = tensor_lines(url, storage_options=remote.options)
        assert got[0] == f"xser model {url}: 4 tensors" and got[1:] == tensor_lines(local)[1:]

    def test_a_corrupt_remote_object_fails_verify(self, remote):
        url = remote.url("m.yaml")
        xser.save(Linear(3, 2), url, storage_options=remote.options)
        (ck,) = xser.checkpoints(url, storage_options=remote.options)
        store = store_for(url, remote.options)
        w = next(k for k in store.list(ck.path) if k.endswith("/W.npy"))
        raw = bytearray(store.read_bytes(w, "W"))
        raw[-1] ^= 1
        store.delete([w])
        store.put(w, bytes(raw))
        with pytest.raises(DataError) as e:
            verify_model(url, storage_options=remote.options)
        assert e.value.message.startswith("checksum mismatch") and e.value.location.file == w

    def test_directories_given_for_a_model(self, remote):
        url = remote.url("d/m.yaml")
        lin = Linear(3, 2)
        with xser.CheckpointSaver(url, keep=3, storage_options=remote.options) as s:
            for i in range(2):
                s.save(lin, step=i)
        cks = xser.checkpoints(url, storage_options=remote.options)
        cases = {
            remote.url("d"): f"a directory that holds a saved model, not a model; give its model file instead: {url}",
            url + ".data": f"the data prefix of the model {url}; give the model's file instead: {url}",
            url + ".data/": f"the data prefix of the model {url}; give the model's file instead: {url}",
            cks[1].path + "/": f"a checkpoint prefix of the model {url}; give the model's file instead: {url} with --checkpoint 1",
            cks[0].path: f"a checkpoint prefix of the model {url}; give the model's file instead: {url}",
        }
        for given, message in cases.items():
            with pytest.raises(CheckpointError) as e:
                not_a_model_directory(given, storage_options=remote.options)
            assert (e.value.message, e.value.location.file) == (message, given)
        not_a_model_directory(url, storage_options=remote.options)  # the model's file passes
        not_a_model_directory(remote.url("nothing-here"), storage_options=remote.options)

    def test_foreign_models_on_a_store(self, remote, tmp_path):
        lin = Linear(3, 2)
        lin.W[...] = np.arange(6, dtype=np.float32).reshape(2, 3)
        xser.save(lin, tmp_path / "m.yaml")
        from xser.interop.safetensors import export_safetensors

        export_safetensors(tmp_path / "m.yaml", tmp_path / "hf")
        store = store_for(remote.url("x"), remote.options)
        with open(tmp_path / "hf" / "model.safetensors", "rb") as f:
            raw = f.read()
        store.put(remote.url("hf", "model.safetensors"), raw)
        assert foreign_kind(remote.url("hf"), storage_options=remote.options) == "safetensors"
        assert foreign_kind(remote.url("hf", "model.safetensors"), storage_options=remote.options) == "safetensors"
        assert foreign_kind(remote.url("m.yaml"), storage_options=remote.options) is None
        for given in (remote.url("hf"), remote.url("hf", "model.safetensors")):
            with CheckpointReader(given, storage_options=remote.options) as r:
                assert r.kind == "safetensors"
                assert np.array_equal(r.read_tensor("W"), lin.W) and np.array_equal(r.read_tensor("W", rows=(1, 2)), lin.W[1:2])


class TestReader:
    def test_reads_after_the_call_with_its_store(self, remote, tmp_path):
        """The reader keeps the store it opened (with its storage_options): reads later, outside any option context,
        still reach S3."""
        local, url = str(tmp_path / "m.yaml"), remote.url("m.yaml")
        twin_runs(local, url, remote.options, n=2)
        with CheckpointReader(url, 1, storage_options=remote.options) as r, CheckpointReader(local, 1) as lr:
            assert r.tensor_names() == lr.tensor_names() and r.kind == "xser"
            for n in r.tensor_names():
                assert r.read_tensor(n).tobytes() == lr.read_tensor(n).tobytes()
            name = next(n for n in r.tensor_names() if n.endswith("/W"))
            assert r.read_tensor(name, rows=(3, 7)).tobytes() == lr.read_tensor(name)[3:7].tobytes()


class TestTrajectory:
    def test_same_report_as_local(self, remote, tmp_path):
        local, url = str(tmp_path / "m.yaml"), remote.url("m.yaml")
        twin_runs(local, url, remote.options, n=3)
        got, want = trajectory(url, storage_options=remote.options), trajectory(local)
        assert got["model"] == url and got["metrics"] == want["metrics"] == ["bleu"]
        strip = lambda r: [{k: v for k, v in c.items() if k not in ("directory", "created")} for c in r["checkpoints"]]  # noqa: E731
        assert strip(got) == strip(want)
        assert [c["directory"] for c in got["checkpoints"]] == [c.path.rsplit("/", 1)[1]
                                                                 for c in xser.checkpoints(url, storage_options=remote.options)]

    def test_plot_to_a_url(self, remote, tmp_path):
        pytest.importorskip("matplotlib")
        local = str(tmp_path / "m.yaml")
        twin_runs(local, remote.url("unused.yaml"), remote.options, n=2)
        out = remote.url("curve.png")
        assert plot(trajectory(local), out, storage_options=remote.options) == out
        assert store_for(out, remote.options).read_bytes(out, "png")[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- the command line, in process (memory:// is per process)


def so_args(options):
    """--storage-option KEY=VALUE pairs for ``options`` (values as JSON)."""
    return [a for k, v in options.items() for a in ("--storage-option", f"{k}={json.dumps(v)}")]


class TestCli:
    def test_avg_remote_to_local_and_back(self, remote, tmp_path, capsys):
        from xser.cli import main

        local, url = str(tmp_path / "m.yaml"), remote.url("run/m.yaml")
        twin_runs(local, url, remote.options, n=5)
        average(local, tmp_path / "want.yaml", last=5)
        assert main(["avg", url, "--last", "5", "--out", str(tmp_path / "avg.yaml"), *so_args(remote.options)]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"averaged 5 checkpoints of {url}: 00000000000000000005-") and f"wrote {tmp_path / 'avg.yaml'}" in out
        assert same_bits(tensors(str(tmp_path / "avg.yaml")), tensors(str(tmp_path / "want.yaml")))
        back = remote.url("avg.yaml")
        assert main(["avg", local, "--last", "5", "--out", back, *so_args(remote.options)]) == 0
        assert same_bits(tensors(back, remote.options), tensors(str(tmp_path / "want.yaml")))

    def test_convert_ensemble_inspect(self, remote, tmp_path, capsys):
        from xser.cli import main

        url = remote.url("m.yaml")
        lin = Linear(3, 2)
        lin.W[...] = 4.0
        with xser.CheckpointSaver(url, keep=3, storage_options=remote.options) as s:
            for i in range(2):
                s.save(lin, step=i)
        so = so_args(remote.options)
        assert main(["convert", url, "--out", remote.url("c.yaml"), "--checkpoint", "1", *so]) == 0
        assert main(["convert", url, "--out", str(tmp_path / "all.yaml"), "--all", *so]) == 0
        assert main(["ensemble", remote.url("c.yaml"), str(tmp_path / "all.0.yaml"), "--out", remote.url("e.yaml"), *so]) == 0
        ens = xser.load(remote.url("e.yaml"), storage_options=remote.options)
        assert [float(m.W[0, 0]) for m in ens.members] == [4.0, 4.0]
        capsys.readouterr()
        assert main(["inspect", url, "--verify", *so]) == 0
        out = capsys.readouterr().out.splitlines()
        assert f"  commit record 2 ({url}.data/commits/00000000000000000002.json)" in out
        assert sum(x.startswith("verified checkpoint ") for x in out) == 2
        assert main(["inspect", url, "--json", *so]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["model"] == url and report["remote"]["commit"] == 2 and len(report["remote"]["checkpoints"]) == 2
        assert [c["directory"] for c in report["checkpoints"]] == [p.rstrip("/").rsplit("/", 1)[1] for p in report["remote"]["checkpoints"]]

    def test_a_remote_data_prefix_given_for_the_model(self, remote, capsys):
        from xser.cli import main

        url = remote.url("m.yaml")
        xser.save(Linear(3, 2), url, storage_options=remote.options)
        capsys.readouterr()
        assert main(["avg", url + ".data", "--out", remote.url("a.yaml"), *so_args(remote.options)]) == 1
        assert capsys.readouterr().err == (f"error: {url}.data: the data prefix of the model {url}; give the model's file "
                                           f"instead: {url}\n")


USAGE = "argument --storage-option: expected KEY=VALUE (e.g. anon=true, endpoint_url=http://localhost:5000), got "


@pytest.mark.parametrize("command", [
    ["avg", "memory://x/m.yaml", "--out", "memory://x/a.yaml"],
    ["convert", "memory://x/m.yaml", "--out", "memory://x/c.yaml"],
    ["ensemble", "memory://x/m.yaml", "--out", "memory://x/e.yaml"],
    ["inspect", "memory://x/m.yaml"],
])
@pytest.mark.parametrize("options, message", [
    (["endpoint"], USAGE + "'endpoint'"),
    (["=1"], USAGE + "'=1'"),
    ([" anon=true"], USAGE + "' anon=true'"),
    (["anon=true", "anon=false"], "--storage-option anon is given twice"),
])
def test_a_bad_storage_option_is_a_usage_error(command, options, message, capsys):
    from xser.cli import main

    with pytest.raises(SystemExit) as e:
        main(command + [a for o in options for a in ("--storage-option", o)])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"xser {command[0]}: error: {message}"


def test_an_option_the_filesystem_refuses_is_an_error_naming_the_url(s3_url, capsys):
    from xser.cli import main

    prefix, _ = s3_url
    assert main(["inspect", f"{prefix}/m.yaml", "--storage-option", "bogus=1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {prefix}/m.yaml: ") and "bogus" in err


# ---------------------------------------------------------------- PartialSaver on an object store

KILLED_WORKER = r"""
import json, os, signal, sys
import numpy as np, xser
from components import Linear
from xser.storage.stores.remote import FsspecStore
url, options = sys.argv[1], json.loads(sys.argv[2])
lin = Linear(4, 10)
full = np.arange(40, dtype=np.float32).reshape(10, 4)
ps = xser.PartialSaver(url, lin, storage_options=options)
key = f"{xser.params(lin).name}/W"
ps.write_rows(key, 0, full[0:3])
def die(op, u):
    if op == "write" and u.endswith("W@3-6.block.json"):  # the block object is uploaded, its note never is
        os.kill(os.getpid(), signal.SIGKILL)
FsspecStore.on_request = staticmethod(die)
ps.write_rows(key, 3, full[3:6])
"""


class TestPartialSaver:
    def test_blocks_workers_and_finalize(self, remote, monkeypatch):
        """Blocks are objects under the .data.partial prefix; another worker joins; finalize copies the blocks on the
        server into one committed checkpoint and removes the prefix."""
        url = remote.url("m.yaml")
        lin = Linear(4, 10)
        full = np.arange(40, dtype=np.float32).reshape(10, 4)
        key = f"{xser.params(lin).name}/W"
        ps = xser.PartialSaver(url, lin, storage_options=remote.options)
        block = ps.write_rows(key, 6, full[6:10])  # a name of its own: two workers never overwrite each other's bytes
        assert re.fullmatch(re.escape(f"{url}.data.partial/{key}@6-10.") + "[0-9a-f]{16}" + re.escape(".npy"), block)
        w = xser.PartialSaver.join(url, worker="w2", storage_options=remote.options)
        w.write_rows(key, 0, full[0:6])
        with pytest.raises(DataError) as e:
            w.write_rows(key, 5, full[5:7])
        assert e.value.message == "rows (5, 7) overlap the block (0, 6) written by w2"
        assert ps.missing() == {} and [n["worker"] for n in ps.written()[key]] == ["w2", ps.worker]
        ops = []
        monkeypatch.setattr(FsspecStore, "on_request", staticmethod(lambda op, u: ops.append((op, u))))
        ps.finalize(training={"labels": 10})
        monkeypatch.setattr(FsspecStore, "on_request", None)
        assert sorted(op for op, u in ops if "@" in u and u.endswith(".npy") and ".data.partial/" not in u) == ["copy", "copy"]
        m = xser.load(url, verify=True, storage_options=remote.options)
        assert np.array_equal(m.W, full) and np.array_equal(m.b, lin.b)
        assert xser.checkpoints(url, storage_options=remote.options)[0].training == {"labels": 10}
        assert store_for(url, remote.options).list(url + ".data.partial") == {}

    def test_a_rerun_resumes_with_new_names(self, remote):
        """The script run again builds its object afresh (new subcollection names): matched by place and class."""
        url = remote.url("m.yaml")
        full = np.arange(40, dtype=np.float32).reshape(10, 4)
        first = Linear(4, 10)
        xser.PartialSaver(url, first, storage_options=remote.options).write_rows(f"{xser.params(first).name}/W", 0, full[:4])
        again = Linear(4, 10)
        key = f"{xser.params(again).name}/W"
        ps = xser.PartialSaver(url, again, storage_options=remote.options)
        assert ps.missing() == {key: [(4, 10)]}
        with pytest.raises(DataError) as e:
            ps.finalize()
        assert e.value.message == f"cannot finalize: {key}: rows 4-9 are missing"
        ps.write_rows(key, 4, full[4:])
        ps.finalize()
        assert np.array_equal(xser.load(url, storage_options=remote.options).W, full)

    def test_resume_after_a_kill_in_process(self, remote, monkeypatch):
        """A block object uploaded without its note does not count; writing the rows again replaces it."""
        url = remote.url("m.yaml")
        lin = Linear(4, 10)
        full = np.arange(40, dtype=np.float32).reshape(10, 4)
        key = f"{xser.params(lin).name}/W"
        ps = xser.PartialSaver(url, lin, storage_options=remote.options)
        ps.write_rows(key, 0, full[:5])

        def boom(op, u):
            if op == "write" and u.endswith(".block.json"):
                raise KeyboardInterrupt

        monkeypatch.setattr(FsspecStore, "on_request", staticmethod(boom))
        with pytest.raises(KeyboardInterrupt):
            ps.write_rows(key, 5, full[5:] + 100)
        monkeypatch.setattr(FsspecStore, "on_request", None)
        ps = xser.PartialSaver(url, lin, storage_options=remote.options)
        assert ps.missing() == {key: [(5, 10)]}
        ps.write_rows(key, 5, full[5:])
        ps.finalize()
        assert np.array_equal(xser.load(url, verify=True, storage_options=remote.options).W, full)

    def test_notes_of_a_finished_run_are_ignored(self, remote):
        """A finalize killed after deleting the layout leaves notes of its run: a new partial save does not count them."""
        url = remote.url("m.yaml")
        lin = Linear(4, 10)
        full = np.arange(40, dtype=np.float32).reshape(10, 4)
        key = f"{xser.params(lin).name}/W"
        xser.PartialSaver(url, lin, storage_options=remote.options).write_rows(key, 0, full[:5])
        store_for(url, remote.options).delete([url + ".data.partial/layout.json"])  # as a killed finalize leaves it
        ps = xser.PartialSaver(url, lin, storage_options=remote.options)
        assert ps.missing() == {} and ps.written() == {}
        ps.write_rows(key, 0, full[:10])
        ps.finalize()
        assert np.array_equal(xser.load(url, storage_options=remote.options).W, full)

    def test_resume_after_sigkill_on_s3(self, s3_url, tmp_path):
        """A worker process killed between a block's upload and its note: a new PartialSaver resumes the rest."""
        import subprocess
        import sys

        prefix, options = s3_url
        url = f"{prefix}/run/m.yaml"
        here = os.path.dirname(os.path.abspath(__file__))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(here), here])}
        proc = subprocess.run([sys.executable, "-c", KILLED_WORKER, url, json.dumps(options)], env=env, capture_output=True)
        assert proc.returncode == -9, proc.stderr.decode()
        store = store_for(url, options)
        names = sorted(re.sub(r"\.[0-9a-f]{16}\.npy$", ".npy", k.rsplit("/", 1)[1]) for k in store.list(url + ".data.partial"))
        assert names == ["W@0-3.block.json", "W@0-3.npy", "W@3-6.npy", "layout.json"]  # (blocks: <stem>.<token>.npy)
        lin = Linear(4, 10)
        key = f"{xser.params(lin).name}/W"
        full = np.arange(40, dtype=np.float32).reshape(10, 4)
        ps = xser.PartialSaver(url, lin, storage_options=options)
        assert ps.missing() == {key: [(3, 10)]}
        ps.write_rows(key, 3, full[3:])
        ps.finalize()
        assert np.array_equal(xser.load(url, verify=True, storage_options=options).W, full)
        assert store.list(url + ".data.partial") == {}
