"""Modules of classes you did not decorate (``torch.nn.Linear``, a ``transformers`` model): ``xser.torch.wrap``.

``wrap(torch.nn.Linear, 4, 2)`` builds the module; ``wrap(module, 4, 2)`` keeps a module you already
have (its weights and dtypes) and checks, on the meta device, that the arguments build the same
module (tensor names and shapes, and ``repr``). ``wrap(module)`` alone works where the arguments
can be read back: a ``transformers`` model (``PreTrainedModel``) records its config; a layer whose
constructor arguments are attributes of the same name (most of ``torch.nn``: ``Linear``, ``Conv2d``,
``LayerNorm``, ``Embedding``, ``Dropout``...) records them, checked the same way; ``Sequential``,
``ModuleList`` and ``ModuleDict`` are rebuilt around their wrapped children (the same tensors). Either way the result is a ``TorchModule`` component (``!TorchModule`` in the spec)
that records how to build the module again (its class, and constructor arguments or HF config)
and saves the module's own ``state_dict()`` keys (``bert.embeddings...``, not ``module.bert...``),
so a flat view or an export of a wrapped root has the keys ``from_pretrained`` and
``load_state_dict`` expect. ``wrapper.module`` is the module; calling the wrapper calls it.

A spec names a class by a dotted path, and loading builds only classes it may (docs/security.md):
the ``torch.nn`` layers (looked up in the imported ``torch.nn``, nothing is imported),
``PreTrainedModel`` subclasses of ``transformers`` (the package, imported by its fixed name) and
classes passed to ``allow``
(``wrap`` allows the classes it wraps in this process). Any other path is a ``SpecError`` that says
to call ``xser.torch.allow(cls)`` first. Arguments are plain YAML values, or other components
(``wrap(torch.nn.Sequential, wrap(torch.nn.Linear, 4, 8), wrap(torch.nn.ReLU))``).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

import attrs
import torch

from ..errors import RegistryError, SpecError
from ..model.params import PRESET_WHERE
from ..model.registry import info_for, serializable

__all__ = ["TorchModule", "allow", "class_path", "wrap"]

#: classes a spec may name besides torch.nn's and transformers' models: path -> class
_ALLOWED: dict[str, type] = {}


def _transformers_model(cls: Any) -> bool:
    tf = sys.modules.get("transformers")
    base = getattr(tf, "PreTrainedModel", None) if tf is not None else None
    return isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base)


def class_path(cls: type) -> str:
    """The path a spec names ``cls`` by: ``torch.nn.Linear``, ``transformers.BertForMaskedLM``, else module.qualname."""
    if getattr(torch.nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    tf = sys.modules.get("transformers")
    if tf is not None and _transformers_model(cls) and getattr(tf, cls.__name__, None) is cls:
        return f"transformers.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def allow(cls: type) -> str:
    """Let specs name ``cls`` (a ``torch.nn.Module`` subclass) in a ``!TorchModule``; returns the path they name it by.
    Call it before loading a model that wraps a class of your own, as you would import an ``@xser.serializable`` one."""
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise RegistryError(f"xser.torch.allow takes a torch.nn.Module subclass, got {cls!r}")
    if info_for(cls) is not None:
        raise RegistryError(f"{class_path(cls)} is an @xser.serializable class: save it as it is, without wrap")
    path = class_path(cls)
    _ALLOWED[path] = cls
    return path


def _allowed(path: str) -> type:
    """The class a spec names; only the classes this module lets specs build (nothing is imported here)."""
    cls = _ALLOWED.get(path)
    if cls is not None:
        return cls
    module, _, name = path.rpartition(".")
    found: Any = None
    if module == "torch.nn":
        found = getattr(torch.nn, name, None)
        if isinstance(found, type) and issubclass(found, torch.nn.Module):
            return found
    elif module == "transformers":  # the package itself, by its fixed name: no module named by the file is imported
        try:
            tf = importlib.import_module("transformers")
        except ImportError:
            raise SpecError(f"class {path!r} needs the transformers package: pip install transformers") from None
        found = getattr(tf, name, None)
        if _transformers_model(found):
            return found
    if found is not None:
        raise SpecError(f"{path!r} is not a torch.nn.Module class (of transformers, only PreTrainedModel subclasses are built)")
    raise SpecError(f"class {path!r} may not be built from a spec: only torch.nn layers, transformers models and classes "
                    f"passed to xser.torch.allow are; call xser.torch.allow({name or path}) before loading (after importing it)")


@serializable(tag="!TorchModule")
class TorchModule(torch.nn.Module):
    """A module of a class that is not ``@xser.serializable``, with how to build it again (see ``wrap``).

    ``cls`` names the class (``torch.nn.Linear``); ``args`` and ``kwargs`` are its constructor's arguments; ``config``
    (a ``transformers`` model) is its config as ``config.to_dict()`` gives it. Arguments that are other wrapped modules
    are passed as the wrappers themselves (their tensors are saved by them)."""

    cls: str
    args: list[Any] = attrs.field(factory=list)
    kwargs: dict[str, Any] = attrs.field(factory=dict)
    config: dict[Any, Any] | None = None
    #: the wrapper's state is the state_dict of this child (keys without a "module." prefix)
    _xser_state_root = "module"

    def __attrs_post_init__(self) -> None:
        made = self.__dict__.pop("_xser_adopt", None)
        if made is None:
            try:
                made = _build(_allowed(self.cls), self.args, self.kwargs, self.config)
            except SpecError as e:  # placed at the spec's component, when a spec built it
                raise SpecError(e.message, e.location or self.__dict__.get(PRESET_WHERE)) from None
        self.module = made

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


def _build(cls: type, args: list, kwargs: dict, config: dict | None) -> torch.nn.Module:
    if config is not None:
        if not _transformers_model(cls):
            raise SpecError(f"config= is for transformers models; {class_path(cls)} takes args and kwargs")
        if args or kwargs:
            raise SpecError("a transformers model is built from its config alone: give config= or args/kwargs, not both")
        made = cls(cls.config_class.from_dict(dict(config)))
    else:
        made = cls(*args, **kwargs)
    if not isinstance(made, torch.nn.Module):
        raise SpecError(f"{class_path(cls)}(...) made a {type(made).__qualname__}, not a torch.nn.Module")
    return made


def _shapes(m: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in m.state_dict().items()}


def _plain(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, (list, tuple)) and all(_plain(x) for x in v)


def _read_back(instance: torch.nn.Module) -> dict[str, Any] | None:
    """Constructor arguments read from the attributes of the same name (None: some required one is not there)."""
    try:
        params = list(inspect.signature(type(instance).__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    out: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in ("device", "dtype"):
            continue
        v = getattr(instance, p.name, inspect.Parameter.empty)
        if isinstance(p.default, bool) and (v is None or isinstance(v, torch.Tensor)):
            v = v is not None  # bias=True: the attribute is the bias tensor, or None
        if _plain(v):
            out[p.name] = list(v) if isinstance(v, tuple) else v
        elif p.default is p.empty:
            return None
    return out


_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def wrap(module: torch.nn.Module | type, *args: Any, **kwargs: Any) -> TorchModule:
    """A savable component for a module whose class is not ``@xser.serializable``.

    ``wrap(cls, *args, **kwargs)`` builds ``cls(*args, **kwargs)``; ``wrap(instance, *args, **kwargs)`` keeps
    ``instance`` (its weights and dtypes) after checking, on the meta device, that ``cls(*args, **kwargs)`` makes the
    same tensors (names and shapes), so that loading can build it again; ``wrap(transformers_model)`` records the
    model's config instead of arguments. The class is allowed in specs (``allow``). Arguments must be values a spec
    holds (numbers, strings, lists, dicts, other components).
    """
    instance = module if isinstance(module, torch.nn.Module) else None
    cls = type(module) if instance is not None else module
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise RegistryError(f"xser.torch.wrap takes a torch.nn.Module or a subclass of it, got {module!r}")
    if info_for(cls) is not None:
        raise RegistryError(f"{class_path(cls)} is an @xser.serializable class: save it as it is, without wrap")
    if isinstance(instance, TorchModule):
        return instance
    if instance is not None and not args and not kwargs and type(instance) in _CONTAINERS:
        if isinstance(instance, torch.nn.ModuleDict):
            return wrap(type(instance), {k: wrap(v) for k, v in instance.items()})
        children = [wrap(c) for c in instance]
        return wrap(type(instance), *children) if isinstance(instance, torch.nn.Sequential) else wrap(type(instance), children)
    config = None
    if _transformers_model(cls) and not args and not kwargs:
        if instance is None:
            raise RegistryError(f"wrap({class_path(cls)}) needs a config: wrap({cls.__name__}(config)) wraps the model it makes")
        config = instance.config.to_dict()
    elif instance is not None and not args and not kwargs:
        kwargs = _read_back(instance) or {}
    path = allow(cls)
    out = TorchModule.__new__(TorchModule)
    if instance is not None:
        _check_rebuilds(instance, cls, path, args, kwargs, config)
        out.__dict__["_xser_adopt"] = instance
    out.__init__(cls=path, args=list(args), kwargs=dict(kwargs), config=config)  # type: ignore[misc]
    return out


def _check_rebuilds(instance: torch.nn.Module, cls: type, path: str, args: tuple, kwargs: dict, config: dict | None) -> None:
    """``cls(*args, **kwargs)`` (or from ``config``), built on the meta device, has the tensors (names, shapes) and the
    ``repr`` of ``instance``: loading will build the module that was saved."""
    args_text = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]) if config is None else "config"
    how = ("; pass the arguments it was made with: xser.torch.wrap(module, *args, **kwargs)" if config is None else "")
    try:
        with torch.device("meta"):
            probe = _build(cls, list(args), dict(kwargs), config)
    except Exception as e:
        raise RegistryError(f"wrap: {path}({args_text}) cannot be built again: {type(e).__name__}: {e}{how}") from None
    have, made = _shapes(instance), _shapes(probe)
    if have != made:
        diff = sorted(k for k in set(have) | set(made) if have.get(k) != made.get(k))
        shown = "; ".join(f"{k}: {have.get(k, 'absent')} in the module, {made.get(k, 'absent')} built" for k in diff[:8])
        more = f" (and {len(diff) - 8} more)" if len(diff) > 8 else ""
        raise RegistryError(f"wrap: {path}({args_text}) does not build this module's tensors: {shown}{more}{how}")
    if repr(probe) != repr(instance):
        mine, built = repr(instance).splitlines(), repr(probe).splitlines()
        first = next((i for i, (a, b) in enumerate(zip(mine, built)) if a != b), min(len(mine), len(built)))
        line = lambda lines: lines[first].strip() if first < len(lines) else "(nothing)"  # noqa: E731
        raise RegistryError(f"wrap: {path}({args_text}) builds another module: {line(built)!r} where this one has "
                            f"{line(mine)!r}{how}")
