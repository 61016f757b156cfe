"""Byte stores: every verb of ``LocalStore`` and ``FsspecStore`` (file://, memory://, S3 on moto), their errors,
the request funnel (hook, retries, messages), conditional writes under races, ranged reads."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import threading
import time

import pytest

from xser.errors import DataError, StorageError
from xser.storage.stores import LOCAL, store_for
from xser.storage.stores.local import AlreadyExists

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _remote():
    pytest.importorskip("fsspec")
    from xser.storage.stores import remote

    return remote


# -- one store and a fresh root on it, per kind


@pytest.fixture(params=["local", "file", "memory", "s3"])
def where(request, tmp_path):
    """(store, root): a store and a fresh, empty root (a local path or a URL) to write under."""
    kind = request.param
    if kind == "local":
        return LOCAL, str(tmp_path / "root")
    if kind == "file":
        pytest.importorskip("fsspec")
        root = "file://" + str(tmp_path / "root")
        return store_for(root), root
    if kind == "memory":
        root = request.getfixturevalue("memory_url")
        return store_for(root), root
    root, options = request.getfixturevalue("s3_url")
    return store_for(root, options), root + "/root"


def test_put_read_size_exists(where):
    store, root = where
    a = store.join(root, "a.bin")
    assert not store.exists(a) and store.size(a) is None
    store.put(a, b"hello world")
    assert store.exists(a)
    assert store.size(a) == 11
    assert store.read_bytes(a, "spec") == b"hello world"
    store.put(a, b"replaced")  # a plain put replaces
    assert store.read_bytes(a, "spec") == b"replaced"
    store.put(store.join(root, "empty"), b"")
    assert store.read_bytes(store.join(root, "empty"), "spec") == b""
    assert store.size(store.join(root, "empty")) == 0


def test_put_create_only(where):
    store, root = where
    a = store.join(root, "d", "record")
    store.put(a, b"first", create_only=True)
    with pytest.raises(AlreadyExists) as e:
        store.put(a, b"second", create_only=True)
    assert str(e.value) == f"{a}: the object exists already (another writer was first)"
    assert isinstance(e.value, StorageError)
    assert store.read_bytes(a, "record") == b"first"


def test_open_read(where):
    store, root = where
    a = store.join(root, "m.npy")
    data = bytes(range(256)) * 4
    store.put(a, data)
    with store.open_read(a, "array") as f:
        assert f.size == 1024 and f.name == a
        assert f.read(10) == data[:10]
        assert f.tell() == 10
        assert f.seek(100) == 100
        buf = bytearray(50)
        assert f.readinto(buf) == 50 and bytes(buf) == data[100:150]
        assert f.seek(-4, 2) == 1020
        assert f.read() == data[1020:]
        assert f.read(5) == b""
        assert f.seek(10, 0) == 10 and f.seek(5, 1) == 15
        assert f.read(-1) == data[15:]
        if store.remote:
            with pytest.raises(io.UnsupportedOperation):
                f.fileno()
        else:
            assert os.pread(f.fileno(), 3, 0) == data[:3]


def test_missing_objects(where):
    store, root = where
    a = store.join(root, "nothing.yaml")
    with pytest.raises(DataError) as e:
        store.open_read(a, "spec")
    assert str(e.value) == f"{a}: spec not found"
    with pytest.raises(DataError) as e:
        store.read_bytes(a, "manifest")
    assert str(e.value) == f"{a}: manifest not found"
    assert store.list(a) == {}
    assert store.listdir(a) == []
    assert not store.isdir(a)
    store.delete([a])  # missing: no error
    store.delete_prefix(a)


def test_read_bytes_limit(where):
    store, root = where
    a = store.join(root, "big")
    store.put(a, b"x" * 100)
    assert store.read_bytes(a, "manifest", limit=100) == b"x" * 100
    with pytest.raises(DataError) as e:
        store.read_bytes(a, "manifest", limit=99)
    assert str(e.value) == f"{a}: manifest is larger than 99 bytes"


def test_read_range_and_ranges(where):
    store, root = where
    a = store.join(root, "r")
    data = bytes(range(200))
    store.put(a, data)
    assert store.read_range(a, 10, 20) == data[10:20]
    assert store.read_range(a, 5, 5) == b""
    assert store.read_ranges(a, [(0, 3), (50, 60), (7, 7), (190, 200)]) == [data[:3], data[50:60], b"", data[190:]]
    assert store.read_ranges(a, []) == []


def test_list_listdir_isdir(where):
    store, root = where
    run = store.join(root, "run")
    for name, n in [("a", 1), ("sub/b", 2), ("sub/deep/c", 3)]:
        store.put(store.join(run, name), b"x" * n)
    store.put(store.join(root, "run2", "z"), b"zz")  # a sibling with the same leading letters
    assert store.list(run) == {store.join(run, "a"): 1, store.join(run, "sub/b"): 2, store.join(run, "sub/deep/c"): 3}
    assert store.list(run + "/") == store.list(run) or not store.remote
    assert store.listdir(run) == ["a", "sub"]
    assert store.listdir(store.join(run, "sub")) == ["b", "deep"]
    assert store.isdir(run) and store.isdir(store.join(run, "sub"))
    assert not store.isdir(store.join(run, "a"))
    assert not store.isdir(store.join(root, "ru"))
    assert store.list(store.join(run, "a")) == {store.join(run, "a"): 1}


def test_put_file_open_write_copy(where, tmp_path):
    store, root = where
    local = tmp_path / "upload.bin"
    local.write_bytes(b"u" * 3000)
    up = store.join(root, "x", "up.bin")
    store.put_file(str(local), up)
    assert store.read_bytes(up, "array") == b"u" * 3000
    w = store.join(root, "x", "streamed.bin")
    with store.open_write(w) as f:
        f.write(b"abc")
        f.write(memoryview(b"def"))
    assert store.read_bytes(w, "array") == b"abcdef"
    c = store.join(root, "y", "copy.bin")
    store.copy(up, c)
    assert store.read_bytes(c, "array") == b"u" * 3000


def test_open_write_discarded_on_error(where):
    store, root = where
    if not store.remote:
        pytest.skip("a local writer leaves its file to the commit protocol above it")
    w = store.join(root, "half.bin")
    with pytest.raises(RuntimeError):
        with store.open_write(w) as f:
            f.write(b"partial")
            raise RuntimeError("boom")
    assert not store.exists(w)
    assert store.list(root) == {}


def test_delete_and_delete_prefix(where):
    store, root = where
    names = ["run/a", "run/s/b", "run2/c", "other"]
    for n in names:
        store.put(store.join(root, n), b"1")
    store.delete([store.join(root, "other"), store.join(root, "missing")])
    assert not store.exists(store.join(root, "other"))
    store.delete_prefix(store.join(root, "run"))
    assert store.list(root) == {store.join(root, "run2/c"): 1}
    assert not store.isdir(store.join(root, "run"))


def test_names(where):
    store, root = where
    assert store.join(root, "a", "b.npy") == root + "/a/b.npy"
    assert store.basename(store.join(root, "a", "b.npy")) == "b.npy"
    assert store.parent(store.join(root, "a", "b.npy")) == store.join(root, "a")
    if store.remote:
        assert store.join("s3://b/run", "x") == "s3://b/run/x"
        assert store.join("s3://b/run/", "x") == "s3://b/run/x"
        assert store.join("memory://", "x") == "memory://x"
        assert store.parent("s3://b/run/x") == "s3://b/run"
        assert store.parent("s3://b") == "s3://"


def test_local_path_and_flags(where, tmp_path):
    store, root = where
    kind = store.scheme or "local"
    assert store.remote == (kind != "local")
    assert store.conditional is True
    if kind == "local":
        assert store.local_path(root) == root
    elif kind == "file":
        assert store.local_path(root + "/x") == str(tmp_path / "root" / "x")
    else:
        assert store.local_path(root + "/x") is None


def test_file_url_writes_to_that_path(tmp_path):
    pytest.importorskip("fsspec")
    url = "file://" + str(tmp_path / "d" / "f.txt")
    store_for(url).put(url, b"on disk")
    assert (tmp_path / "d" / "f.txt").read_bytes() == b"on disk"


# -- conditional writes under a race


@pytest.mark.parametrize("kind", ["local", "file", "memory", "s3"])
def test_create_only_race(kind, request, tmp_path, monkeypatch):
    if kind == "local":
        store, key = LOCAL, str(tmp_path / "record")
    elif kind == "file":
        pytest.importorskip("fsspec")
        key = "file://" + str(tmp_path / "record")
        store = store_for(key)
    elif kind == "memory":
        key = request.getfixturevalue("memory_url") + "/record"
        store = store_for(key)
        real_exists = store.fs.exists

        def slow_exists(path, **kwargs):  # widens the window between a check and a write
            out = real_exists(path, **kwargs)
            time.sleep(0.01)
            return out

        monkeypatch.setattr(store.fs, "exists", slow_exists)
    else:
        prefix, options = request.getfixturevalue("s3_url")
        key = prefix + "/record"
        store = store_for(key, options)
    assert store.conditional
    barrier = threading.Barrier(8)
    won, lost, other = [], [], []

    def attempt(i):
        barrier.wait()
        try:
            store.put(key, b"writer %d" % i, create_only=True)
            won.append(i)
        except AlreadyExists:
            lost.append(i)
        except Exception as e:  # pragma: no cover - shown in the assert below
            other.append(e)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert other == []
    assert len(won) == 1 and len(lost) == 7
    assert store.read_bytes(key, "record") == b"writer %d" % won[0]


# -- choosing a store, and its errors


def test_local_path_with_storage_options(tmp_path):
    with pytest.raises(StorageError) as e:
        store_for(str(tmp_path / "m.yaml"), {"anon": True})
    assert str(e.value) == f"{tmp_path / 'm.yaml'}: storage_options apply to URLs (s3://, gs://, ...), not to a local path"


def test_store_is_cached_per_scheme_and_options():
    pytest.importorskip("fsspec")
    assert store_for("memory://a") is store_for("memory://b/c")
    assert store_for("file:///tmp/x") is not store_for("file:///tmp/x", {"auto_mkdir": False})
    assert store_for("memory://a").scheme == "memory"


def test_unknown_scheme(tmp_path, monkeypatch):
    pytest.importorskip("fsspec")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError) as e:
        store_for("foo://bucket/run/model.yaml")
    assert str(e.value) == "foo://bucket/run/model.yaml: unknown storage scheme 'foo://' (fsspec knows no such protocol)"
    assert os.listdir(tmp_path) == []  # never a local folder named after the scheme


def _forget(monkeypatch, protocol):
    remote = _remote()
    import fsspec.registry  # noqa: F401

    monkeypatch.setattr(remote, "_STORES", {})
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, protocol, raising=False)


@pytest.mark.parametrize(
    ("url", "hide", "message"),
    [
        ("s3://b/k", ["s3fs"], "s3:// URLs need the package 's3fs', which is not installed: pip install 'xser[remote]'"),
        ("gs://b/k", ["gcsfs"], "gs:// URLs need the package 'gcsfs', which is not installed: pip install 'xser[remote]' gcsfs"),
        (
            "hdfs://namenode/k",
            ["pyarrow", "fsspec.implementations.arrow"],
            "hdfs:// URLs need the package 'pyarrow', which is not installed: pip install 'xser[remote]' pyarrow",
        ),
    ],
)
def test_missing_package(url, hide, message, monkeypatch, tmp_path):
    _forget(monkeypatch, url.split(":")[0])
    monkeypatch.setitem(sys.modules, hide[0], None)
    for module in hide[1:]:
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError) as e:
        store_for(url)
    assert str(e.value) == f"{url}: {message}"
    assert os.listdir(tmp_path) == []


def test_missing_fsspec(monkeypatch):
    remote = _remote()
    monkeypatch.setattr(remote, "_STORES", {})
    monkeypatch.setitem(sys.modules, "fsspec", None)
    monkeypatch.setitem(sys.modules, "fsspec.registry", None)
    with pytest.raises(StorageError) as e:
        store_for("memory://x/m.yaml")
    assert str(e.value) == "memory://x/m.yaml: memory:// URLs need fsspec: pip install 'xser[remote]'"


def test_import_xser_imports_no_fsspec():
    code = (
        "import sys, xser\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fsspec', 's3fs', 'botocore', 'aiobotocore', 'gcsfs')))"
    )
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


# -- S3 errors on moto


def test_missing_bucket(moto_server):
    store = store_for("s3://no-such-bucket/x", moto_server.options)
    for call, op in [
        (lambda: store.put("s3://no-such-bucket/run/x", b"1"), "write"),
        (lambda: store.read_bytes("s3://no-such-bucket/run/x", "spec"), "read"),
        (lambda: store.open_read("s3://no-such-bucket/run/x", "spec"), "read"),
        (lambda: store.list("s3://no-such-bucket/run/x"), "list"),
    ]:
        with pytest.raises(StorageError) as e:
            call()
        assert str(e.value) == f"s3://no-such-bucket/run/x: cannot {op}: bucket 'no-such-bucket' does not exist"


def test_missing_credentials(moto_server, monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    bucket = moto_server.make_bucket()
    options = {"client_kwargs": {"endpoint_url": moto_server.endpoint, "region_name": "us-east-1"}, "skip_instance_cache": True}
    store = store_for(f"s3://{bucket}/x", options)
    with pytest.raises(StorageError) as e:
        store.read_bytes(f"s3://{bucket}/x", "spec")
    assert str(e.value) == (
        f"s3://{bucket}/x: cannot read: no credentials found for s3:// (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
        "a profile, or pass storage_options={'anon': True} for public buckets)"
    )


def test_s3_conditional_put_is_if_none_match(s3_url):
    """moto honours If-None-Match: the second create_only PUT gets 412, not a silent overwrite."""
    prefix, options = s3_url
    store = store_for(prefix, options)
    assert store.conditional
    seen = []
    real = store.fs.pipe_file

    def pipe_file(path, data, **kwargs):
        seen.append(kwargs)
        return real(path, data, **kwargs)

    store.fs.pipe_file = pipe_file
    try:
        store.put(prefix + "/c", b"1", create_only=True)
        with pytest.raises(AlreadyExists):
            store.put(prefix + "/c", b"2", create_only=True)
    finally:
        del store.fs.pipe_file
    assert seen == [{"mode": "create"}, {"mode": "create"}]
    assert store.read_bytes(prefix + "/c", "record") == b"1"


# -- the funnel: hook, retries, messages (a fake filesystem over memory://)


class FakeFS:
    """A memory filesystem whose methods fail as told: ``fail[name] = [exc, exc, ...]`` raised in turn."""

    def __init__(self):
        import fsspec

        self._fs = fsspec.filesystem("memory")
        self.fail: dict[str, list[BaseException]] = {}
        self.calls: list[str] = []
        self.bytes_read = 0

    def __getattr__(self, name):
        real = getattr(self._fs, name)
        if name.startswith("_") or not callable(real):
            return real

        def call(*args, **kwargs):
            self.calls.append(name)
            pending = self.fail.get(name)
            if pending:
                raise pending.pop(0)
            out = real(*args, **kwargs)
            if name == "cat_file":
                self.bytes_read += len(out)
            return out

        return call


@pytest.fixture
def fake(memory_url, monkeypatch):
    remote = _remote()
    monkeypatch.setattr(remote, "BACKOFF", 0.0)
    fs = FakeFS()
    return remote.FsspecStore(fs, "memory"), fs, memory_url


class SlowDown(Exception):
    def __init__(self):
        super().__init__("An error occurred (SlowDown) when calling the PutObject operation: Please reduce your request rate.")
        self.response = {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}


def _reset():
    return ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")


def test_transient_errors_are_retried(fake, monkeypatch):
    store, fs, root = fake
    ops = []
    monkeypatch.setattr(type(store), "on_request", lambda op, url: ops.append((op, url)))
    fs.fail["pipe_file"] = [SlowDown(), TimeoutError("timed out"), _reset()]
    store.put(root + "/a", b"data")
    assert ops == [("write", root + "/a")] * 4
    fs.fail["cat_file"] = [OSError(errno.ETIMEDOUT, "Connection timed out")]
    assert store.read_bytes(root + "/a", "spec") == b"data"


def test_transient_errors_give_up(fake):
    store, fs, root = fake
    fs._fs.pipe_file(fs._fs._strip_protocol(root + "/a"), b"data")
    fs.fail["cat_file"] = [_reset() for _ in range(4)]
    with pytest.raises(StorageError) as e:
        store.read_bytes(root + "/a", "spec")
    assert str(e.value) == f"{root}/a: cannot read: failed after 4 attempts: Connection reset by peer"
    assert fs.calls.count("cat_file") == 4


class S3Error(Exception):
    def __init__(self, code: str, status: int, text: str):
        super().__init__(f"An error occurred ({code}) when calling the PutObject operation: {text}")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


def test_a_conditional_conflict_is_retried_and_501_is_not(fake):
    """S3 answers concurrent conditional PUTs with 409 ConditionalRequestConflict, to be retried; 501 Not Implemented (a
    server without the feature) is an answer, not a hiccup."""
    store, fs, root = fake
    fs.fail["pipe_file"] = [S3Error("ConditionalRequestConflict", 409, "A conflicting conditional operation is in progress")]
    store.put(root + "/a", b"data")
    assert fs.calls.count("pipe_file") == 2
    fs.fail["pipe_file"] = [S3Error("NotImplemented", 501, "A header you provided implies functionality that is not implemented")]
    with pytest.raises(StorageError) as e:
        store.put(root + "/b", b"x")
    assert str(e.value) == (f"{root}/b: cannot write: An error occurred (NotImplemented) when calling the PutObject "
                            "operation: A header you provided implies functionality that is not implemented")
    assert fs.calls.count("pipe_file") == 3


def test_other_errors_are_not_retried(fake):
    store, fs, root = fake
    fs.fail["pipe_file"] = [OSError(errno.EINVAL, "Invalid argument")]
    with pytest.raises(StorageError) as e:
        store.put(root + "/a", b"x")
    assert str(e.value) == f"{root}/a: cannot write: Invalid argument"
    assert fs.calls.count("pipe_file") == 1


def test_access_denied(fake):
    store, fs, root = fake
    fs.fail["find"] = [PermissionError(errno.EACCES, "Access Denied")]
    with pytest.raises(StorageError) as e:
        store.list(root + "/run")
    assert str(e.value) == f"{root}/run: cannot list: access denied (Access Denied)"
    assert fs.calls.count("find") == 1


def test_hook_can_stop_a_request(fake, monkeypatch):
    """The kill tests stop the process at the n-th request: the hook runs before the request is made."""
    store, fs, root = fake

    class Killed(BaseException):
        pass

    def hook(op, url):
        raise Killed(op)

    monkeypatch.setattr(type(store), "on_request", hook)
    with pytest.raises(Killed):
        store.put(root + "/a", b"x")
    assert fs.calls == []


def test_every_request_passes_the_funnel(fake, monkeypatch, tmp_path):
    """Every call into the filesystem happens inside ``_call``, which has called the hook first."""
    remote = _remote()
    store, fs, root = fake
    ops = []
    inside = []
    real_call = remote.FsspecStore._call

    def counting_call(self, op, url, fn, *args, **kwargs):
        def inner(*a, **k):
            inside.append(True)
            try:
                return fn(*a, **k)
            finally:
                inside.pop()

        return real_call(self, op, url, inner, *args, **kwargs)

    monkeypatch.setattr(remote.FsspecStore, "_call", counting_call)
    monkeypatch.setattr(remote.FsspecStore, "on_request", lambda op, url: ops.append(op))
    outside = []
    real_getattr = FakeFS.__getattr__

    def guarded(self, name):
        attr = real_getattr(self, name)
        if callable(attr) and not name.startswith("_"):

            def check(*a, **k):
                if not inside:
                    outside.append(name)
                return attr(*a, **k)

            return check
        return attr

    monkeypatch.setattr(FakeFS, "__getattr__", guarded)
    local = tmp_path / "f"
    local.write_bytes(b"12345")
    a, b = root + "/r/a", root + "/r/b"
    store.put(a, b"abcdef", create_only=True)
    store.put_file(str(local), b)
    with store.open_read(a, "x") as f:
        f.read(2)
        f.read(2)
    store.read_bytes(a, "x", limit=10)
    store.read_range(a, 0, 1)
    store.read_ranges(a, [(0, 1), (2, 3)])
    store.size(a), store.exists(a), store.isdir(root + "/r"), store.list(root), store.listdir(root + "/r")
    store.copy(a, root + "/r/c")
    store.delete([b])
    store.delete_prefix(root + "/r")
    assert outside == []
    assert ops == [
        "write", "write",
        "read", "read", "read",
        "read",  # read_bytes with a limit: one GET of at most limit + 1 bytes
        "read", "read",
        "stat", "stat", "list", "list", "list",
        "copy", "delete",
        "list", "delete", "delete", "delete",
    ]  # fmt: skip


# -- ranged reads


def _count_cat(monkeypatch, store):
    got = []
    real = store.fs.cat_file

    def cat_file(path, start=None, end=None, **kwargs):
        out = real(path, start=start, end=end, **kwargs)
        got.append((start, end, len(out)))
        return out

    monkeypatch.setattr(store.fs, "cat_file", cat_file)
    return got


def test_remote_file_reads_only_what_is_asked(remote_root, monkeypatch):
    """Reading 1% of a 1 MiB object's bytes transfers exactly that 1%: no read-ahead."""
    store = store_for(remote_root.url(), remote_root.options)
    url = remote_root.url("m.npy")
    data = os.urandom(2**20)
    store.put(url, data)
    got = _count_cat(monkeypatch, store)
    rows = 2**20 // 100
    with store.open_read(url, "array") as f:
        f.seek(500_000)
        assert f.read(rows) == data[500_000 : 500_000 + rows]
        buf = bytearray(16)
        f.seek(0)
        assert f.readinto(buf) == 16 and bytes(buf) == data[:16]
    assert got == [(500_000, 500_000 + rows, rows), (0, 16, 16)]
    assert sum(n for _, _, n in got) == rows + 16


