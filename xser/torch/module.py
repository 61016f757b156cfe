"""``torch.nn.Module`` components: their subcollection is their own ``state_dict()``.

A torch component's state is what ``state_dict()`` holds, minus the parts of child components
that are themselves ``@xser.serializable`` (those have their own subcollections): parameters and
persistent buffers of the module and of its plain submodules (``emb.weight``,
``norm.running_mean``, ``norm.num_batches_tracked``). Gradients, non-persistent buffers, hooks and
optimizer scratch are never part of it. On load, the module is built by its own constructor and
its tensors are then filled in place from disk (or, with ``mmap=True``, pointed at the mapped
files), so parameter objects, and the ties between them, stay what the constructor made.

Dtypes. A module's dtype often changes after its constructor ran (``.half()``, ``.to(torch.bfloat16)``,
one submodule only): a floating-point or complex tensor that the constructor makes in one dtype
and the checkpoint holds in another takes the saved dtype when loading (``load`` gives the model
that was saved, bit for bit, as ``Module.to`` would have made it). Integer and bool tensors keep
the dtype their constructor gives them (``Module.to`` never changes them): a different one on
disk is a code change, refused. ``load_into`` fills an object the caller built, whose dtypes are
the caller's choice: it copies with a cast, as ``load_state_dict`` does, and logs the tensors a
cast can round (float32 on disk into a float16 module; widening casts are exact and silent).
"""

from __future__ import annotations

import logging
import mmap
from typing import Any

import attrs
import numpy as np
import torch

from ..errors import DataError, Location, RegistryError, key_lists, shape_str
from ..model.adapters import ADAPTERS, LOAD
from ..model.names import _shape
from ..model.params import PRESET_SOURCE, ParamDecl, Subcollection, params, subcollection_of
from ..model.registry import info_for
from ..model.serialize import arg_clause
from ..storage.dtypes import DTYPES, find, resolve
from .tensors import from_numpy, host_payload, numpy_dtype

__all__ = ["TorchAdapter", "TorchSubcollection", "exact_cast", "log_rounded", "own_state"]

_log = logging.getLogger("xser")

#: the hint of a refused dtype difference
_KEEPS = ("integer and bool tensors keep the dtype their constructor gives them (only floating-point and complex ones take "
          "the saved dtype, as Module.to converts only those)")


def _floating(dt: torch.dtype) -> bool:
    return dt.is_floating_point or dt.is_complex


def _saved_floating(dt: np.dtype) -> bool:
    """A dtype on disk that a floating-point or complex tensor may take (floats and complex of the dtype table)."""
    d = find(dt)
    return d is not None and d.average is not None


def exact_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    """Every value of ``src`` is a value of ``dst``: a cast that never rounds (float16 -> float32, float8 -> bfloat16)."""
    if src == dst:
        return True
    if not (_floating(src) and _floating(dst)) or (src.is_complex and not dst.is_complex):
        return False
    s, d = torch.finfo(src), torch.finfo(dst)  # of the parts, for complex dtypes
    return d.eps <= s.eps and d.max >= s.max and d.tiny * d.eps <= s.tiny * s.eps  # precision, range, smallest subnormal


def log_rounded(where: str, verb: str, target: str, casts: dict[str, tuple[torch.dtype, torch.dtype]]) -> None:
    """Log (logger ``xser``) the tensors a load cast in a way that can change values ({name: (on disk, in the module)}),
    grouped by dtypes; exact casts (float16 into float32) are not logged."""
    rounded: dict[tuple[str, str], list[str]] = {}
    for name, (src, dst) in casts.items():
        if not exact_cast(src, dst):
            rounded.setdefault((_tname(src), _tname(dst)), []).append(name)
    if rounded:
        n = sum(len(v) for v in rounded.values())
        groups = "; ".join(f"{', '.join(sorted(names))}: {a} on disk, {b} in {target}" for (a, b), names in sorted(rounded.items()))
        _log.warning("%s: %s rounded %d tensor(s) to %s's dtypes (as load_state_dict does): %s", where, verb, n, target, groups)


def _tname(dt: Any) -> str:
    return str(dt).removeprefix("torch.")


