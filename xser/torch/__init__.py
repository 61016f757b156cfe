"""PyTorch support (``pip install 'xser[torch]'``): ``torch.nn.Module`` components, tensors in
training state, flat state-dict views of saved models. Imports torch; ``import xser`` never imports
this package (``@xser.serializable`` on an ``nn.Module`` subclass imports it when torch is already
imported). Layer: beside ``tools`` and ``interop``; imports the layers below it only.
"""

from __future__ import annotations

from .module import TorchAdapter, TorchSubcollection, own_state
from .tensors import from_numpy, numpy_dtype, to_numpy, torch_dtype
from .views import load_state_dict, state_dict
from .wrapped import TorchModule, allow, wrap

__all__ = [
    "TorchAdapter", "TorchModule", "TorchSubcollection", "allow", "from_numpy", "load_state_dict", "numpy_dtype", "own_state",
    "state_dict", "to_numpy", "torch_dtype", "wrap",
]
