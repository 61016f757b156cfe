"""The data directory: manifest checks, confinement, truncation, checksums, atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xser
from components import Linear
from helpers import fail_nth_write
from xser.storage.disk.commit import finish, stage
from xser.storage.opened import OpenedDir as DataDir
from xser.storage.plan import plan_save
from xser.storage.write import write


@pytest.fixture
def model(tmp_path):
    lin = Linear(4, 6)
    path = tmp_path / "m.yaml"
    xser.save(lin, path)
    return lin, str(path), xser.params(lin).name


def manifest_path(path):
    return Path(path + ".data") / "manifest.json"


def edit_manifest(path, fn):
    mp = manifest_path(path)
    m = json.loads(mp.read_text())
    fn(m)
    mp.write_text(json.dumps(m))


class TestManifest:
    def test_missing_manifest(self, model):
        """A data directory without manifest.json is not a checkpoint."""
        _, path, _ = model
        manifest_path(path).unlink()
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert str(info.value) == f"{path}.data: manifest.json is missing: not a complete xser data directory"

    def test_corrupt_json_has_line_and_column(self, model):
        """Broken JSON in the manifest is reported with its line and column."""
        _, path, _ = model
        manifest_path(path).write_text('{\n  "format": "xser",\n  oops\n}')
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert str(info.value) == f"{manifest_path(path)}:3:3: corrupt manifest: Expecting property name enclosed in double quotes"

    def test_not_utf8(self, model):
        """A manifest that is not UTF-8 is reported, not a UnicodeDecodeError."""
        _, path, _ = model
        manifest_path(path).write_bytes(b"\xff\xfe{}")
        with pytest.raises(xser.DataError, match="corrupt manifest: not UTF-8"):
            xser.load(path)

    BAD = [
        (lambda m: m.pop("format"), 'corrupt manifest: not an xser manifest (no "format": "xser")'),
        (lambda m: m.update(format_version="1"), "corrupt manifest: format_version must be an int >= 1, got '1'"),
        (lambda m: m.update(id=None), "corrupt manifest: 'id' must be a non-empty string of at most 64 characters, got None"),
        (lambda m: m.pop("spec"), "corrupt manifest: missing field 'spec' (the checkpoint's own spec file)"),
        (lambda m: m["spec"].update(bytes="x"), "corrupt manifest: spec: bad byte size 'x'"),
        (lambda m: m.update(step="3"), "corrupt manifest: 'step' must be an int or null, got '3'"),
        (lambda m: m.update(subcollections=[]), 'corrupt manifest: "subcollections" must be a mapping'),
        (lambda m: m.update(custom=[]), "corrupt manifest: 'custom' must be a mapping"),
        (lambda m: first(m).pop("dtype"), "corrupt manifest: {sub}/W: missing field 'dtype'"),
        (lambda m: first(m).update(dtype="|O"), "corrupt manifest: {sub}/W: object dtypes need pickle and are not supported"),
        (lambda m: first(m).update(shape=[6, -4]), "corrupt manifest: {sub}/W: bad shape [6, -4]"),
        (lambda m: first(m).update(blocks=[]), "corrupt manifest: {sub}/W: blocks must be a non-empty list"),
        (lambda m: block(m).update(format="hdf5"), "corrupt manifest: {sub}/W: unknown weight format 'hdf5' (known: binary-column, colid-value-binary, colid-value-text, dense-text, dynet-text, npy, raw, rowid-colid-value-binary, rowid-colid-value-text, safetensors, sparse-text, text-column, value-binary, value-text)"),
        (lambda m: block(m).pop("xxh3_64"), "corrupt manifest: {sub}/W: a block needs exactly one checksum (xxh3_64 or crc32)"),
        (lambda m: block(m).update(rows=[0, 3]), "corrupt manifest: {sub}/W: block fields not understood by this xser: ['bytes', 'file', 'format', 'rows', 'xxh3_64']"),
        (lambda m: block(m).update(bytes=-1), "corrupt manifest: {sub}/W: bad byte size -1"),
    ]

    @pytest.mark.parametrize("edit, message", BAD, ids=[m for _, m in BAD])
    def test_bad_manifest_table(self, model, edit, message):
        """Each malformed manifest gives this exact DataError, located at the manifest."""
        _, path, sub = model
        edit_manifest(path, edit)
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert str(info.value) == f"{manifest_path(path)}: " + message.format(sub=sub)

    def test_newer_format_version(self, model):
        """A manifest from a newer xser is refused with both versions."""
        _, path, _ = model
        edit_manifest(path, lambda m: m.update(format_version=99))
        with pytest.raises(xser.DataError, match="format_version 99 was written by a newer xser"):
            xser.load(path)


def first(m):
    return next(iter(m["subcollections"].values()))["W"]


def block(m):
    return first(m)["blocks"][0]


class TestConfinement:
    @pytest.mark.parametrize("name", ["../x.npy", "/etc/passwd", "a/../../x.npy", "a//b.npy", "./a.npy", "a\\b.npy", ""])
    def test_unsafe_names(self, model, name):
        """File names with .., absolute paths and the like are refused before any read."""
        _, path, _ = model
        edit_manifest(path, lambda m: block(m).update(file=name))
        with pytest.raises(xser.DataError, match="unsafe file name|must be a non-empty string"):
            xser.load(path)

    def test_symlink_out_of_directory(self, model, tmp_path):
        """A file that is a link out of the data directory is refused."""
        _, path, sub = model
        outside = tmp_path / "outside.npy"
        np.save(outside, np.zeros((6, 4), np.float32))
        target = Path(path + ".data") / sub / "W.npy"
        target.unlink()
        target.symlink_to(outside)
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert str(info.value) == f"{target}: file '{sub}/W.npy' is a symbolic link or passes through one (never followed)"

    def test_symlink_inside_directory(self, model):
        """No link is followed, even one that stays inside the directory: xser never writes links."""
        _, path, sub = model
        target = Path(path + ".data") / sub / "W.npy"
        os.rename(target, target.with_name("real.npy"))
        target.symlink_to("real.npy")
        with pytest.raises(xser.DataError, match="is a symbolic link or passes through one"):
            xser.load(path)

    def test_linked_subcollection_directory(self, model, tmp_path):
        """A subcollection directory that is a link out of the data directory is refused."""
        _, path, sub = model
        d = Path(path + ".data") / sub
        moved = tmp_path / "elsewhere"
        d.rename(moved)
        d.symlink_to(moved)
        with pytest.raises(xser.DataError, match="is a symbolic link or passes through one"):
            xser.load(path)

    def test_data_directory_is_a_link(self, model, tmp_path):
        """The data directory itself may not be a symbolic link."""
        _, path, _ = model
        os.rename(path + ".data", tmp_path / "real")
        os.symlink(tmp_path / "real", path + ".data")
        with pytest.raises(xser.DataError, match="never a symbolic link"):
            xser.load(path)


class TestCorruptFiles:
    def test_truncated_npy(self, model):
        """A truncated file fails on its size before any parsing or allocation."""
        _, path, sub = model
        f = Path(path + ".data") / sub / "W.npy"
        f.write_bytes(f.read_bytes()[:100])
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert str(info.value) == f"{f}: file has 100 bytes, manifest says 224 (truncated or replaced?)"

    def test_header_claims_more_than_file(self, model):
        """A header (and manifest) promising a huge array is caught before allocating it."""
        _, path, sub = model
        f = Path(path + ".data") / sub / "W.npy"
        data = f.read_bytes()
        big = data.replace(b"(6, 4)", b"(6000000000, 4)".ljust(6))
        header_len = int.from_bytes(data[8:10], "little")
        fixed = big[:10] + big[10:10 + header_len + 9].replace(b"    ", b"", 1)[:header_len] + data[10 + header_len:]
        f.write_bytes(fixed)
        edit_manifest(path, lambda m: (first(m).update(shape=[6000000000, 4]), block(m).update(bytes=len(fixed))))
        lin = Linear(4, 6)  # noqa: F841  (the class is registered)
        with pytest.raises(xser.DataError) as info:
            DataDir.open(path + ".data").read_all()
        assert str(info.value) == (
            f"{f}: header promises 96000000000 bytes of data for shape (6000000000, 4) float32, the file holds 96"
        )

    def test_not_npy(self, model):
        """Garbage where an .npy should be is a DataError naming the file."""
        _, path, sub = model
        f = Path(path + ".data") / sub / "W.npy"
        f.write_bytes(b"x" * 224)
        with pytest.raises(xser.DataError, match=r"W.npy: not a valid \.npy file"):
            xser.load(path)

    def test_header_disagrees_with_manifest(self, model):
        """An .npy whose header differs from the manifest names both."""
        _, path, sub = model
        f = Path(path + ".data") / sub / "W.npy"
        np.save(f, np.zeros((4, 6), np.float32))
        with pytest.raises(xser.DataError, match=r"header says shape \(4, 6\), manifest says \(6, 4\)"):
            xser.load(path)

    def test_checksum_mismatch_with_verify(self, model):
        """A flipped byte is found by verify=True (and by nothing slower than a read)."""
        lin, path, sub = model
        f = Path(path + ".data") / sub / "W.npy"
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))
        xser.load(path)  # without verify the size and header still match
        with pytest.raises(xser.DataError, match=r"W.npy: checksum mismatch: xxh3_64 [0-9a-f]{16} on disk, [0-9a-f]{16} in manifest"):
            xser.load(path, verify=True)
        with pytest.raises(xser.DataError, match="checksum mismatch"):
            xser.read_params(path, verify=True, mmap=True)

    def test_missing_file(self, model):
        """A file listed in the manifest but gone is named."""
        _, path, sub = model
        (Path(path + ".data") / sub / "W.npy").unlink()
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert str(info.value) == f"{path}.data/{sub}/W.npy: file '{sub}/W.npy' named in the manifest is missing"

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def test_any_corruption_raises_only_xser_errors(self, tmp_path_factory, data):
        """Loading any truncated or byte-flipped file raises only XserError (or loads)."""
        d = tmp_path_factory.mktemp("c")
        path = str(d / "m.yaml")
        xser.save(Linear(3, 2), path, durable=False)
        files = sorted(str(p) for p in Path(path + ".data").rglob("*") if p.is_file()) + [path]
        victim = data.draw(st.sampled_from(files))
        raw = bytearray(Path(victim).read_bytes())
        if data.draw(st.booleans()) and raw:
            raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
        elif raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
        Path(victim).write_bytes(bytes(raw))
        try:
            xser.load(path, verify=True)
        except xser.XserError:
            pass


class TestAtomicWrite:
    def test_failed_write_keeps_old_data(self, tmp_path, monkeypatch):
        """An error in the middle of a save leaves the previous data directory intact and no temporaries."""
        path = str(tmp_path / "m.yaml")
        lin = Linear(2, 3)
        xser.save(lin, path)
        before = xser.read_params(path)
        fail_nth_write(monkeypatch, 2)
        lin.W[...] = 1.0
        lin.b[...] = 1.0
        with pytest.raises(xser.DataError, match="No space left on device"):
            xser.save(lin, path)
        monkeypatch.undo()
        after = xser.read_params(path)
        for sub in before:
            for k in before[sub]:
                assert np.array_equal(before[sub][k], after[sub][k])
        assert sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data"]

    def test_empty_subcollection_has_entry(self, tmp_path):
        """A subcollection without parameters still has its (empty) entry."""
        plan = plan_save({"Empty.0000000a": {}}, spec_text="xser_format: 1\nname: null\nexperiment: {}\n")
        with stage(str(tmp_path / "d"), durable=False) as staging:
            finish(staging, plan, write(staging.path, plan, durable=False), {}, id="a" * 32, model="b" * 32)
        os.rename(staging.path, tmp_path / "d")
        assert os.listdir(tmp_path / "d" / "Empty.0000000a") == []
        assert DataDir.open(tmp_path / "d").subcollections == {"Empty.0000000a": {}}


class TestPublish:
    def test_resave_without_atomic_exchange(self, tmp_path, monkeypatch):
        """Where the OS cannot swap directories, re-saves still replace the data and clean up."""
        monkeypatch.setattr("xser.storage.disk.commit._RENAMEAT2", None)
        path = str(tmp_path / "m.yaml")
        lin = Linear(2, 3)
        xser.save(lin, path)
        lin.W[...] = 2.0
        xser.save(lin, path)
        assert np.all(xser.load(path).W == 2.0)
        assert sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data"]


CHILD = """
import sys, numpy as np
sys.path.insert(0, {tests!r})
import components, xser
lin = components.Linear(64, 64)
i = 0
while True:
    i += 1
    lin.W[...] = i
    lin.b[...] = i
    xser.save(lin, {path!r})
    print(i, flush=True)
"""


def test_killed_saves_leave_a_whole_model(tmp_path):
    """A saver killed with SIGKILL at random moments always leaves a model that loads as one saved state."""
    import random
    import signal
    import subprocess
    import sys
    import time

    path = str(tmp_path / "m.yaml")
    code = CHILD.format(tests=os.path.dirname(__file__), path=path)
    rng = random.Random(1)
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        proc.stdout.readline()  # at least one save completed
        time.sleep(rng.uniform(0.0, 0.2))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        m = xser.load(path, verify=True)
        k = m.W.flat[0]
        assert k >= 1 and np.all(m.W == k) and np.all(m.b == k)
