"""The public surface is explicit and pinned."""

import xser


def test_public_names():
    """dir(xser) is exactly the documented API (plus module attributes)."""
    public = {n for n in dir(xser) if not n.startswith("_")}
    assert public - set(xser.__all__) <= {
        "api", "average", "build", "checkpointing", "commit", "convert", "ensemble", "errors", "formats", "interop", "params", "partial", "registry", "spec", "store", "serialize", "refs", "typecheck", "formats", "inspect", "cli", "demo",
    }
    assert sorted(xser.__all__) == [
        "Checkpoint", "CheckpointError", "CheckpointSaver", "DataError", "Ensemble", "Experiment", "ExperimentSpec", "KeepBest",
        "KeepEvery", "KeepLast", "Location", "PartialSaver", "RegistryError", "SaveReport", "SpecError", "Subcollection", "XserError",
        "__version__", "build", "checkpoints", "load", "load_config", "load_training_state", "params", "read_params",
        "register_format", "save", "serializable",
    ]
    assert xser.__all__ == sorted(xser.__all__)
