"""xser: save machine-learning experiments the way XNMT did, and better.

Components are attrs classes built from YAML specs; each component that owns
parameters has one named subcollection; a saved model is one YAML spec plus a
data directory with one entry per subcollection.

The package is layered (``docs/design.md``): errors -> storage -> spec -> model ->
checkpoints -> api -> tools/interop -> cli; a module imports only from its own layer
or the ones below it.

``import xser`` imports nothing but this file and ``_version``: each public name is imported
on first use (PEP 562 ``__getattr__``), so a process that only reads a few arrays never
imports the YAML parser, the save machinery, the tools or the interop codecs. The interop
components (``!AngelMatrix``, ``!DismecModel``, ``!RecisModel``, ``!SafetensorsWeights``,
``!Ensemble``) register when a spec names them (``model/adapters.py``, ``PLUGIN_TAGS``).
"""

import importlib as _importlib
import typing as _typing

from ._version import __version__ as __version__

if _typing.TYPE_CHECKING:  # what type checkers and IDEs see; at run time each name is imported on first use
    from .api import Resumed as Resumed
    from .api import build as build
    from .api import load as load
    from .api import load_config as load_config
    from .api import load_into as load_into
    from .api import load_training_state as load_training_state
    from .api import read_params as read_params
    from .api import resume as resume
    from .api import save as save
    from .checkpoints.partial import PartialSaver as PartialSaver
    from .checkpoints.policy import KeepBest as KeepBest
    from .checkpoints.policy import KeepEvery as KeepEvery
    from .checkpoints.policy import KeepLast as KeepLast
    from .checkpoints.saver import CheckpointSaver as CheckpointSaver
    from .checkpoints.saver import SaveReport as SaveReport
    from .errors import CheckpointError as CheckpointError
    from .errors import DataError as DataError
    from .errors import Location as Location
    from .errors import RegistryError as RegistryError
    from .errors import SpecError as SpecError
    from .errors import StorageError as StorageError
    from .errors import XserError as XserError
    from .model.build import Experiment as Experiment
    from .model.build import ExperimentSpec as ExperimentSpec
    from .model.overrides import split_overrides as split_overrides
    from .model.params import Subcollection as Subcollection
    from .model.params import params as params
    from .model.registry import serializable as serializable
    from .model.resources import resources as resources
    from .model.tables import HashTable as HashTable
    from .model.tables import IdSlice as IdSlice
    from .storage.formats import register_format as register_format
    from .storage.listing import Checkpoint as Checkpoint
    from .storage.scanned import Best as Best
    from .storage.listing import checkpoints as checkpoints
    from .tools.ensemble import Ensemble as Ensemble
    from .tools.reader import CheckpointReader as CheckpointReader

from . import checkpoints as _checkpoints_package  # noqa: F401  (loaded now, see below)

# ``xser.checkpoints`` is the function (``storage.listing.checkpoints``), not the package of that name: the package is
# loaded above (its ``__init__`` is a docstring), so importing it later never binds its name here again; its binding
# is dropped so that ``__getattr__`` gives the function.
globals().pop("checkpoints", None)

#: public name -> the module that defines it (imported on first use)
_WHERE = {
    "Best": "storage.scanned", "Resumed": "api", "build": "api", "load": "api", "load_config": "api", "load_into": "api",
    "load_training_state": "api", "read_params": "api", "resume": "api", "save": "api",
    "PartialSaver": "checkpoints.partial", "KeepBest": "checkpoints.policy", "KeepEvery": "checkpoints.policy",
    "KeepLast": "checkpoints.policy", "CheckpointSaver": "checkpoints.saver", "SaveReport": "checkpoints.saver",
    "CheckpointError": "errors", "DataError": "errors", "Location": "errors", "RegistryError": "errors",
    "SpecError": "errors", "StorageError": "errors", "XserError": "errors",
    "Experiment": "model.build", "ExperimentSpec": "model.build", "split_overrides": "model.overrides",
    "Subcollection": "model.params", "params": "model.params", "serializable": "model.registry",
    "resources": "model.resources", "HashTable": "model.tables", "IdSlice": "model.tables",
    "register_format": "storage.formats", "Checkpoint": "storage.listing", "checkpoints": "storage.listing",
    "Ensemble": "tools.ensemble", "CheckpointReader": "tools.reader",
}
#: subpackages reachable as attributes of ``xser`` without importing them first (``xser.dist.rows``)
_SUBMODULES = frozenset({"api", "checkpoints", "dist", "errors", "interop", "model", "spec", "storage", "tools"})


def __getattr__(name: str) -> _typing.Any:
    where = _WHERE.get(name)
    if where is not None:
        value = getattr(_importlib.import_module(f"{__name__}.{where}"), name)
        globals()[name] = value  # the next access is a plain lookup
        return value
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "__version__",
    "Best",
    "build",
    "Checkpoint",
    "CheckpointError",
    "CheckpointReader",
    "checkpoints",
    "CheckpointSaver",
    "DataError",
    "Ensemble",
    "Experiment",
    "ExperimentSpec",
    "HashTable",
    "IdSlice",
    "KeepBest",
    "KeepEvery",
    "KeepLast",
    "load",
    "load_config",
    "load_into",
    "load_training_state",
    "Location",
    "params",
    "PartialSaver",
    "read_params",
    "register_format",
    "RegistryError",
    "resources",
    "resume",
    "Resumed",
    "save",
    "SaveReport",
    "serializable",
    "SpecError",
    "split_overrides",
    "StorageError",
    "Subcollection",
    "XserError",
]
