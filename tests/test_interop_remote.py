"""Every importer and exporter through a remote store (memory:// and S3 on a local moto server): the same files, bytes and
arrays as on a local disk, the same refusals; --force on an object store; --storage-option on the command line."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

import xser
from conftest import RemoteRoot
from strategies import leaf_of
from xser.cli import main
from xser.interop.angel import export_angel, import_angel, read_angel
from xser.interop.dismec import export_dismec, import_dismec
from xser.interop.recis import export_recis, import_recis
from xser.interop.safetensors import export_safetensors, import_safetensors
from xser.interop.xnmt import export_xnmt, import_xnmt

DATA = Path(__file__).parent / "data"
DATE = "2024-01-02 - 03:04:05"


def _fs(url: str, options: dict):
    import fsspec

    return fsspec.core.url_to_fs(url, **options)


def upload(root, local: Path, *names: str) -> str:
    """Copy the local file or directory ``local`` to ``root.url(*names)``, file by file, with fsspec itself."""
    url = root.url(*names)
    fs, path = _fs(url, root.options)
    if local.is_dir():
        for f in sorted(local.rglob("*")):
            if f.is_file():
                fs.put_file(str(f), path + "/" + f.relative_to(local).as_posix())
    else:
        fs.put_file(str(local), path)
    return url


def remote_files(root, url: str) -> dict[str, bytes]:
    """``{path relative to url: bytes}`` of every object under ``url`` (or of the object ``url``)."""
    fs, path = _fs(url, root.options)
    fs.invalidate_cache()  # s3fs caches listings: the exporter's requests went by another instance
    if fs.isfile(path):
        return {"": fs.cat_file(path)}
    return {p[len(path) + 1:]: fs.cat_file(p) for p in sorted(fs.find(path))}


def local_files(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {f.relative_to(path).as_posix(): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


def relative(paths, base: str) -> list[str]:
    return [os.fspath(p)[len(os.fspath(base)):] for p in paths]


def same_arrays(a: dict, b: dict) -> None:
    """Both models' arrays, subcollection names aside, bit for bit."""
    assert len(a) == len(b)
    for (_, pa), (_, pb) in zip(sorted(a.items()), sorted(b.items())):
        assert sorted(pa) == sorted(pb)
        for name in pa:
            x, y = np.asarray(pa[name]), np.asarray(pb[name])
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name


W = np.array([[1.5, 0.0, -2.25], [0.1, 1234567.0, 1e-7]], np.float32)


@pytest.fixture
def model(tmp_path):
    leaf = leaf_of({"w": W, "b": np.arange(6, dtype=np.float64).reshape(2, 3) / 7})
    xser.save(leaf, tmp_path / "m.yaml", durable=False)
    return str(tmp_path / "m.yaml"), xser.params(leaf).name


# ---------------------------------------------------------------- DiSMEC++


@pytest.mark.parametrize("fixture", ["DenseTXT", "SparseTXT", "DenseNPY", "split-DenseNPY"])
def test_dismec_round_trips_through_a_remote_store(tmp_path, remote_root, fixture):
    so = remote_root.options
    src = upload(remote_root, DATA / "dismec" / fixture, "src")
    name = import_dismec(src + "/model.json", tmp_path / "r.yaml", durable=False, storage_options=so)
    import_dismec(DATA / "dismec" / fixture / "model.json", tmp_path / "l.yaml", durable=False)
    same_arrays(xser.read_params(tmp_path / "r.yaml"), xser.read_params(tmp_path / "l.yaml"))
    training = xser.checkpoints(tmp_path / "r.yaml")[0].training
    assert training["imported_from"] == src + "/model.json"  # a URL is recorded as given

    out = remote_root.url("out", "model.json")
    written = export_dismec(tmp_path / "r.yaml", f"{name}/weights", out, date=DATE, storage_options=so)
    local = export_dismec(tmp_path / "r.yaml", f"{name}/weights", tmp_path / "x" / "model.json", date=DATE)
    assert relative(written, remote_root.url("out")) == relative(local, tmp_path / "x")
    assert remote_files(remote_root, remote_root.url("out")) == local_files(tmp_path / "x")
    import_dismec(out, tmp_path / "back.yaml", durable=False, storage_options=so)
    same_arrays(xser.read_params(tmp_path / "back.yaml"), xser.read_params(tmp_path / "l.yaml"))