def test_remote_objects_on_s3_and_memory(remote_root):
    """The fixtures the save/load tests use: a fresh prefix, URLs under it, options that reach it."""
    store = store_for(remote_root.url("m.yaml"), remote_root.options)
    assert store.list(remote_root.url()) == {}
    store.put(remote_root.url("m.yaml"), b"spec")
    assert store.list(remote_root.url()) == {remote_root.url("m.yaml"): 4}
    assert store.scheme == remote_root.kind


# -- large objects on S3: parallel parts, streamed multipart writes


def test_s3_multipart_put_file_and_streamed_write(s3_url, monkeypatch, tmp_path):
    """Objects larger than a part go up in parts (put_file: PART_SIZE parts, in parallel; open_write: one
    block at a time), and a streamed write that fails leaves no object and no pending upload."""
    remote = _remote()
    prefix, options = s3_url
    monkeypatch.setattr(remote, "PART_SIZE", 5 * 2**20)  # S3's smallest part
    store = store_for(prefix, dict(options, default_block_size=5 * 2**20))
    data = os.urandom(11 * 2**20)
    local = tmp_path / "big.npy"
    local.write_bytes(data)
    calls = []
    real = store.fs._call_s3

    async def call_s3(method, *args, **kwargs):
        calls.append(method)
        return await real(method, *args, **kwargs)

    def sync_call_s3(method, *args, **kwargs):  # what s3fs's file objects call
        calls.append(method)
        return real_sync(method, *args, **kwargs)

    real_sync = store.fs.call_s3
    monkeypatch.setattr(store.fs, "_call_s3", call_s3)
    monkeypatch.setattr(store.fs, "call_s3", sync_call_s3)
    store.put_file(str(local), prefix + "/big.npy")
    assert store.read_bytes(prefix + "/big.npy", "array") == data
    with store.open_write(prefix + "/streamed.npy") as f:
        for i in range(0, len(data), 2**20):
            f.write(data[i : i + 2**20])
    assert store.read_bytes(prefix + "/streamed.npy", "array") == data
    with pytest.raises(RuntimeError):
        with store.open_write(prefix + "/failed.npy") as f:
            f.write(data)  # more than a block: a multipart upload is under way
            raise RuntimeError("boom")
    assert not store.exists(prefix + "/failed.npy")
    assert calls.count("upload_part") == 3 + 3 + 1  # 11 MiB in 5 MiB parts, twice; the failed one sent one
    assert calls.count("complete_multipart_upload") == 2 and calls.count("abort_multipart_upload") == 1
    listed = real_sync("list_multipart_uploads", Bucket=prefix[len("s3://") :])
    assert listed.get("Uploads", []) == []


