"""xser: save machine-learning experiments the way XNMT did, and better.

Components are attrs classes built from YAML specs; each component that owns
parameters has one named subcollection; a saved model is one YAML spec plus a
data directory with one entry per subcollection.
"""

from ._version import __version__ as __version__
from .api import load as load
from .api import load_config as load_config
from .api import read_params as read_params
from .api import save as save
from .build import Experiment as Experiment
from .checkpointing import Checkpoint as Checkpoint
from .checkpointing import CheckpointSaver as CheckpointSaver
from .checkpointing import KeepBest as KeepBest
from .checkpointing import KeepEvery as KeepEvery
from .checkpointing import KeepLast as KeepLast
from .checkpointing import SaveReport as SaveReport
from .checkpointing import checkpoints as checkpoints
from .checkpointing import load_training_state as load_training_state
from .build import ExperimentSpec as ExperimentSpec
from .build import build as build
from .ensemble import Ensemble as Ensemble
from .interop import angel as _angel  # registers !AngelMatrix
from .interop import dismec as _dismec  # registers !DismecModel
from .errors import CheckpointError as CheckpointError
from .errors import DataError as DataError
from .errors import Location as Location
from .errors import RegistryError as RegistryError
from .errors import SpecError as SpecError
from .errors import XserError as XserError
from .formats import register_format as register_format
from .params import Subcollection as Subcollection
from .partial import PartialSaver as PartialSaver
from .params import params as params
from .registry import serializable as serializable

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointSaver",
    "DataError",
    "Ensemble",
    "Experiment",
    "ExperimentSpec",
    "KeepBest",
    "KeepEvery",
    "KeepLast",
    "Location",
    "PartialSaver",
    "RegistryError",
    "SaveReport",
    "SpecError",
    "Subcollection",
    "XserError",
    "__version__",
    "build",
    "checkpoints",
    "load",
    "load_config",
    "load_training_state",
    "params",
    "read_params",
    "register_format",
    "save",
    "serializable",
]
