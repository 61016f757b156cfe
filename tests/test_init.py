"""The public surface is explicit and pinned."""

import xser


def test_public_names():
    """dir(xser) is exactly the documented API (plus module attributes)."""
    public = {n for n in dir(xser) if not n.startswith("_")}
    assert public - set(xser.__all__) <= {
        "api", "build", "errors", "params", "registry", "spec", "store", "serialize", "refs", "typecheck", "formats", "inspect", "cli", "demo",
    }
    assert sorted(xser.__all__) == [
        "CheckpointError", "DataError", "Experiment", "ExperimentSpec", "Location", "RegistryError", "SpecError",
        "Subcollection", "XserError", "__version__", "build", "load", "load_config", "params", "read_params", "save",
        "serializable",
    ]
    assert xser.__all__ == sorted(xser.__all__)
