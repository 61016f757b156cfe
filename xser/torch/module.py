"""``torch.nn.Module`` components: their subcollection is their own ``state_dict()``.

A torch component's state is what ``state_dict()`` holds, minus the parts of child components
that are themselves ``@xser.serializable`` (those have their own subcollections): parameters and
persistent buffers of the module and of its plain submodules (``emb.weight``,
``norm.running_mean``, ``norm.num_batches_tracked``). Gradients, non-persistent buffers, hooks and
optimizer scratch are never part of it. On load, the module is built by its own constructor and
its tensors are then filled in place from disk (or, with ``mmap=True``, pointed at the mapped
files), so parameter objects, and the ties between them, stay what the constructor made.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import torch

from ..errors import DataError, Location, RegistryError, key_lists, shape_str
from ..model.adapters import ADAPTERS, LOAD
from ..model.params import PRESET_SOURCE, ParamDecl, Subcollection, params, subcollection_of
from ..model.registry import info_for
from .tensors import from_numpy, host_payload, numpy_dtype

__all__ = ["TorchAdapter", "TorchSubcollection", "own_state"]


def own_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``state_dict(keep_vars=True)`` without the keys of serializable descendants (they save themselves)."""
    skip = tuple(f"{name}." for name, m in module.named_modules(remove_duplicate=False) if name and info_for(m) is not None)
    out = {}
    for key, value in module.state_dict(keep_vars=True).items():
        if skip and key.startswith(skip):
            continue
        if not isinstance(value, torch.Tensor):
            raise DataError(
                f"{type(module).__qualname__}: state_dict entry {key!r} is a {type(value).__name__}, not a tensor "
                "(extra state is not saved by xser; keep it in a constructor argument or in training_state)"
            )
        out[key] = value
    return out


def _trainable(t: torch.Tensor) -> bool:
    return isinstance(t, torch.nn.Parameter) and t.requires_grad


