"""The public surface is explicit and pinned."""

import xser


def test_public_names():
    """dir(xser) is exactly the documented API (plus module attributes)."""
    import xser.cli  # noqa: F401  (every submodule the CLI imports is an attribute then, whatever ran before)
    import xser.tools.inspect  # noqa: F401

    public = {n for n in dir(xser) if not n.startswith("_")}
    assert public - set(xser.__all__) <= {
        "api", "checkpoints", "errors", "interop", "model", "spec", "storage", "tools", "cli", "demo", "torch", "lightning", "dist",
    }
    assert sorted(xser.__all__, key=str.lower) == sorted([
        "Best", "Checkpoint", "CheckpointError", "CheckpointReader", "CheckpointSaver", "DataError", "Ensemble", "Experiment", "ExperimentSpec", "HashTable",
        "IdSlice", "KeepBest",
        "KeepEvery", "KeepLast", "Location", "PartialSaver", "RegistryError", "SaveReport", "SpecError", "StorageError", "Subcollection", "XserError",
        "__version__", "build", "checkpoints", "load", "load_config", "load_into", "load_training_state", "params", "read_params",
        "register_format", "resources", "Resumed", "resume", "save", "serializable", "split_overrides",
    ], key=str.lower)
    assert xser.__all__ == sorted(xser.__all__, key=str.lower)


def test_every_subpackage_is_packaged():
    """pyproject.toml lists every package under xser/ (a missing one breaks `pip install .`)."""
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
        listed = set(re.search(r"packages = \[(.*?)\]", f.read()).group(1).replace('"', "").replace(" ", "").split(","))
    found = {
        os.path.relpath(d, root).replace(os.sep, ".")
        for d, _, files in os.walk(os.path.join(root, "xser"))
        if "__init__.py" in files
    }
    assert found <= listed, sorted(found - listed)


def test_sdist_carries_its_tests(tmp_path):
    """The source distribution holds every file the tests use (helpers, data), the LICENSE and the scripts."""
    import os
    import subprocess
    import sys
    import tarfile

    import pytest

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isdir(os.path.join(root, ".git")):
        pytest.skip("runs in a git checkout (it compares with the tracked files)")
    from importlib.metadata import version

    if int(version("setuptools").split(".")[0]) < 77:
        pytest.skip("building needs setuptools >= 77 (pyproject's build-system), as pip's isolated builds get")
    tracked = subprocess.run(["git", "ls-files", "tests", "scripts", "configs", "docs", "LICENSE", "CHANGELOG.md"], cwd=root,
                             capture_output=True, text=True, check=True).stdout.split()
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path)!r}))"
    name = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True).stdout.split()[-1]
    with tarfile.open(tmp_path / name) as tar:
        inside = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert sorted(set(tracked) - inside) == []
    assert "xser/py.typed" in inside


def test_changelog_names_this_version():
    """CHANGELOG.md's newest entry is the version the package says it is (a release without its entry fails)."""
    import os
    import re

    import xser

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "CHANGELOG.md"), encoding="utf-8") as f:
        versions = re.findall(r"^## (\S+)", f.read(), re.M)
    assert versions[0] == xser.__version__ == "0.5.1"
    assert len(versions) == len(set(versions))
