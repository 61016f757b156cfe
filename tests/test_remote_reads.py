"""Reads of remote checkpoints: how many requests, how many bytes, and objects that do not match their manifest."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("fsspec")

import xser  # noqa: E402
from components import Linear, Model  # noqa: E402
from xser.errors import DataError, Location, StorageError  # noqa: E402
from xser.storage.stores import store_for  # noqa: E402
from xser.storage.stores.remote import FsspecStore  # noqa: E402


class Requests:
    """Every request through the store's funnel (op, url), and every GET as (url, start, end, bytes returned)."""

    def __init__(self, monkeypatch, store):
        self.ops: list[tuple[str, str]] = []
        self.gets: list[tuple[str, int | None, int | None, int]] = []
        monkeypatch.setattr(FsspecStore, "on_request", lambda op, url: self.ops.append((op, url)))
        real = store.fs.cat_file

        def cat_file(path, start=None, end=None, **kw):
            out = real(path, start=start, end=end, **kw)
            self.gets.append((path, start, end, len(out)))
            return out

        monkeypatch.setattr(store.fs, "cat_file", cat_file)

    def of(self, suffix):
        return [g for g in self.gets if g[0].endswith(suffix)]


def saved(remote, name="m.yaml"):
    url = remote.url(name)
    m = Model(encoder=Linear(4, 3), decoder=Linear(3, 4))
    for i, lin in enumerate((m.encoder, m.decoder)):
        lin.W[...] = np.arange(lin.W.size, dtype=lin.W.dtype).reshape(lin.W.shape) + i
        lin.b[...] = i
    xser.save(m, url, storage_options=remote.options)
    return url, m


def test_load_gets_each_file_once_and_heads_nothing(remote_root, monkeypatch):
    """A load asks once for each file of the checkpoint (size from the manifest, header and data in one GET), and once
    for the manifest (size from the commit record): no HEAD requests, no second GET."""
    url, m = saved(remote_root)
    store = store_for(url, remote_root.options)
    seen = Requests(monkeypatch, store)
    back = xser.load(url, storage_options=remote_root.options)
    assert np.array_equal(back.encoder.W, m.encoder.W) and np.array_equal(back.decoder.b, m.decoder.b)
    npy = seen.of(".npy")
    assert len(npy) == 4 and len({g[0] for g in npy}) == 4
    assert all(start == 0 for _, start, _, _ in npy)
    assert len(seen.of("manifest.json")) == 1
    assert [op for op, _ in seen.ops].count("stat") == 0
    assert len(seen.ops) == len(seen.gets) + 1  # the one listing of the commit records


def test_rows_read_the_header_then_the_rows(remote_root, monkeypatch):
    """A row range of an .npy: one GET for the header (a few KiB at most), one for the rows' bytes."""
    url = remote_root.url("m.yaml")
    lin = Linear(256, 64)  # W: 64 rows of 256 float32 (1 KiB a row)
    lin.W[...] = np.arange(lin.W.size, dtype=lin.W.dtype).reshape(lin.W.shape)
    xser.save(lin, url, storage_options=remote_root.options)
    sub = xser.params(lin).name
    seen = Requests(monkeypatch, store_for(url, remote_root.options))
    got = xser.read_params(url, rows={f"{sub}/W": (10, 12)}, storage_options=remote_root.options)[sub]["W"]
    assert np.array_equal(got, lin.W[10:12])
    (head, rows) = seen.of("W.npy")
    assert head[1:3] == (0, 4096) and head[3] == 4096
    assert rows[1] == 128 + 10 * 1024 and rows[3] == 2 * 1024


@pytest.mark.parametrize("change, message", [
    (lambda data: data[:-8], "file has {short} bytes, manifest says {size} (truncated or replaced?)"),
    (lambda data: data + b"12345678", "file has more than {size} bytes, manifest says {size} (truncated or replaced?)"),
])
def test_an_object_of_another_size_is_an_error(remote_root, change, message):
    """The manifest's size is trusted to open a file without a request: an object that is shorter or longer than it
    says is still refused, at the read that reaches its end."""
    url, m = saved(remote_root)
    store = store_for(url, remote_root.options)
    (ck,) = [c.path for c in xser.checkpoints(url, storage_options=remote_root.options)]
    f = store.join(ck, xser.params(m.encoder).name, "W.npy")
    data = store.read_bytes(f, "x")
    store.put(f, change(data))
    with pytest.raises(DataError) as e:
        xser.load(url, storage_options=remote_root.options)
    assert str(e.value) == f"{f}: " + message.format(short=len(data) - 8, size=len(data))