def test_dismec_remote_messages_are_the_local_ones(tmp_path, memory_url):
    src = upload(RemoteRoot("memory", memory_url, {}), DATA / "dismec" / "split-DenseNPY", "src")
    fs, path = _fs(src, {})
    fs.rm_file(path + "/model.json.weights-2-of-3")
    with pytest.raises(xser.DataError) as info:
        import_dismec(src + "/model.json", tmp_path / "m.yaml")
    assert str(info.value) == (f"{src}/model.json.weights-2-of-3: weight file 'model.json.weights-2-of-3' not found (resolved "
                               "relative to the metadata file)")
    with pytest.raises(xser.DataError) as info:
        import_dismec(src + "/nothing.json", tmp_path / "m.yaml")
    assert str(info.value) == f"{src}/nothing.json: metadata file not found"
    assert not (tmp_path / "m.yaml").exists()


# ---------------------------------------------------------------- Angel


@pytest.mark.parametrize("fmt", ["colid-value-binary", "colid-value-text", "binary-column"])
def test_angel_round_trips_through_a_remote_store(tmp_path, remote_root, model, fmt):
    path, sub = model
    so = remote_root.options
    written = export_angel(path, f"{sub}/w", remote_root.url("out"), format=fmt, block_rows=1, per_file=1, storage_options=so)
    local = export_angel(path, f"{sub}/w", tmp_path / "out", format=fmt, block_rows=1, per_file=1)
    assert relative(written, remote_root.url("out")) == relative(local, tmp_path / "out")
    assert written[-1] == remote_root.url("out", "w", "_meta")
    assert remote_files(remote_root, remote_root.url("out")) == local_files(tmp_path / "out")
    _, back = read_angel(remote_root.url("out", "w"), storage_options=so)
    assert back.tobytes() == W.tobytes()
    name = import_angel(remote_root.url("out", "w"), tmp_path / "a.yaml", durable=False, storage_options=so)
    assert xser.read_params(tmp_path / "a.yaml")[name]["values"].tobytes() == W.tobytes()


def test_angel_special_and_missing_partition_files_are_named_as_locally(tmp_path, memory_url, model):
    path, sub = model
    export_angel(path, f"{sub}/w", memory_url, block_rows=1, per_file=1)
    fs, p = _fs(memory_url, {})
    fs.rm_file(p + "/w/1")
    with pytest.raises(xser.DataError) as info:
        read_angel(memory_url + "/w")
    assert str(info.value) == f"{memory_url}/w/1: partition 1: data file missing"


# ---------------------------------------------------------------- XNMT


def test_xnmt_round_trips_through_a_remote_store(tmp_path, remote_root):
    so = remote_root.options
    src = upload(remote_root, DATA / "xnmt" / "trained", "src")
    dirs = import_xnmt(src + "/tiny-train.mod", tmp_path / "r.yaml", durable=False, storage_options=so)
    assert dirs == [f"{src}/tiny-train.mod.data", f"{src}/tiny-train.mod.data.1", f"{src}/tiny-train.mod.data.2"]
    import_xnmt(DATA / "xnmt" / "trained" / "tiny-train.mod", tmp_path / "l.yaml", durable=False)
    for k in range(3):
        same_arrays(xser.read_params(tmp_path / "r.yaml", checkpoint=k), xser.read_params(tmp_path / "l.yaml", checkpoint=k))

    out = remote_root.url("out", "tiny.mod")
    written = export_xnmt(tmp_path / "r.yaml", out, storage_options=so)
    local = export_xnmt(tmp_path / "r.yaml", tmp_path / "x" / "tiny.mod")
    assert relative(written, remote_root.url("out")) == relative(local, tmp_path / "x")
    assert remote_files(remote_root, remote_root.url("out")) == local_files(tmp_path / "x")
    # the exported files are XNMT's own, byte for byte
    assert remote_files(remote_root, out + ".data.1") == local_files(DATA / "xnmt" / "trained" / "tiny-train.mod.data.1")
    import_xnmt(out, tmp_path / "back.yaml", durable=False, storage_options=so)
    same_arrays(xser.read_params(tmp_path / "back.yaml"), xser.read_params(tmp_path / "l.yaml"))