def own_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``state_dict(keep_vars=True)`` without the keys of serializable descendants (they save themselves); of a
    wrapper (``xser.torch.wrap``), its module's, keys as that module names them."""
    root = getattr(type(module), "_xser_state_root", None)
    if root is not None:
        module = getattr(module, root)
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
    def add(self, name: str, shape: Any, *, init: Any = "zeros", dtype: Any = "float32", trainable: bool = True,  # type: ignore[override]
            format: str | None = None) -> torch.Tensor:
        """Declare a tensor: a registered ``torch.nn.Parameter`` (a buffer if ``trainable=False``), read from disk
        when loading, else initialised; float32 by default (torch dtypes are accepted)."""
        where = f"{self.name}: param {name!r}"
        if not isinstance(name, str) or not name.isidentifier():
            raise RegistryError(f"{self.name}: a torch component's parameter name must be a Python identifier, got {name!r}")
        owner = self._owner
        if name in self._formats or name in owner._parameters or name in owner._buffers or name in owner._modules:
            raise RegistryError(f"{where} is declared twice")
        source, read = self._source, self._source is not None
        if source is not None and isinstance(name, str):
            found = source.described(name)
            made = _torch_dtype_of(dtype)
            if found is not None and made is not None and _floating(made) and _saved_floating(found[1]):
                dtype, made = found[1], _torch_dtype_of(found[1])  # loading: a floating-point tensor takes the saved dtype
            # absent or different on disk: made from its init now, and listed by load() with every other such tensor
            read = source.rows_of(name) is not None or (found is not None and made is not None and found[0] == _shape(shape, where)
                                                        and found[1] == numpy_dtype(made))
        if not read:
            self._source = None
        try:
            arr = super().add(name, shape, init=init, dtype=dtype, trainable=trainable, format=format)
        finally:
            self._source = source
        self._decls.pop(name)
        self._arrays.pop(name)
        t = from_numpy(arr)  # a fresh array (read, mapped or initialised): shared, not copied
        if trainable:
            t = torch.nn.Parameter(t)
            self._owner.register_parameter(name, t)
        else:
            self._owner.register_buffer(name, t)
        self._formats[name] = format
        if read and source is not None:
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
        self.fill({name: value}, f"{self.name}", cast=False)

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
    def mismatches(self, found: dict[str, tuple[tuple[int, ...], np.dtype]]) -> list[str]:
        """What ``fill`` would refuse, for arrays of these shapes and dtypes: one line per tensor, sorted. Floating-point
        and complex tensors take any floating-point or complex dtype (cast)."""
        state = self._state()
        out, dtype_only = [], False
        for name in sorted(found):
            t = state.get(name)
            if t is None:
                continue
            shape, dtype = tuple(found[name][0]), np.dtype(found[name][1])
            castable = _floating(t.dtype) and _saved_floating(dtype)
            if shape != tuple(t.shape) or not (castable or dtype == numpy_dtype(t.dtype, f"{self.name}: param {name!r}: ")):
                out.append(f"{name}: {shape_str(tuple(t.shape))} {_tname(t.dtype)} in the module, {shape_str(shape)} {_dtype_name(dtype)} on disk")
                dtype_only = dtype_only or shape == tuple(t.shape)
        return out + [_KEEPS] if dtype_only else out

    def fill(self, arrays: dict[str, Any], where: str, *, mmap: bool = False, cast: bool = True) -> None:
        """Copy arrays (or tensors) into the module's tensors in place, after checking every shape and dtype. With
        ``cast`` (``load_into``), floating-point values are cast to the module's dtype as ``load_state_dict`` does;
        casts that can round are logged. ``sub[name] = value`` needs the tensor's own dtype."""
        tables = {n: arrays.pop(n) for n in [n for n in arrays if "@" in n]}
        if tables:
            super().fill(tables, where)
        state = self._state()
        unknown = sorted(set(arrays) - set(state))
        if unknown:
            raise KeyError(f"{self.name} has no tensor {unknown[0]!r} (has: {', '.join(state) or 'none'})")
        given = {n: v if isinstance(v, torch.Tensor) else from_numpy(np.asarray(v), copy=False) for n, v in arrays.items()}
        bad = self.mismatches({n: (tuple(v.shape), numpy_dtype(v.dtype, f"param {n!r}: ")) for n, v in given.items()}) if cast else [
            f"param {n!r}: {shape_str(tuple(v.shape))} {_tname(v.dtype)} given, the module holds {shape_str(tuple(state[n].shape))} "
            f"{_tname(state[n].dtype)}" for n, v in sorted(given.items()) if v.shape != state[n].shape or v.dtype != state[n].dtype
        ]
        if bad:
            raise DataError("; ".join(bad), Location(where))
        for name, src in given.items():
            _put(state[name], src, mmap and src.dtype == state[name].dtype)
        log_rounded(where, "load_into", "the object", {n: (v.dtype, state[n].dtype) for n, v in given.items()})

    def load(self) -> None:
        """Fill every tensor of the state from the loaded component's source: every key, shape and dtype is checked
        before anything is read (missing keys listed together, then every tensor that differs)."""
        source = self._source
        state = self._state()
        on_disk = set(source.names())
        missing = sorted(set(state) - on_disk - self._filled)
        if missing and source.keep_missing(missing):  # load(missing="init"): they keep what the constructor made
            self._filled.update(missing)
            missing = []
        if missing:
            text = key_lists(missing, on_disk - set(state) - self._filled, " in state_dict")
            raise source.mismatch(text)
        found = {}
        for name, t in state.items():
            if name not in self._filled:
                shape, dtype = source.described(name) or (tuple(t.shape), numpy_dtype(t.dtype, f"{self.name}: param {name!r}: "))
                found[name] = (tuple(t.shape) if source.rows_of(name) is not None else shape, dtype)  # rows=: checked by the read
        bad = self.mismatches(found)
        if bad:
            count = len(bad) - (bad[-1] == _KEEPS)
            text = f"{count} tensor(s) of the module differ from the checkpoint: " + "; ".join(bad)
            raise source.mismatch(text + arg_clause(self._owner, source.saved_args()))
        mapped = _mapped()
        for name, (_, dtype) in found.items():  # floating-point tensors take the saved dtype (.half() after the constructor)
            t = state[name]
            arr = source.fetch(self.name, name, tuple(t.shape), dtype)
            src = from_numpy(arr, copy=False)
            # a private copy-on-write map of the file (mmap=True, or an eager load: what safetensors' load_file gives)
            # becomes the tensor's data: copying it into the constructor's memory would read every page at once (a
            # file stored in Fortran order, a transposed view's, is copied: the module's tensor stays contiguous)
            _put(t, src, mapped or src.dtype != t.dtype or (_is_map(arr) and arr.flags.c_contiguous))
        self._filled.update(state)


