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