# ---------------------------------------------------------------- RecIS


def test_recis_round_trips_through_a_remote_store(tmp_path, remote_root):
    from test_recis import write_worked_example

    so = remote_root.options
    write_worked_example(tmp_path / "ck")
    src = upload(remote_root, tmp_path / "ck", "ck")
    import_recis(src, tmp_path / "r.yaml", durable=False, storage_options=so)
    import_recis(tmp_path / "ck", tmp_path / "l.yaml", durable=False)
    same_arrays(xser.read_params(tmp_path / "r.yaml"), xser.read_params(tmp_path / "l.yaml"))

    out = remote_root.url("out")
    written = export_recis(tmp_path / "r.yaml", out, parallel=2, model_pt=False, storage_options=so)
    local = export_recis(tmp_path / "r.yaml", tmp_path / "out", parallel=2, model_pt=False)
    assert relative(written, out) == relative(local, tmp_path / "out")
    assert remote_files(remote_root, out) == local_files(tmp_path / "out") == local_files(tmp_path / "ck")
    import_recis(out, tmp_path / "back.yaml", durable=False, storage_options=so)
    same_arrays(xser.read_params(tmp_path / "back.yaml"), xser.read_params(tmp_path / "l.yaml"))


def test_recis_missing_files_are_named_as_locally(tmp_path, memory_url):
    from test_recis import write_worked_example

    write_worked_example(tmp_path / "ck")
    (tmp_path / "ck" / "tensorkey.json").unlink()
    src = upload(RemoteRoot("memory", memory_url, {}), tmp_path / "ck", "ck")
    with pytest.raises(xser.DataError) as info:
        import_recis(src, tmp_path / "m.yaml")
    assert str(info.value) == f"{src}/tensorkey.json: tensorkey.json is missing: not a RecIS checkpoint directory"


# ---------------------------------------------------------------- safetensors / Hugging Face


@pytest.mark.parametrize("shard", [None, 40])
def test_safetensors_round_trips_through_a_remote_store(tmp_path, remote_root, model, shard):
    path, _ = model
    so = remote_root.options
    out = remote_root.url("hf")
    report = export_safetensors(path, out, max_shard_size=shard, storage_options=so)
    local = export_safetensors(path, tmp_path / "hf", max_shard_size=shard)
    assert relative(report.files, out) == relative(local.files, tmp_path / "hf")
    assert len(report.files) == (1 if shard is None else 3)
    assert remote_files(remote_root, out) == local_files(tmp_path / "hf")
    for fmt in ("npy", "safetensors"):
        import_safetensors(out, tmp_path / f"d-{fmt}.yaml", durable=False, format=fmt, storage_options=so)
        same_arrays(xser.read_params(tmp_path / f"d-{fmt}.yaml"), xser.read_params(path))
    import_safetensors(report.files[0], tmp_path / "f.yaml", durable=False, storage_options=so)  # one file
    import_safetensors(local.files[0], tmp_path / "lf.yaml", durable=False)
    same_arrays(xser.read_params(tmp_path / "f.yaml"), xser.read_params(tmp_path / "lf.yaml"))


