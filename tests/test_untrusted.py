"""Untrusted model files: loading one reads only its own files, runs no code, and fails cleanly.

The threat model is in docs/security.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import xser
from components import Linear, Model
from helpers import edit_spec


@pytest.fixture
def saved(tmp_path):
    path = str(tmp_path / "m.yaml")
    lin = Linear(2, 3)
    xser.save(Model(encoder=lin), path)
    return path, lin


class TestNoOtherFiles:
    def test_load_serialized_in_a_saved_spec_is_refused(self, saved, tmp_path):
        """A downloaded model cannot make load read another model: !LoadSerialized in a saved spec is a SpecError with its line."""
        path, _ = saved
        victim = str(tmp_path / "victim.yaml")
        xser.save(Linear(5, 5), victim)
        spec = edit_spec(path, lambda t: t.replace("decoder: null", f"decoder: !LoadSerialized {{filename: {victim}}}"))
        with pytest.raises(xser.SpecError) as info:
            xser.load(path)
        assert str(info.value).startswith(f"{spec}:6:12: ")
        assert str(info.value).endswith(
            "!LoadSerialized is not allowed in a saved model: a saved spec holds only components and values, "
            "and loading it never reads another file"
        )

    def test_load_serialized_inside_a_loaded_model_is_refused(self, saved, tmp_path):
        """A config may load a saved model; that saved model may not pull in a third one."""
        path, _ = saved
        edit_spec(path, lambda t: t.replace("decoder: null", "decoder: !LoadSerialized {filename: /dev/zero}"))
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"e:\n  model: !LoadSerialized {{filename: {path}}}\n")
        with pytest.raises(xser.SpecError, match="!LoadSerialized is not allowed in a saved model"):
            xser.build(xser.load_config(cfg)["e"])

    def test_placeholders_are_values_in_saved_specs(self, saved):
        """A saved spec is never substituted: '{EXP_DIR}' there is the string it says."""
        path, _ = saved
        edit_spec(path, lambda t: t.replace("name: null", "name: '{EXP_DIR}'", 1) if "name: null" in t else t)
        xser.load(path)  # nothing is expanded, nothing read

    def test_opened_files_stay_in_the_directory(self, saved, monkeypatch):
        """Loading opens nothing outside the model's own files (its spec and its data directory)."""
        path, _ = saved
        opened = []
        real = os.open

        def record(p, *a, **kw):
            if kw.get("dir_fd") is None:
                opened.append(os.path.abspath(p))
            return real(p, *a, **kw)

        monkeypatch.setattr(os, "open", record)
        xser.load(path)
        here = os.path.dirname(os.path.abspath(path))
        assert opened and all(p.startswith(here + os.sep + "m.yaml") or p.startswith("/proc/") for p in opened), opened


class TestSpecialFiles:
    def test_fifo_is_refused_not_waited_for(self, saved):
        """A FIFO in place of a data file is refused at once (opening it must not wait for a writer)."""
        path, lin = saved
        f = Path(path + ".data") / xser.params(lin).name / "W.npy"
        f.unlink()
        os.mkfifo(f)
        with pytest.raises(xser.DataError, match="is not a regular file"):
            xser.load(path)

    def test_manifest_link_to_dev_zero(self, saved):
        """manifest.json linked to /dev/zero is refused (no link is followed, and a size cap applies)."""
        path, _ = saved
        m = Path(path + ".data") / "manifest.json"
        m.unlink()
        m.symlink_to("/dev/zero")
        with pytest.raises(xser.DataError, match="manifest.json is a symbolic link"):
            xser.load(path)

    def test_spec_file_that_is_a_device(self, tmp_path):
        """A spec path naming a device or FIFO is refused without reading it."""
        with pytest.raises(xser.SpecError, match="not a regular file"):
            xser.load_config("/dev/zero")
        fifo = tmp_path / "c.yaml"
        os.mkfifo(fifo)
        with pytest.raises(xser.SpecError, match="not a regular file"):
            xser.load_config(fifo)


def _special(kind: str, path: str, tmp_path) -> None:
    """Put a special file of ``kind`` at ``path`` (where a model's spec file belongs)."""
    os.unlink(path) if os.path.lexists(path) else None
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "device":
        os.symlink("/dev/null", path)  # a link is followed for the spec file: what it names is a character device
    elif kind == "socket":
        import socket

        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()