def _torch_dtype_of(dtype: Any) -> torch.dtype | None:
    """The torch dtype a declaration's ``dtype`` means (None if it has none)."""
    if isinstance(dtype, torch.dtype):
        return dtype if _tname(dtype) in DTYPES else None
    try:
        d = find(np.dtype(resolve(dtype)))
    except (TypeError, ImportError):
        return None
    return getattr(torch, d.torch) if d is not None else None


def _dtype_name(dt: np.dtype) -> str:
    d = find(dt)
    return d.tag if d is not None else str(dt)


def _put(t: torch.Tensor, src: torch.Tensor, rebind: bool) -> None:
    """Values into a module's tensor, keeping the tensor object: its data replaced by ``src`` (a mapped file, or another
    dtype: the saved one), or copied into it (cast to its dtype)."""
    with torch.no_grad():
        if rebind and t.device.type == "cpu":
            t.data = src
        elif rebind and src.dtype != t.dtype:
            t.data = src.to(t.device)
        else:
            t.copy_(src)


def _is_map(a: Any) -> bool:
    """Whether ``a`` is a view of a memory map (a private copy-on-write one: xser maps nothing else for writing)."""
    while isinstance(a, np.ndarray):
        a = a.base
    return isinstance(a, mmap.mmap)


def _mapped() -> bool:
    opts = LOAD.get()
    return bool(opts and opts.get("mmap"))


@attrs.frozen
class TorchAdapter:
    """What ``@xser.serializable`` does for a ``torch.nn.Module`` subclass."""

    name: str = "torch.nn.Module"
    #: an eager load maps local, uncompressed files copy-on-write (MAP_PRIVATE) for these tensors instead of reading
    #: them into new memory, as ``safetensors.torch.load_file`` does; ``load(..., copy=True)`` reads them
    maps_eager: bool = True
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