def test_a_missing_file_is_named(remote_root):
    url, m = saved(remote_root)
    store = store_for(url, remote_root.options)
    (ck,) = [c.path for c in xser.checkpoints(url, storage_options=remote_root.options)]
    rel = xser.params(m.decoder).name + "/b.npy"
    store.delete([store.join(ck, rel)])
    with pytest.raises(DataError) as e:
        xser.load(url, storage_options=remote_root.options)
    assert str(e.value) == f"{store.join(ck, rel)}: file {rel!r} named in the manifest is missing"


def test_remote_file_head_and_known_size(remote_root, monkeypatch):
    """``head``: the first read from the start fetches that many bytes and later reads inside them cost nothing;
    ``size`` known: no HEAD to open; ``pread`` leaves the position alone."""
    store = store_for(remote_root.url(), remote_root.options)
    url = remote_root.url("blob")
    data = bytes(range(256)) * 64  # 16 KiB
    store.put(url, data)
    seen = Requests(monkeypatch, store)
    with store.open_read(url, "blob", size=len(data), head=4096) as f:
        assert f.read(10) == data[:10]
        assert f.read(100) == data[10:110]
        buf = bytearray(8000)
        assert f.readinto(buf) == 8000 and bytes(buf) == data[110:8110]
        assert f.pread(5, 3) == data[3:8] and f.tell() == 8110
        assert f.read() == data[8110:]
    assert seen.ops == [("read", url)] * 3
    assert [g[1:] for g in seen.gets] == [(0, 4096, 4096), (4096, 8110, 4014), (8110, len(data) + 1, len(data) - 8110)]


# -- uploads


def test_writers_go_on_while_files_upload(remote_root, monkeypatch):
    """A writer hands its finished file to the upload threads and writes the next one: while the first upload is in
    flight, more files are finished (with 2 threads, 2 uploads in flight and 2 more files written)."""
    from xser.storage.objects.staging import RemoteStaging

    handed = []
    gate = threading.Event()
    real_done, real_put = RemoteStaging.done, FsspecStore.put_file

    def done(self, rel, path, result):
        handed.append(rel)
        if len(handed) >= 3:
            gate.set()
        return real_done(self, rel, path, result)

    seen_before_first_upload_ended = []

    def put_file(self, local, path):
        if not seen_before_first_upload_ended:
            gate.wait(10)
            seen_before_first_upload_ended.append(len(handed))
        return real_put(self, local, path)

    monkeypatch.setattr(RemoteStaging, "done", done)
    monkeypatch.setattr(FsspecStore, "put_file", put_file)
    url, m = saved(remote_root)
    assert seen_before_first_upload_ended[0] >= 3
    assert np.array_equal(xser.load(url, storage_options=remote_root.options).encoder.W, m.encoder.W)


def test_a_failed_upload_fails_the_save(remote_root, monkeypatch):
    """An upload that fails stops the save: no commit, the previous checkpoint loads, nothing of the save is left."""
    url, m = saved(remote_root)
    before = sorted(store_for(url, remote_root.options).list(remote_root.url()))
    real_put = FsspecStore.put_file
    old_W = m.encoder.W.copy()
    calls = []

    def put_file(self, local, path):
        calls.append(path)
        if len(calls) == 2:  # the second of the four changed arrays
            raise StorageError("cannot write: refused", Location(path))
        return real_put(self, local, path)

    monkeypatch.setattr(FsspecStore, "put_file", put_file)
    for lin in (m.encoder, m.decoder):
        lin.W[...], lin.b[...] = 7, 7
    with pytest.raises(StorageError) as e:
        xser.save(m, url, storage_options=remote_root.options)
    assert str(e.value) == f"{calls[1]}: cannot write: refused" and len(calls) <= 4
    assert sorted(store_for(url, remote_root.options).list(remote_root.url())) == before
    assert np.array_equal(xser.load(url, storage_options=remote_root.options).encoder.W, old_W)
