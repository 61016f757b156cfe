import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import components  # noqa: E402,F401  (registers the test components)


def _writable_first(method):
    """Tests tamper with published files on purpose; those are read-only (0444): make the one written writable."""
    import functools
    import stat

    @functools.wraps(method)
    def write(self, *args, **kwargs):
        try:
            mode = os.stat(self).st_mode
            if not mode & stat.S_IWUSR:
                os.chmod(self, mode | stat.S_IWUSR)
        except OSError:
            pass
        return method(self, *args, **kwargs)

    return write


import pathlib  # noqa: E402

pathlib.Path.write_text = _writable_first(pathlib.Path.write_text)
pathlib.Path.write_bytes = _writable_first(pathlib.Path.write_bytes)

from hypothesis import settings as _settings  # noqa: E402

#: `pytest --hypothesis-profile=fuzz`: the long fuzz run (tests/test_fuzz.py uses the profile's example count)
_settings.register_profile("fuzz", max_examples=5000)
_settings.register_profile("fuzz-mid", max_examples=1000)


def pytest_configure(config):
    config.addinivalue_line("markers", "campaign: a long stress campaign (minutes); run with `-m campaign`")


def pytest_collection_modifyitems(config, items):
    import pytest

    if "campaign" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="a long campaign: run with -m campaign")
    for item in items:
        if "campaign" in item.keywords:
            item.add_marker(skip)


# -- remote stores (issue 21): memory:// and S3 on a local moto server; no network, no credentials

import itertools as _itertools  # noqa: E402
import uuid as _uuid  # noqa: E402

import pytest as _pytest  # noqa: E402

_bucket_numbers = _itertools.count(1)


class MotoServer:
    """A moto S3 server on 127.0.0.1: ``endpoint`` and the ``options`` (fsspec storage_options) to reach it."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        # fake credentials go to s3fs through the options, never through os.environ
        self.options = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }

    def make_bucket(self, name: str | None = None) -> str:
        """A new empty bucket (a fresh name unless given); its name."""
        import fsspec

        name = name or f"xser-test-{next(_bucket_numbers)}-{_uuid.uuid4().hex[:8]}"
        fs = fsspec.filesystem("s3", **self.options)
        fs.call_s3("create_bucket", Bucket=name)
        return name


class RemoteRoot:
    """A fresh remote prefix for one test: ``url(name)`` gives a URL under it, ``options`` the storage_options."""

    def __init__(self, kind: str, prefix: str, options: dict) -> None:
        self.kind = kind
        self.prefix = prefix
        self.options = options

    def url(self, *names: str) -> str:
        return "/".join([self.prefix, *names])

    def __repr__(self) -> str:
        return f"RemoteRoot({self.prefix!r})"


@_pytest.fixture(scope="session")
def moto_server():
    """A moto S3 server for the whole session (skips when fsspec, s3fs or moto[server] is missing)."""
    _pytest.importorskip("fsspec")
    _pytest.importorskip("s3fs")
    _pytest.importorskip("moto.server")
    _pytest.importorskip("flask")
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield MotoServer(f"http://{host}:{port}")
    server.stop()


@_pytest.fixture
def s3_url(moto_server):
    """(url_prefix, storage_options): ``s3://<a fresh bucket>`` on the moto server."""
    return f"s3://{moto_server.make_bucket()}", dict(moto_server.options)


@_pytest.fixture
def memory_url():
    """A ``memory://`` prefix of this test alone, cleared afterwards."""
    fsspec = _pytest.importorskip("fsspec")
    prefix = f"memory://xser-test-{_uuid.uuid4().hex[:12]}"
    yield prefix
    fs = fsspec.filesystem("memory")
    try:
        fs.rm(fs._strip_protocol(prefix), recursive=True)
    except FileNotFoundError:
        pass


@_pytest.fixture(params=["memory", "s3"])
def remote_root(request):
    """A fresh remote prefix (``RemoteRoot``: ``.url(name)``, ``.options``), once on memory:// and once on S3."""
    if request.param == "memory":
        return RemoteRoot("memory", request.getfixturevalue("memory_url"), {})
    prefix, options = request.getfixturevalue("s3_url")
    return RemoteRoot("s3", prefix, options)