def test_unclosed_writer_publishes_nothing(remote_root):
    import gc

    store = store_for(remote_root.url(), remote_root.options)
    f = store.open_write(remote_root.url("dropped"))
    f.write(b"never closed")
    del f
    gc.collect()
    assert not store.exists(remote_root.url("dropped"))


def test_create_only_retry_after_a_lost_reply(memory_url, monkeypatch):
    """A conditional PUT that reached the store but whose reply was lost is retried, finds the object, and
    succeeds when the object holds its own bytes; another writer's bytes are still ``AlreadyExists``."""
    remote = _remote()
    monkeypatch.setattr(remote, "BACKOFF", 0.0)
    fs = FakeFS()
    store = remote.FsspecStore(fs, "s3")  # an S3-like store over memory: pipe_file(mode="create") is native
    real = fs._fs.pipe_file

    def lost_reply(path, data, **kwargs):
        real(path, data, **kwargs)
        raise _reset()

    fs.fail["pipe_file"] = []
    monkeypatch.setattr(fs._fs, "pipe_file", lost_reply)
    store.put(memory_url + "/record", b"mine", create_only=True)
    assert store.read_bytes(memory_url + "/record", "record") == b"mine"
    monkeypatch.setattr(fs._fs, "pipe_file", real)
    with pytest.raises(AlreadyExists):
        store.put(memory_url + "/record", b"mine", create_only=True)  # first try: another writer's, whatever it holds
    real(fs._fs._strip_protocol(memory_url + "/other"), b"theirs")
    failed = []

    def reset_once(path, data, **kwargs):  # the first try fails before reaching the store
        if not failed:
            failed.append(path)
            raise _reset()
        return real(path, data, **kwargs)

    monkeypatch.setattr(fs._fs, "pipe_file", reset_once)
    with pytest.raises(AlreadyExists):  # retried, finds another writer's bytes
        store.put(memory_url + "/other", b"mine", create_only=True)
