"""xser: save machine-learning experiments the way XNMT did, and better.

Components are attrs classes built from YAML specs; each component that owns
parameters has one named subcollection; a saved model is one YAML spec plus a
data directory with one entry per subcollection.

The package is layered (``docs/design.md``): errors -> storage -> spec -> model ->
checkpoints -> api -> tools/interop -> cli; a module imports only from its own layer
or the ones below it.
"""

from ._version import __version__ as __version__
from .api import build as build
from .api import load as load
from .api import load_config as load_config
from .api import load_into as load_into
from .api import load_training_state as load_training_state
from .api import Best as Best
from .api import Resumed as Resumed
from .api import read_params as read_params
from .api import resume as resume
from .api import save as save
from .model.overrides import split_overrides as split_overrides
from .checkpoints.partial import PartialSaver as PartialSaver
from .checkpoints.policy import KeepBest as KeepBest
from .checkpoints.policy import KeepEvery as KeepEvery
from .checkpoints.policy import KeepLast as KeepLast
from .checkpoints.saver import CheckpointSaver as CheckpointSaver
from .checkpoints.saver import SaveReport as SaveReport
from .errors import CheckpointError as CheckpointError
from .errors import StorageError as StorageError
from .errors import DataError as DataError
from .errors import Location as Location
from .errors import RegistryError as RegistryError
from .errors import SpecError as SpecError
from .errors import XserError as XserError
from .interop import angel as _angel  # registers !AngelMatrix
from .interop import dismec as _dismec  # registers !DismecModel
from .interop import recis as _recis  # registers !RecisModel
from .interop import safetensors as _safetensors  # registers !SafetensorsWeights
from .tools.reader import CheckpointReader as CheckpointReader
from .model.build import Experiment as Experiment
from .model.build import ExperimentSpec as ExperimentSpec
from .model.params import Subcollection as Subcollection
from .model.tables import HashTable as HashTable
from .model.tables import IdSlice as IdSlice
from .model.params import params as params
from .model.resources import resources as resources
from .model.registry import serializable as serializable
from .storage.formats import register_format as register_format
from .storage.listing import Checkpoint as Checkpoint
from .storage.listing import checkpoints as checkpoints
from .tools.ensemble import Ensemble as Ensemble

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