KINDS = {"fifo": "a FIFO", "directory": "a directory", "device": "a character device", "socket": "a socket"}
SPEC_REFUSED = "m.yaml: the spec is not a regular file ({}: never read, as it could block forever)"


class _Blocked(Exception):
    pass


def _within(seconds: int, fn):
    """``fn()``, or ``_Blocked`` if it has not returned after ``seconds`` (a blocking open of a FIFO is interrupted)."""
    import signal

    def ring(*_):
        raise _Blocked(f"still blocked after {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("kind", ["device", "fifo", "socket"])  # (a directory is inspected as a model directory)
def test_inspect_cli_refuses_a_special_spec_file(kind, tmp_path, capsys):
    from xser.cli import main

    model = str(tmp_path / "m.yaml")
    xser.save(Model(encoder=Linear(2, 3)), model)
    _special(kind, model, tmp_path)
    assert _within(10, lambda: main(["inspect", model])) == 1
    assert capsys.readouterr().err == f"error: {model}: the spec is not a regular file ({KINDS[kind]}: never read, as it could block forever)\n"


@pytest.mark.parametrize("kind", sorted(KINDS))
class TestSpecialSpecFile:
    """A FIFO, socket, device or directory where a saved model's spec file belongs: every entry point answers at
    once; those that read or write the spec refuse it with the one wording (``storage.fsutil.require_regular``)."""

    @pytest.fixture
    def model(self, tmp_path, kind):
        path = str(tmp_path / "m.yaml")
        self.obj = Model(encoder=Linear(2, 3))
        with xser.CheckpointSaver(path, keep=3) as s:
            s.save(self.obj, step=6, training_state={"n": 1})
            s.save(self.obj, step=7, training_state={"n": 2})
        _special(kind, path, tmp_path)
        return path

    @pytest.mark.parametrize("call", ["inspect", "load_config", "save", "saver"])
    def test_readers_and_savers_of_the_spec_refuse(self, model, kind, call):
        from xser.tools.inspect import open_model

        calls = {
            "inspect": (xser.SpecError, lambda: open_model(model)),
            "load_config": (xser.SpecError, lambda: xser.load_config(model)),
            "save": (xser.CheckpointError, lambda: xser.save(self.obj, model)),
            "saver": (xser.CheckpointError, lambda: xser.CheckpointSaver(model).save(self.obj, step=8)),
        }
        cls, fn = calls[call]
        with pytest.raises(cls) as info:
            _within(10, fn)
        assert str(info.value) == f"{model}: the spec is not a regular file ({KINDS[kind]}: never read, as it could block forever)"
        assert len(xser.checkpoints(model)) == 2  # nothing was saved

    @pytest.mark.parametrize("call", ["load", "load_mmap", "read_params", "training_state", "resume", "reader", "checkpoints"])
    def test_data_readers_never_block(self, model, kind, call):
        """Readers of the data either refuse the spec file (if they read it) or never touch it: they never wait."""
        from xser.tools.reader import CheckpointReader

        def reader():
            with CheckpointReader(model, checkpoint=1) as r:
                return r.tensor_names()

        calls = {
            "load": lambda: xser.load(model),
            "load_mmap": lambda: xser.load(model, mmap=True, checkpoint=1),
            "read_params": lambda: xser.read_params(model, checkpoint=1),
            "training_state": lambda: xser.load_training_state(model),
            "resume": lambda: xser.resume(model),
            "reader": reader,
            "checkpoints": lambda: xser.checkpoints(model),
        }
        try:
            _within(10, calls[call])
        except xser.SpecError as e:
            assert str(e) == f"{model}: the spec is not a regular file ({KINDS[kind]}: never read, as it could block forever)"
        except xser.CheckpointError as e:  # a directory given to CheckpointReader is read as a safetensors directory
            assert (kind, call, str(e)) == ("directory", "reader", f"{model}: a safetensors file or directory holds one checkpoint")


class TestForgedSizes:
    def test_deep_nesting(self, tmp_path):
        """330 levels of nesting are a SpecError, not a RecursionError."""
        p = tmp_path / "c.yaml"
        p.write_text("e:\n  a: " + "[" * 330 + "]" * 330 + "\n")
        with pytest.raises(xser.SpecError, match="nested more than 200 levels deep"):
            xser.load_config(p)

    def test_shape_whose_byte_count_wraps_int64(self, saved):
        """A shape whose bytes overflow 64 bits is caught by the size checks (no allocation, no wrap)."""
        path, lin = saved
        name = xser.params(lin).name
        mp = Path(path + ".data") / "manifest.json"
        m = json.loads(mp.read_text())
        m["subcollections"][name]["W"]["shape"] = [2**40, 2**40]
        mp.write_text(json.dumps(m))
        with pytest.raises(xser.DataError, match="shape|header"):
            xser.read_params(path)
        with pytest.raises(xser.DataError):
            xser.load(path, mmap=True)

    def test_partial_finalize_keeps_the_experiment_name(self, tmp_path):
        """PartialSaver.finalize saves the experiment under its own name, not a parameter's."""
        cfg = tmp_path / "c.yaml"
        cfg.write_text("exp1:\n  model: !TLinear {in_dim: 2, out_dim: 4}\n")
        exp = xser.build(xser.load_config(cfg)["exp1"])
        path = str(tmp_path / "m.yaml")
        ps = xser.PartialSaver(path, exp)
        name = xser.params(exp["model"]).name
        ps.write_rows(f"{name}/W", 0, np.ones((4, 2), np.float32))
        ps.finalize()
        assert list(xser.load_config(path)) == ["exp1"]


def test_dismec_metadata_with_an_infinite_count(tmp_path):
    """Found by the long fuzz run: a count of 1e3082 (infinity in JSON) is a DataError, not an OverflowError."""
    import shutil

    from xser.interop.dismec import import_dismec

    src = tmp_path / "in"
    shutil.copytree(Path(__file__).parent / "data" / "dismec" / "DenseTXT", src)
    meta = src / "model.json"
    meta.write_text(meta.read_text().replace('"count": 2', '"count": 1e3082'))
    with pytest.raises(xser.DataError, match="files.0: 'count' must be an int, got inf"):
        import_dismec(meta, tmp_path / "out.yaml")


# ---------------------------------------------------------------- the manifest's schema, fuzzed field by field

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from components import Norm  # noqa: E402

HOSTILE_TEXT = [",i4", "i4,", "<f4", "|O", "O", "V0", "<U0", "[", "(", "bfloat16", "float8_e4m3fn", "../x", "/etc/passwd",
                "a/../../b", "a\\b", "\0", "", " ", "x" * 3000, "npy", "safetensors", "spec.yaml", "manifest.json",
                "xxh3_64", "ffffffffffffffff", "zz", "1e308", "NaN", "-1", "$array", "{EXP_DIR}"]
JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from([0, 1, -1, 2**31, 2**62, 2**63, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(HOSTILE_TEXT), st.text(max_size=12),
)
HOSTILE = st.one_of(
    JSON_LEAF,
    st.recursive(JSON_LEAF, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["file", "format", "bytes", "dtype", "shape", "blocks", "start", "key", "offset", "length", "xxh3_64",
                         "crc32", "tree", "arrays", "$array", "a"]) | st.text(max_size=6), inner, max_size=4), max_leaves=12),
    st.builds(lambda n: f"__DEEP_{n}__", st.integers(100, 100_000)),  # nested deeper than any parser's stack (see _render)
)


