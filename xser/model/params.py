"""Parameter subcollections: declared names, shapes, dtypes and initialisers. No I/O here.

A component that owns parameters calls ``xser.params(self)`` once (usually in
``__attrs_post_init__``) and declares each array with ``add``. Only declared arrays are
ever saved: gradients, activations and caches kept on the object are not.
"""

from __future__ import annotations

import contextvars
import hashlib
import re
import secrets
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, overload

import attrs
import numpy as np

from .inits import INITS
from ..errors import DataError, Location, RegistryError, shape_str
from ..storage.dtypes import dtype_problem, resolve
from .names import NAME_RE, _held_rows, _shape
from .tables import SEP, HashTable, IdSlice, new_table
from .param_types import AddOptions, ParamDecl, ShapeLike, TorchLike, TorchParams
from .places import GONE, get_place, places_of, put_place, rebound
from .registry import info_for

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from typing_extensions import Unpack

__all__ = ["INITS", "ParamDecl", "Subcollection", "TorchParams", "params", "subcollection_of"]

_S = TypeVar("_S", bound=np.generic)

_PARAMS = "_xser_params"  # the Subcollection, on the owner's __dict__
PRESET_NAME = "_xser_subcol_name"  # set by the builder before __init__ runs
PRESET_SOURCE = "_xser_source"  # where a loaded component's arrays come from
PRESET_WHERE = "_xser_where"  # Location of the component in its spec, for messages

SUBCOL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[0-9a-f]{8}")


class Source(Protocol):
    def claim(self) -> None: ...

    def fetch(self, subcol: str, name: str, shape: tuple[int, ...], dtype: np.dtype, rows: tuple[int, int] | None = None) -> np.ndarray | None: ...


@attrs.define
class BuildState:
    """Per-build bookkeeping shared by every component built in one ``build``/``load``."""

    rng: np.random.Generator
    names: dict[str, str] = attrs.Factory(dict)  # subcollection name -> where it was made
    #: loading a saved model: components that own parameters but are not in its spec (made by a constructor or a
    #: default) are refused, or with missing="init" recorded here and started from their inits; None: not loading
    unsaved: list[str] | None = None
    missing: str = "error"
    #: build(seed=...) with an int or str seed: subcollection names derive from it and the component's path
    seed_key: str | None = None
    unplaced: int = 0  # components named without a path (made by constructors), counted in build order


BUILD: contextvars.ContextVar[BuildState | None] = contextvars.ContextVar("xser_build", default=None)
_DEFAULT_RNG = np.random.default_rng()