class TorchSubcollection(Subcollection):
    """The subcollection of a torch component: a live view of its own state, never a copy."""

    def __init__(self, name: str, owner: Any, source: Any, rng: np.random.Generator) -> None:
        super().__init__(name, owner, source, rng)
        self._formats: dict[str, str | None] = {}
        self._filled: set[str] = set()  # declared with add() while loading: already read from disk

    # -- declaring
    def add(self, name: str, shape: Any, *, init: Any = "zeros", dtype: Any = "float32", trainable: bool = True,
            format: str | None = None) -> torch.Tensor:
        """Declare a tensor: a registered ``torch.nn.Parameter`` (a buffer if ``trainable=False``), read from disk
        when loading, else initialised; float32 by default (torch dtypes are accepted)."""
        where = f"{self.name}: param {name!r}"
        if not isinstance(name, str) or not name.isidentifier():
            raise RegistryError(f"{self.name}: a torch component's parameter name must be a Python identifier, got {name!r}")
        owner = self._owner
        if name in self._formats or name in owner._parameters or name in owner._buffers or name in owner._modules:
            raise RegistryError(f"{where} is declared twice")
        arr = super().add(name, shape, init=init, dtype=dtype, trainable=trainable, format=format)
        self._decls.pop(name)
        self._arrays.pop(name)
        t = from_numpy(arr)  # a fresh array (read, mapped or initialised): shared, not copied
        if trainable:
            t = torch.nn.Parameter(t)
            self._owner.register_parameter(name, t)
        else:
            self._owner.register_buffer(name, t)
        self._formats[name] = format
        if self._source is not None:
            self._filled.add(name)
        return t

    # -- the state, live
    def _state(self) -> dict[str, torch.Tensor]:
        return own_state(self._owner)

    @property
    def decls(self) -> dict[str, ParamDecl]:
        return {
            n: ParamDecl(n, tuple(t.shape), numpy_dtype(t.dtype, f"{self.name}: param {n!r}: "), _trainable(t), self._formats.get(n))
            for n, t in self._state().items()
        }

    def current(self) -> dict[str, tuple[Any, bool]]:
        out = {n: (host_payload(t, f"{self.name}/{n}"), _trainable(t)) for n, t in self._state().items()}
        out.update(self.table_arrays())
        return out

    def names(self) -> list[str]:
        return list(self._state()) + super().names()

    def bind(self) -> None:
        """Nothing to remember: the module is asked for its state at each save."""

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._state()[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self.fill({name: value}, f"{self.name}")

    def __contains__(self, name: object) -> bool:
        return name in self._state()

    def __iter__(self):
        return iter(self._state())

    def __len__(self) -> int:
        return len(self._state())

    def items(self):
        return iter(self._state().items())

    @property
    def partial(self) -> dict:
        return {}

    def __repr__(self) -> str:
        parts = [f"{n}: {shape_str(tuple(t.shape))} {str(t.dtype).removeprefix('torch.')}" for n, t in self._state().items()]
        return f"<Subcollection {self.name} {{{', '.join(parts)}}}>"

    # -- filling
    def fill(self, arrays: dict[str, Any], where: str, *, mmap: bool = False) -> None:
        """Copy arrays (or tensors) into the module's tensors in place, checking shape and dtype first."""
        tables = {n: arrays.pop(n) for n in [n for n in arrays if "@" in n]}
        if tables:
            super().fill(tables, where)
        state = self._state()
        for name, value in arrays.items():
            t = state.get(name)
            if t is None:
                raise KeyError(f"{self.name} has no tensor {name!r} (has: {', '.join(state) or 'none'})")
            src = value if isinstance(value, torch.Tensor) else from_numpy(np.asarray(value), copy=False)
            if tuple(src.shape) != tuple(t.shape) or src.dtype != t.dtype:
                raise DataError(
                    f"param {name!r}: {shape_str(tuple(src.shape))} {str(src.dtype).removeprefix('torch.')} given, "
                    f"the module holds {shape_str(tuple(t.shape))} {str(t.dtype).removeprefix('torch.')}",
                    Location(where),
                )
            _put(t, src, mmap)

    def load(self) -> None:
        """Fill every tensor of the state from the loaded component's source (missing keys listed together)."""
        source = self._source
        state = self._state()
        on_disk = set(source.names())
        missing = sorted(set(state) - on_disk - self._filled)
        if missing and source.keep_missing(missing):  # load(missing="init"): they keep what the constructor made
            self._filled.update(missing)
            missing = []
        if missing:
            text = key_lists(missing, on_disk - set(state) - self._filled, " in state_dict")
            raise DataError(text + source.needed_by(), source.location())
        mapped = _mapped()
        for name, t in state.items():
            if name in self._filled:
                continue
            arr = source.fetch(self.name, name, tuple(t.shape), numpy_dtype(t.dtype, f"{self.name}: param {name!r}: "))
            src = from_numpy(arr, copy=False)
            _put(t, src, mapped)
        self._filled.update(state)


def _put(t: torch.Tensor, src: torch.Tensor, mapped: bool) -> None:
    """Values into a module's tensor, keeping the tensor object: pointed at a mapped file, or copied."""
    with torch.no_grad():
        if mapped and t.device.type == "cpu":
            t.data = src
        else:
            t.copy_(src)


def _mapped() -> bool:
    opts = LOAD.get()
    return bool(opts and opts.get("mmap"))


@attrs.frozen
class TorchAdapter:
    """What ``@xser.serializable`` does for a ``torch.nn.Module`` subclass."""

    name: str = "torch.nn.Module"
    #: attrs must not replace nn.Module's __setattr__ (it registers submodules and parameters) or its hash
    define: dict = attrs.field(factory=lambda: {"on_setattr": attrs.setters.NO_OP, "repr": False})

    def matches(self, cls: type) -> bool:
        return isinstance(cls, type) and issubclass(cls, torch.nn.Module)

    def prepare(self, cls: type) -> None:
        """``torch.nn.Module.__init__`` runs before attrs sets the fields (the user writes nothing for it)."""
        if "__attrs_pre_init__" not in cls.__dict__:
            def __attrs_pre_init__(self: Any) -> None:
                torch.nn.Module.__init__(self)

            cls.__attrs_pre_init__ = __attrs_pre_init__  # type: ignore[attr-defined]

    def after_init(self, obj: Any) -> None:
        """The constructor has run: read the state from disk when loading; put it on the load's device."""
        sub = subcollection_of(obj)
        source = obj.__dict__.get(PRESET_SOURCE)
        if source is not None and (sub is not None or source.stored is not None or own_state(obj)):
            if sub is None:
                sub = params(obj)
            sub.load()
        opts = LOAD.get()
        device = opts.get("device") if opts else None
        if device is not None and torch.device(device).type != "cpu":
            obj.to(device)

    def subcollection(self, name: str, owner: Any, source: Any, rng: Any) -> TorchSubcollection:
        return TorchSubcollection(name, owner, source, rng)

    def before_save(self, obj: Any) -> Any:
        """A torch component with state gets its subcollection when it is first saved, if it has none yet."""
        sub = subcollection_of(obj)
        if sub is None and own_state(obj):
            sub = params(obj)
        return sub


ADAPTERS.append(TorchAdapter())
