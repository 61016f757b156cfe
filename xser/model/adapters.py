"""Component adapters: how classes of another framework (a ``torch.nn.Module``) become components.

The model layer knows numpy arrays only. An adapter tells it, for the classes it matches, what to
do before attrs builds the class (``prepare``), after a component's constructor returns
(``after_init``: the torch adapter fills the module's tensors from disk there) and which
subcollection class holds the component's state. Adapters live in optional subpackages that
register themselves when imported (``xser.torch``); ``adapter_for`` imports the torch one when it
meets a subclass of ``torch.nn.Module`` and torch is already imported by the caller, so
``import xser`` never imports torch and users never import ``xser.torch`` just to decorate a class.
"""

from __future__ import annotations

import contextvars
import importlib
import sys
from typing import Any, Protocol

__all__ = ["ADAPTERS", "LOAD", "PLUGIN_TAGS", "Adapter", "adapter_for", "array_kind", "plugin", "plugin_tag", "unsaved_hint"]


class Adapter(Protocol):
    #: extra arguments of ``attrs.define`` for the classes it matches
    define: dict

    def matches(self, cls: type) -> bool: ...

    def prepare(self, cls: type) -> None: ...

    def after_init(self, obj: Any) -> None: ...

    def subcollection(self, name: str, owner: Any, source: Any, rng: Any) -> Any: ...


ADAPTERS: list[Adapter] = []

#: Options of the load being built (``device``, ``mmap``) for adapters that place arrays themselves.
LOAD: contextvars.ContextVar[dict | None] = contextvars.ContextVar("xser_load", default=None)

#: (module that must already be imported, class path within it, the xser plugin that adapts it)
_PLUGINS = (("torch", "nn.Module", "xser.torch"),)
#: component tags that modules above this layer register: a spec that names one imports its module (``import xser``
#: imports none of them)
PLUGIN_TAGS = {"!TorchModule": "xser.torch", "!AngelMatrix": "xser.interop.angel", "!DismecModel": "xser.interop.dismec",
               "!RecisModel": "xser.interop.recis", "!SafetensorsWeights": "xser.interop.safetensors",
               "!Ensemble": "xser.tools.ensemble"}
#: what to do with an object of a plugin's framework that is not a component
_UNSAVED = {
    "xser.torch": "a torch.nn.Module is saved when its class is @xser.serializable; for a module of another class (a "
                  "torch.nn layer, a transformers model) use xser.torch.wrap(module), or xser.torch.wrap(module, *args, **kwargs) "
                  "with the arguments it was made with",
}


def plugin_tag(tag: str) -> bool:
    """Import the plugin that registers ``tag`` (``!TorchModule``), if one does; whether one was imported."""
    name = PLUGIN_TAGS.get(tag)
    if name is None:
        return False
    try:
        plugin(name)
    except ImportError:
        return False
    return True


def unsaved_hint(value: Any) -> str:
    """How to save ``value``, an object of a framework a plugin adapts (a ``torch.nn.Module``); "" otherwise."""
    for module, attr, name in _PLUGINS:
        base: Any = sys.modules.get(module)
        for part in attr.split(".") if base is not None else ():
            base = getattr(base, part, None)
        if isinstance(base, type) and isinstance(value, base):
            return _UNSAVED.get(name, "")
    return ""


def plugin(name: str) -> Any:
    """Import an xser plugin (``xser.torch``) by name: the one place the lower layers reach an optional one."""
    return importlib.import_module(name)


def array_kind(name: str) -> Any:
    """The training-state array kind ``name`` (``"torch"``), importing its plugin if needed; None if unknown."""
    from ..storage.training_state import KINDS

    if name not in KINDS:
        for _, _, plugin_name in _PLUGINS:
            if plugin_name == f"xser.{name}":
                plugin(plugin_name)
    return KINDS.get(name)


def adapter_for(cls: type) -> Adapter | None:
    for a in ADAPTERS:
        if a.matches(cls):
            return a
    for module, attr, name in _PLUGINS:
        base: Any = sys.modules.get(module)
        for part in attr.split(".") if base is not None else ():
            base = getattr(base, part, None)
        if isinstance(base, type) and issubclass(cls, base):
            plugin(name)
            return next((a for a in ADAPTERS if a.matches(cls)), None)
    return None