def test_a_hugging_face_directory_keeps_its_side_files_from_a_remote_store(tmp_path, memory_url, model):
    path, _ = model
    export_safetensors(path, tmp_path / "hf")
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "bert"}\n')
    (tmp_path / "hf" / "vocab.txt").write_text("a\nb\n")
    fs, p = _fs(memory_url, {})
    for f in sorted((tmp_path / "hf").iterdir()):
        fs.put_file(str(f), p + "/hf/" + f.name)
    name = import_safetensors(memory_url + "/hf", tmp_path / "i.yaml", durable=False)
    arrays = xser.read_params(tmp_path / "i.yaml")[name]
    assert arrays["resource.config.json"].tobytes() == b'{"model_type": "bert"}\n'
    assert arrays["resource.vocab.txt"].tobytes() == b"a\nb\n"
    back = export_safetensors(tmp_path / "i.yaml", memory_url + "/again")
    again = remote_files(RemoteRoot("memory", memory_url, {}), memory_url + "/again")
    assert sorted(again) == ["config.json", "model.safetensors", "vocab.txt"]  # the spec in the header is the new model's
    assert again["config.json"] == b'{"model_type": "bert"}\n' and again["vocab.txt"] == b"a\nb\n"
    assert back.files[-2:] == (memory_url + "/again/config.json", memory_url + "/again/vocab.txt")


# ---------------------------------------------------------------- replacing a remote output


def test_a_remote_output_is_refused_without_force_and_replaced_with_it(tmp_path, remote_root, model):
    """Without force an existing output is refused as locally; with force the new files are written and the old
    output's other objects deleted (sharded, then one file: the shards and the index go)."""
    path, _ = model
    so = remote_root.options
    out = remote_root.url("hf")
    export_safetensors(path, out, max_shard_size=40, storage_options=so)
    before = remote_files(remote_root, out)
    with pytest.raises(xser.CheckpointError) as info:
        export_safetensors(path, out, storage_options=so)
    assert str(info.value) == f"{out}: the output exists; remove it or pass --force to replace it"
    assert remote_files(remote_root, out) == before
    export_safetensors(path, out, force=True, storage_options=so)
    export_safetensors(path, tmp_path / "hf")
    assert remote_files(remote_root, out) == local_files(tmp_path / "hf")
    assert list(local_files(tmp_path / "hf")) == ["model.safetensors"]


def test_a_failed_remote_export_uploads_nothing(tmp_path, memory_url, model):
    path, sub = model
    out = memory_url + "/hf"
    with pytest.raises(xser.DataError):
        export_safetensors(path, out, path="nothing.here")
    with pytest.raises(xser.DataError):
        export_angel(path, f"{sub}/w", memory_url, format="colid-value-text", row_type=0)  # double rows of a float32 matrix
    fs, p = _fs(memory_url, {})
    assert not fs.exists(p) or fs.find(p) == []


def test_an_existing_dismec_weight_file_is_refused_remotely(tmp_path, memory_url, model):
    path, sub = model
    fs, p = _fs(memory_url, {})
    fs.pipe_file(p + "/model.json.weights", b"old")
    with pytest.raises(xser.CheckpointError) as info:
        export_dismec(path, f"{sub}/w", memory_url + "/model.json")
    assert str(info.value) == f"{memory_url}/model.json.weights: the output exists; remove it or pass --force to replace it"
    assert fs.cat_file(p + "/model.json.weights") == b"old" and not fs.exists(p + "/model.json")


# ---------------------------------------------------------------- remote xser models (the other side of an import)


def test_import_into_and_export_from_a_remote_xser_model(tmp_path, remote_root):
    so = remote_root.options
    out = remote_root.url("m.yaml")
    name = import_dismec(DATA / "dismec" / "DenseTXT" / "model.json", out, storage_options=so)
    import_dismec(DATA / "dismec" / "DenseTXT" / "model.json", tmp_path / "l.yaml", durable=False)
    same_arrays(xser.read_params(out, storage_options=so), xser.read_params(tmp_path / "l.yaml"))
    written = export_dismec(out, f"{name}/weights", tmp_path / "x" / "model.json", date=DATE, storage_options=so)
    assert [Path(p).name for p in written] == ["model.json.weights", "model.json"]
    assert (tmp_path / "x" / "model.json.weights").read_bytes() == (DATA / "dismec" / "DenseTXT" / "model.json.weights").read_bytes()