def _render(tree) -> str:
    """The manifest's JSON, with every ``"__DEEP_n__"`` written as ``n`` nested lists (no encoder could write them)."""
    import re

    return re.sub(r'"__DEEP_(\d+)__"', lambda m: "[" * int(m.group(1)) + "]" * int(m.group(1)), json.dumps(tree))


@pytest.fixture(scope="module")
def schema_models(tmp_path_factory):
    """Saved models covering every manifest field xser writes: (files as bytes, the manifest's path)."""
    out = []
    for kw in ({"blocks": {"*/W": 4}, "formats": {"*/b": "dense-text", "Norm*": "safetensors"}}, {"shards": 2}, {}):
        d = tmp_path_factory.mktemp("schema")
        m = Model(encoder=Linear(4, 6), decoder=Norm(6))
        with xser.CheckpointSaver(d / "m.yaml", keep=2, **kw) as saver:
            saver.save(m, step=1, metrics={"acc": 1.5}, training={"lr": 0.1}, custom={"k": [1]},
                       training_state={"step": 1, "m": np.arange(3.0), "nested": {"v": np.ones((2, 2), np.float32)}})
        out.append({str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()})
    return out


def _paths(node, prefix=()):
    """Every path into a JSON tree (the root too)."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _edit(tree, path, action, value):
    if not path:
        return value if action != "delete" else {}
    parent = tree
    for k in path[:-1]:
        parent = parent[k]
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "replace":
        parent[last] = value
    elif isinstance(parent, dict):  # "add": a sibling field no xser writes
        parent[str(value)[:20] if not isinstance(value, str) else value[:20]] = value
    else:
        parent.append(value)
    return tree


def _readers(path):
    from xser.tools.inspect import open_model, verify_model
    from xser.tools.reader import CheckpointReader

    def inspect():
        view = open_model(path)
        view.data.close()

    def reader():
        with CheckpointReader(path) as r:
            for n in r.tensor_names():
                r.read_tensor(n)

    def save_again():
        obj = xser.load(path)
        with xser.CheckpointSaver(path, keep=KeepLast(1) | KeepBest(1, "acc")) as s:
            s.save(obj, step=2, metrics={"acc": 1.0})
        xser.checkpoints(path)

    from xser.checkpoints.policy import KeepBest, KeepLast

    return [lambda: xser.checkpoints(path), lambda: xser.load(path), lambda: xser.load(path, mmap=True),
            lambda: xser.read_params(path, verify=True), lambda: xser.load_training_state(path), lambda: xser.resume(path),
            inspect, lambda: verify_model(path), reader, save_again]


class TestManifestSchema:
    @settings(deadline=None, suppress_health_check=list(__import__("hypothesis").HealthCheck))  # --hypothesis-profile=fuzz: 5,000
    @given(data=st.data())
    def test_every_field_missing_mistyped_or_hostile(self, schema_models, tmp_path_factory, data):
        """One field of a real manifest deleted, replaced by a hostile value (wrong type, huge or negative number,
        NaN, a comma dtype, a path out of the directory, nesting deeper than the stack) or joined by an unknown one:
        every reader and a save on top give a result or an XserError, within the memory cap, never another error."""
        from test_fuzz import within_the_rules

        files = schema_models[data.draw(st.integers(0, len(schema_models) - 1))]
        tree = json.loads(files["m.yaml.data/manifest.json"])
        path = data.draw(st.sampled_from(list(_paths(tree))))
        action = data.draw(st.sampled_from(["delete", "replace", "add"] if path else ["replace"]))
        tree = _edit(tree, path, action, data.draw(HOSTILE))
        root = tmp_path_factory.mktemp("m")
        for rel, raw in files.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(raw)
        mp = root / "m.yaml.data" / "manifest.json"
        os.chmod(mp, 0o644)
        mp.write_text(_render(tree))
        for call in _readers(str(root / "m.yaml")):
            within_the_rules(call, root)


@pytest.mark.parametrize("dtype, message", [
    (",i4", "Linear.0000abcd/W: not a dtype: ',i4' (SyntaxError)"),
    ("(", "Linear.0000abcd/W: data type '(' not understood"),
    (["a"], "Linear.0000abcd/W: bad record field 'a'"),
    ("|O", "Linear.0000abcd/W: object dtypes need pickle and are not supported"),
])
def test_manifest_dtype_junk_is_a_data_error(tmp_path, dtype, message):
    """The fuzz's findings, pinned: a dtype numpy cannot parse is a DataError naming the parameter, not a SyntaxError."""
    from xser.storage.manifest import parse_manifest

    m = {"format": "xser", "format_version": 1, "subcollections": {"Linear.0000abcd": {"W": {
        "dtype": dtype, "shape": [2], "blocks": [{"file": "W.npy", "format": "npy", "bytes": 1, "xxh3_64": "00"}]}}}}
    with pytest.raises(xser.DataError) as info:
        parse_manifest(json.dumps(m).encode(), "m.json")
    assert str(info.value) == f"m.json: corrupt manifest: {message}"


@pytest.mark.parametrize("spec, message", [
    ({"bytes": 3, "xxh3_64": "00"}, "spec: missing field 'file'"),
    ({"file": "spec.yaml", "xxh3_64": "00"}, "spec: missing field 'bytes'"),
    ({"file": 7, "bytes": 3, "xxh3_64": "00"}, "file name must be a non-empty string, got 7"),
])
def test_manifest_spec_field_missing(tmp_path, spec, message):
    """A spec block without its file (the fuzz's KeyError: 'file') is a DataError naming the missing field."""
    from xser.storage.manifest import parse_manifest

    m = {"format": "xser", "format_version": 3, "id": "a", "model": "b", "subcollections": {}, "spec": spec}
    with pytest.raises(xser.DataError) as info:
        parse_manifest(json.dumps(m).encode(), "m.json")
    assert str(info.value) == f"m.json: corrupt manifest: {message}"