class Subcollection:
    """The parameters of one component, under one unique name (``Linear.98dc700f``)."""

    def __init__(self, name: str, owner: Any, source: Source | None, rng: np.random.Generator) -> None:
        self.name = name
        self._owner = owner
        self._source = source
        self._rng = rng
        self._decls: dict[str, ParamDecl] = {}
        self._arrays: dict[str, np.ndarray] = {}
        self._places: dict[str, list[tuple]] = {}  # param -> where the owner keeps its array (see bind)
        self._partial: dict[str, tuple[int, int]] = {}  # param -> rows held, for a model loaded with rows=
        self._tables: dict[str, HashTable] = {}
        self._sharded: set[str] = set()  # params declared with add(..., rows=): this process holds those rows
        self._slices: dict[str, IdSlice] = {}  # tables declared with add_table(..., slice=): the ids this process holds

    # what type checkers see: the array's dtype follows ``dtype`` (default float32); see param_types
    @overload
    def add(self, name: str, shape: ShapeLike, *, dtype: Literal["float32"] = ..., **kw: Unpack[AddOptions]) -> NDArray[np.float32]: ...
    @overload
    def add(self, name: str, shape: ShapeLike, *, dtype: type[_S] | np.dtype[_S], **kw: Unpack[AddOptions]) -> NDArray[_S]: ...
    @overload
    def add(self, name: str, shape: ShapeLike, *, dtype: Literal["float64"], **kw: Unpack[AddOptions]) -> NDArray[np.float64]: ...
    @overload
    def add(self, name: str, shape: ShapeLike, *, dtype: Literal["float16"], **kw: Unpack[AddOptions]) -> NDArray[np.float16]: ...
    @overload
    def add(self, name: str, shape: ShapeLike, *, dtype: Literal["int8"], **kw: Unpack[AddOptions]) -> NDArray[np.int8]: ...
    @overload
    def add(self, name: str, shape: ShapeLike, *, dtype: Literal["int16"], **kw: Unpack[AddOptions]) -> NDArray[np.int16]: ...
    @overload
    def add(self, name: str, shape: ShapeLike, *, dtype: Literal["int32"], **kw: Unpack[AddOptions]) -> NDArray[np.int32]: ...
    @overload
    def add(self, name: str, shape: ShapeLike, *, dtype: Literal["int64"], **kw: Unpack[AddOptions]) -> NDArray[np.int64]: ...
    @overload
    def add(self, name: str, shape: ShapeLike, *, dtype: Literal["uint8"], **kw: Unpack[AddOptions]) -> NDArray[np.uint8]: ...
    @overload
    def add(self, name: str, shape: ShapeLike, *, dtype: Literal["bool"], **kw: Unpack[AddOptions]) -> NDArray[np.bool_]: ...
    @overload
    def add(self, name: str, shape: ShapeLike, *, dtype: Literal["complex64"], **kw: Unpack[AddOptions]) -> NDArray[np.complex64]: ...
    @overload
    def add(self, name: str, shape: ShapeLike, *, dtype: Literal["complex128"], **kw: Unpack[AddOptions]) -> NDArray[np.complex128]: ...
    @overload
    def add(self, name: str, shape: ShapeLike, *, dtype: Any, **kw: Unpack[AddOptions]) -> NDArray[Any]: ...

    def add(
        self,
        name: str,
        shape: Any,
        *,
        init: str | Callable | np.ndarray = "zeros",
        dtype: Any = "float32",
        trainable: bool = True,
        format: str | None = None,
        rows: tuple[int, int] | None = None,
    ) -> Any:
        """Declare a parameter and return its array (from disk when loading, else initialised).

        ``format`` names the weight format it is saved in (``"npy"``, ``"dense-text"``,
        ``"sparse-text"`` or a registered one); ``save(..., formats=...)`` can override it.
        ``rows=(start, stop)``: this process holds only those rows of a parameter of ``shape`` (sharded over
        the ranks of a job, ``xser.dist.rows(n)``): the array returned has ``stop - start`` rows; a load reads
        only them, and a save with a coordinator writes each rank's rows into one parameter.
        """
        where = f"{self.name}: param {name!r}"
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise RegistryError(f"{self.name}: parameter name {name!r} must match {NAME_RE.pattern}")
        if name in self._decls:
            raise RegistryError(f"{where} is declared twice")
        shape = _shape(shape, where)
        try:
            dt = resolve(dtype)
        except TypeError:
            raise RegistryError(f"{where}: unknown dtype {dtype!r}") from None
        except ImportError as e:
            raise RegistryError(f"{where}: {e}") from None
        why = dtype_problem(dt)
        if why is not None:
            raise RegistryError(f"{where}: {why}")
        if format is not None:
            from ..storage.formats import FORMATS, get_format

            if get_format(format) is None:
                raise RegistryError(f"{where}: unknown weight format {format!r} (known: {', '.join(sorted(FORMATS))})")
        held = None if rows is None else _held_rows(rows, shape, where)
        kw = {} if held is None else {"rows": held}
        arr = self._source.fetch(self.name, name, shape, dt, **kw) if self._source is not None else None
        if held is not None:  # add(..., rows=): this process holds those rows of the parameter
            self._partial[name] = held
            self._sharded.add(name)
        if arr is None:
            arr = self._initial(where, init, shape if held is None else (held[1] - held[0],) + shape[1:], dt)
        elif held is None and arr.shape != shape:  # a row range (load(rows=...)): this object holds part of it
            self._partial[name] = getattr(self._source, "rows_of", lambda n: (0, arr.shape[0]))(name)
        self._decls[name] = ParamDecl(name, shape, dt, bool(trainable), format)
        self._arrays[name] = arr
        return arr

    def add_table(
        self, name: str, dim: Any, *, dtype: Any = "float32", slots: Any = (), init: str | Callable = "zeros",
        slice: IdSlice | None = None,
    ) -> HashTable:
        """Declare a hash table: rows of shape ``dim`` keyed by int64 ids, with optional ``slots`` (optimizer
        state) of the same rows. Filled from disk when loading, else empty; ``init`` makes the rows of ids
        that ``get(..., insert=True)`` or ``set(..., slot=...)`` add. ``slice=xser.IdSlice(begin, end, size)``:
        this process holds the ids with ``id % size`` in ``[begin, end)`` (RecIS's rule): a load reads only
        those, and a save with a coordinator writes each rank's ids into one table."""
        if isinstance(name, str) and (name in self._decls or name in self._tables):
            raise RegistryError(f"{self.name}: table {name!r} is declared twice")
        if slice is not None and not isinstance(slice, IdSlice):
            raise RegistryError(f"{self.name}: table {name!r}: slice must be an xser.IdSlice, got {type(slice).__name__}")
        table = new_table(self.name, name, dim, dtype=dtype, slots=slots, init=init, rng=self._rng, inits=INITS)
        if slice is not None:
            self._slices[name] = slice
            table.slice = slice
        if self._source is not None:
            kw = {} if slice is None else {"which": slice}
            parts = self._source.fetch_table(self.name, name, ("id", "embedding") + table.slots, table.dim, table.dtype, **kw)
            if parts is not None:
                table.load(parts, None)
        self._tables[name] = table
        return table

    @property
    def tables(self) -> dict[str, HashTable]:
        return dict(self._tables)

    @property
    def slices(self) -> dict[str, IdSlice]:
        """Tables declared with ``add_table(..., slice=)``: the ids this process holds."""
        return dict(self._slices)

    @property
    def sharded(self) -> dict[str, tuple[int, int]]:
        """Parameters declared with ``add(..., rows=)``: the rows this process holds, ``(start, stop)``."""
        return {n: self._partial[n] for n in self._sharded}

    def table_arrays(self) -> dict[str, tuple[np.ndarray, bool]]:
        """The tables' parts to save, ``{"emb@id": (ids, False), "emb@embedding": (rows, True), ...}``."""
        out = {}
        for name, t in self._tables.items():
            for part, arr in t.arrays().items():
                out[f"{name}{SEP}{part}"] = (arr, part == "embedding")
        return out

    def _initial(self, where: str, init: Any, shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
        if isinstance(init, str):
            fn = INITS.get(init)
            if fn is None:
                raise RegistryError(f"{where}: unknown init {init!r} (known: {', '.join(sorted(INITS))})")
            value = fn(shape, self._rng)
        elif callable(init):
            value = init(shape, self._rng)
        else:
            value = init
        arr = np.array(value, dtype=dt, copy=True)
        if arr.shape != shape:
            raise RegistryError(f"{where}: init gave shape {shape_str(arr.shape)}, declared {shape_str(shape)}")
        return arr

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __setitem__(self, name: str, value: Any) -> None:
        """Replace a declared parameter's array (same shape and dtype); the places that held the old one now hold it."""
        decl = self._decls.get(name)
        if decl is None:
            raise KeyError(f"{self.name} has no parameter {name!r} (declared: {', '.join(self._decls) or 'none'})")
        if not isinstance(value, np.ndarray):
            raise DataError(
                f"param {name!r}: a parameter's value is a numpy array, got {type(value).__module__}.{type(value).__qualname__}",
                Location(path=self.name),
            )
        want = self._local_shape(name)
        if value.shape != want or value.dtype != decl.dtype:
            held = f" (rows {self._partial[name][0]}:{self._partial[name][1]} of {shape_str(decl.shape)})" if name in self._sharded else ""
            raise DataError(
                f"param {name!r}: new value is {shape_str(value.shape)} {value.dtype}, declared {shape_str(want)} {decl.dtype}{held}",
                Location(path=self.name),
            )
        for place in self._places.get(name, []):
            put_place(self._owner, place, value)
        self._arrays[name] = value
        if name not in self._sharded:
            self._partial.pop(name, None)
        self._places[name] = [p for p in self._places.get(name, []) if get_place(self._owner, p) is value]

    def _local_shape(self, name: str) -> tuple[int, ...]:
        """The shape of the array this process holds: the declared one, or its rows for ``add(..., rows=)``."""
        shape = self._decls[name].shape
        if name in self._sharded:
            first, stop = self._partial[name]
            return (stop - first,) + shape[1:]
        return shape

    @property
    def owner(self) -> Any:
        """The component whose parameters these are."""
        return self._owner

    def mismatches(self, found: dict[str, tuple[tuple[int, ...], np.dtype]]) -> list[str]:
        """What ``fill`` would refuse, for arrays of these shapes and dtypes: one line per parameter, sorted."""
        out = []
        for name in sorted(found):
            decl = self._decls.get(name)
            shape, dtype = found[name]
            if decl is not None and (tuple(shape) != decl.shape or np.dtype(dtype) != decl.dtype):
                out.append(f"{name}: {shape_str(decl.shape)} {decl.dtype} in the object, {shape_str(shape)} {np.dtype(dtype)} on disk")
        return out

    def names(self) -> list[str]:
        """Every name this subcollection saves: parameters, then the parts of its tables (``emb@id``, ...)."""
        return list(self._decls) + [f"{t}{SEP}{p}" for t, tab in self._tables.items() for p in ("id", "embedding", *tab.slots)]

    def fill(self, arrays: dict[str, Any], where: str) -> None:
        """Copy arrays into the declared ones in place (same shape and dtype): whoever holds them sees the new values.
        A table's parts replace its contents together."""
        parts: dict[str, dict[str, Any]] = {}
        for name in [n for n in arrays if SEP in n]:
            table, _, part = name.partition(SEP)
            parts.setdefault(table, {})[part] = np.asarray(arrays.pop(name))
        for table, got in parts.items():
            if table not in self._tables:
                raise KeyError(f"{self.name} has no table {table!r}")
            self._tables[table].load(got, Location(where))
        if arrays:
            self.current()  # adopt rebound arrays first, so the values land where the owner looks
        for name, value in arrays.items():
            decl = self._decls.get(name)
            if decl is None:
                raise KeyError(f"{self.name} has no parameter {name!r} (declared: {', '.join(self._decls) or 'none'})")
            value = np.asarray(value)
            if value.shape != decl.shape or value.dtype != decl.dtype:
                raise DataError(
                    f"param {name!r}: {shape_str(value.shape)} {value.dtype} on disk, declared {shape_str(decl.shape)} {decl.dtype}",
                    Location(where),
                )
            self._arrays[name][...] = value

    def bind(self) -> None:
        """Remember where the owner keeps each parameter's array: attributes, and values of a dict or
        list held in an attribute. Called when the component's constructor returns."""
        owned = getattr(self._owner, "__dict__", {})
        by_id: dict[int, list] = {}
        for p in places_of(owned):
            by_id.setdefault(id(get_place(self._owner, p)), []).append(p)
        for name, arr in self._arrays.items():
            self._places[name] = [p for p in by_id.get(id(arr), []) if get_place(self._owner, p) is arr]

    def __contains__(self, name: object) -> bool:
        return name in self._decls

    def __iter__(self) -> Iterator[str]:
        return iter(self._decls)

    def __len__(self) -> int:
        return len(self._decls)

    @property
    def decls(self) -> dict[str, ParamDecl]:
        return dict(self._decls)

    @property
    def partial(self) -> dict[str, tuple[int, int]]:
        """Parameters of which this object holds only some rows (loaded with ``rows=``): name -> (first, stop)."""
        return dict(self._partial)

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        return iter(self._arrays.items())

    def current(self) -> dict[str, tuple[np.ndarray, bool]]:
        """The arrays to save, ``{name: (array, trainable)}``: the one source of truth, checked.

        A parameter's value is the array ``add`` returned (or the last one given to ``p[name] =``).
        If a place where the owner kept it (an attribute, or a dict or list in an attribute) now
        holds a *new* numpy array of the declared shape and dtype (``self.W = self.W - lr * g``),
        that array is adopted. Anything else there (another type, shape or dtype, or two different
        new arrays) is a ``DataError`` that names the place and says how to update the parameter.
        A parameter held only in part (``load(rows=...)``) cannot be saved; one declared with
        ``add(..., rows=)`` gives the rows this process holds (a save with a coordinator puts them together).
        """
        out = {}
        for name, decl in self._decls.items():
            if name in self._partial and name not in self._sharded:
                first, stop = self._partial[name]
                raise DataError(
                    f"param {name!r} holds rows {first}:{stop} of its {decl.shape[0]} (the model was loaded with rows=); "
                    "a partial model cannot be saved: load it without rows= to save it",
                    Location(path=self.name),
                )
            arr = rebound(self._owner, self.name, name, self._arrays[name], self._places.get(name, []), self._local_shape(name), decl.dtype)
            if arr is not self._arrays[name]:
                self._arrays[name] = arr
                self._places[name] = [p for p in self._places[name] if get_place(self._owner, p, GONE) is arr]
            if arr.shape != self._local_shape(name) or arr.dtype != decl.dtype:
                raise DataError(
                    f"param {name!r} holds {shape_str(arr.shape)} {arr.dtype}, declared {shape_str(self._local_shape(name))} {decl.dtype}",
                    Location(path=self.name),
                )
            out[name] = (arr, decl.trainable)
        out.update(self.table_arrays())
        return out

    def __repr__(self) -> str:
        parts = []
        for n, d in self._decls.items():
            a = self._arrays[n]
            text = f"{n}: {shape_str(a.shape)} {a.dtype}"
            if n in self._partial:
                text += f" (rows {self._partial[n][0]}:{self._partial[n][1]} of {shape_str(d.shape)})"
            elif a.shape != d.shape or a.dtype != d.dtype:
                text += f" (declared {shape_str(d.shape)} {d.dtype})"
            parts.append(text)
        return f"<Subcollection {self.name} {{{', '.join(parts)}}}>"


def fresh_name(cls: type, where: str | None = None) -> str:
    """``ClassName.<8 hex>``, unique within the current build: random, or (a build with a seed) a hash of the
    seed and the component's path in the spec (``where``; components made by constructors count in order)."""
    state = BUILD.get()
    if state is not None and state.seed_key is not None:
        if where is None:
            state.unplaced += 1
            where = f"#{state.unplaced}"
        for k in range(1 << 16):
            digest = hashlib.blake2b(f"{state.seed_key}\0{where}\0{cls.__name__}\0{k}".encode(), digest_size=4).hexdigest()
            name = f"{cls.__name__}.{digest}"
            if name not in state.names:
                return name
    while True:
        name = f"{cls.__name__}.{secrets.token_hex(4)}"
        if state is None or name not in state.names:
            return name


@overload
def params(owner: TorchLike) -> TorchParams: ...
@overload
def params(owner: object) -> Subcollection: ...


def params(owner: Any) -> Any:
    """The subcollection of ``owner`` (created on the first call, the same object afterwards): a ``Subcollection``,
    or for a ``torch.nn.Module`` one whose arrays are its tensors (``TorchParams`` to type checkers)."""
    d = getattr(owner, "__dict__", None)
    if d is None:
        raise RegistryError(f"{type(owner).__qualname__}: xser.params needs an instance with a __dict__ (attrs slots=False)")
    sub = d.get(_PARAMS)
    if sub is not None:
        return sub
    info = info_for(owner)
    if info is None:
        raise RegistryError(f"{type(owner).__qualname__} is not an @xser.serializable class; only components own parameters")
    state = BUILD.get()
    name = d.get(PRESET_NAME) or fresh_name(type(owner))
    if state is not None:
        state.names.setdefault(name, str(d.get(PRESET_WHERE) or info.tag))
    source = d.get(PRESET_SOURCE)
    if source is not None:
        source.claim()
    elif state is not None and state.unsaved is not None:
        what = f"{type(owner).__qualname__} ({name})"
        if state.missing != "init":
            raise DataError(
                f"a {what} that owns parameters was made while loading, but the saved model has no such component (added to "
                "the code since the save, or built by a constructor or default instead of being a field): "
                'load(..., missing="init") starts it from its declared init'
            )
        state.unsaved.append(f"a new {what}")
    make = info.adapter.subcollection if info.adapter is not None else Subcollection
    sub = make(name, owner, source, state.rng if state is not None else _DEFAULT_RNG)
    d[_PARAMS] = sub
    return sub


def subcollection_of(obj: Any) -> Subcollection | None:
    d = getattr(obj, "__dict__", None)
    return None if d is None else d.get(_PARAMS)