# ---------------------------------------------------------------- resources


@xser.serializable(tag="!RemoteResourceUser")
class RemoteResourceUser:
    vocab: str

    def __attrs_post_init__(self):
        self.vocab_path = xser.resources(self).add(self.vocab, name="vocab.txt")


def test_a_resource_is_read_from_a_url(tmp_path, memory_url):
    fs, p = _fs(memory_url, {})
    fs.pipe_file(p + "/vocab.txt", b"a\nb\n\xff")
    obj = RemoteResourceUser(memory_url + "/vocab.txt")
    assert obj.vocab_path == memory_url + "/vocab.txt"
    xser.save(obj, tmp_path / "m.yaml", durable=False)
    arrays = xser.read_params(tmp_path / "m.yaml")[xser.params(obj).name]
    assert arrays["resource.vocab.txt"].tobytes() == b"a\nb\n\xff"
    with pytest.raises(xser.DataError) as info:
        RemoteResourceUser(memory_url + "/missing.txt")
    assert re.fullmatch(rf"{re.escape(memory_url)}/missing\.txt: RemoteResourceUser\.[0-9a-f]+: resource 'vocab\.txt': "
                        "cannot read the file: No such file or directory", str(info.value)), str(info.value)


# ---------------------------------------------------------------- command line


def _options_args(options: dict) -> list[str]:
    return [a for k, v in options.items() for a in ("--storage-option", f"{k}={json.dumps(v)}")]


def test_the_cli_imports_and_exports_with_storage_options(tmp_path, remote_root, model, capsys):
    path, sub = model
    opts = _options_args(remote_root.options)
    out = remote_root.url("ang")
    assert main(["export", "angel", path, f"{sub}/w", out, *opts]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {out}/w/_meta"
    assert main(["import", "angel", out + "/w", str(tmp_path / "a.yaml"), *opts]) == 0
    assert next(iter(xser.read_params(tmp_path / "a.yaml").values()))["values"].tobytes() == W.tobytes()
    assert main(["export", "angel", path, f"{sub}/w", out, *opts]) == 1
    assert capsys.readouterr().err == f"error: {out}/w: the output exists; remove it or pass --force to replace it\n"


@pytest.mark.parametrize("option, message", [
    ("endpoint", "argument --storage-option: expected KEY=VALUE (e.g. anon=true, endpoint_url=http://localhost:5000), got 'endpoint'"),
    ("=1", "argument --storage-option: expected KEY=VALUE (e.g. anon=true, endpoint_url=http://localhost:5000), got '=1'"),
])
def test_a_malformed_storage_option_is_a_usage_error(tmp_path, capsys, option, message):
    with pytest.raises(SystemExit) as info:
        main(["import", "dismec", "memory://x/model.json", str(tmp_path / "m.yaml"), "--storage-option", option])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"xser import dismec: error: {message}"
    assert not (tmp_path / "m.yaml").exists()


def test_storage_option_values_are_json_or_text(capsys):
    from xser.cli import parser

    args = parser().parse_args(["export", "xnmt", "m.yaml", "s3://b/x.mod", "--storage-option", "anon=true",
                                "--storage-option", "endpoint_url=http://localhost:5000", "--storage-option", 'client_kwargs={"a": [1]}',
                                "--storage-option", "n=5", "--storage-option", "s=a=b"])
    assert args.storage_options == {"anon": True, "endpoint_url": "http://localhost:5000", "client_kwargs": {"a": [1]}, "n": 5,
                                    "s": "a=b"}
    assert parser().parse_args(["export", "xnmt", "m.yaml", "x.mod"]).storage_options is None
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["export", "xnmt", "m.yaml", "x.mod", "--storage-option", "a=1", "--storage-option", "a=2"])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == "xser export xnmt: error: --storage-option a is given twice"
