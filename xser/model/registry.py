"""``@serializable``: attrs component classes registered under a YAML tag."""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

import attrs

from ..errors import RegistryError, SpecError, did_you_mean
from .adapters import PLUGIN_TAGS, adapter_for, plugin_tag

__all__ = ["BUILTIN_ARGS", "ComponentInfo", "info_for", "lookup", "serializable", "tag_of"]

T = TypeVar("T", bound=type)

if TYPE_CHECKING:  # type checkers see attrs-style constructors on @serializable classes (PEP 681)
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Any:
        return lambda f: f

#: Tags that the builder handles itself, with their arguments; no class may take them.
BUILTIN_ARGS: dict[str, tuple[str, ...]] = {
    "!Ref": ("path", "name", "default"), "!LoadSerialized": ("filename", "path", "overwrite"), "!ModelPath": ("path",),
    "!Repeat": ("times", "content"), "!RandomParam": ("values", "drawn"),
}
RESERVED_TAGS = frozenset(BUILTIN_ARGS)
#: Keys that xser writes into a component's mapping; no field may use them.
RESERVED_KEYS = frozenset({"xser_subcol_name", "xser_id", "xser_version"})

Migration = Callable[[dict, int], dict]


@attrs.frozen
class ComponentInfo:
    """What the registry knows of a component class."""

    cls: type
    tag: str
    version: int | None
    migrate: Migration | None
    adapter: Any = None  # an adapters.Adapter for classes of another framework (torch.nn.Module)
    migrate_params: Callable[[dict, int], dict] | None = None  # an adapters.Adapter for classes of another framework (torch.nn.Module)

    @property
    def fields(self) -> tuple[attrs.Attribute, ...]:
        """The constructor arguments, in declaration order."""
        return tuple(f for f in attrs.fields(self.cls) if f.init)

    def field_type(self, field: attrs.Attribute) -> Any:
        """A field's annotation, resolved if it was written as a string (``None`` if unresolvable)."""
        hints = _HINTS.get(self.cls)
        if hints is None:
            try:
                hints = typing.get_type_hints(self.cls)
            except Exception:  # forward references that do not resolve: check nothing
                hints = {}
            _HINTS[self.cls] = hints
        tp = hints.get(field.name, field.type)
        return None if isinstance(tp, str) else tp


_HINTS: dict[type, dict[str, Any]] = {}


_BY_TAG: dict[str, ComponentInfo] = {}
_BY_CLASS: dict[type, ComponentInfo] = {}


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@overload
def serializable(cls: T, /) -> T: ...


@overload
def serializable(
    *,
    tag: str | None = None,
    version: int | None = None,
    migrate: Migration | None = None,
    migrate_params: Callable[[dict, int], dict] | None = None,
) -> Callable[[T], T]: ...


@dataclass_transform(field_specifiers=(attrs.field,))
def serializable(
    cls: T | None = None,
    *,
    tag: str | None = None,
    version: int | None = None,
    migrate: Migration | None = None,
    migrate_params: Callable[[dict, int], dict] | None = None,
) -> Any:
    """Make ``cls`` an attrs component registered under ``tag`` (default ``!ClassName``).

    ``version`` (an int >= 1) is written into saved specs as ``xser_version``; a spec
    written by an older version is passed through ``migrate(args, old_version) -> args``
    before the constructor sees it; ``migrate_params(arrays, old_version) -> arrays`` does the same for
    the saved parameters (``{name: array}``: rename, reshape, split), read from disk when such a spec
    is loaded. Re-defining the same class (same module and
    qualified name, e.g. re-running a notebook cell) replaces the old registration;
    any other clash of tags is a ``RegistryError``.
    """

    def wrap(cls: T) -> T:
        name = tag if tag is not None else f"!{cls.__name__}"
        if not (isinstance(name, str) and name.startswith("!") and len(name) > 1 and " " not in name):
            raise RegistryError(f"{_qualname(cls)}: tag must look like '!Name', got {name!r}")
        if name in RESERVED_TAGS:
            raise RegistryError(f"{_qualname(cls)}: tag {name} is reserved by xser")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
            raise RegistryError(f"{_qualname(cls)}: version must be an int >= 1, got {version!r}")
        if migrate is not None and version is None:
            raise RegistryError(f"{_qualname(cls)}: migrate= needs version=")
        if migrate_params is not None and version is None:
            raise RegistryError(f"{_qualname(cls)}: migrate_params= needs version=")
        adapter = adapter_for(cls)
        if not attrs.has(cls):
            if adapter is not None:
                adapter.prepare(cls)
            cls = attrs.define(cls, slots=False, eq=False, **(adapter.define if adapter is not None else {}))
        elif "__slots__" in cls.__dict__:
            raise RegistryError(f"{_qualname(cls)}: attrs classes must use slots=False (xser keeps bookkeeping on the instance)")
        elif adapter is not None:
            raise RegistryError(f"{_qualname(cls)}: leave attrs to @xser.serializable on a {adapter.name} class (drop @attrs.define)")
        _bind_after_init(cls)
        for f in attrs.fields(cls):
            if f.name in RESERVED_KEYS or f.alias in RESERVED_KEYS:
                raise RegistryError(f"{_qualname(cls)}: field name {f.name!r} is reserved by xser")
        owner = PLUGIN_TAGS.get(name)  # a tag xser's own plugins register on first use: refused here, not there
        if owner is not None and cls.__module__ != owner and not cls.__module__.startswith(owner + "."):
            raise RegistryError(f"duplicate tag {name}: {_qualname(cls)} and the component {owner} registers; give "
                                f"{_qualname(cls)} its own tag: @xser.serializable(tag=\"!{cls.__name__}2\")")
        old = _BY_TAG.get(name)
        if old is not None and _qualname(old.cls) != _qualname(cls):
            raise RegistryError(f"duplicate tag {name}: {_qualname(cls)} and {_qualname(old.cls)}; give one of them its own "
                                f"tag: @xser.serializable(tag=\"!{cls.__name__}{'2' if name == '!' + cls.__name__ else ''}\")")
        if old is not None:
            _BY_CLASS.pop(old.cls, None)
            _HINTS.pop(old.cls, None)
        info = ComponentInfo(cls, name, version, migrate, adapter, migrate_params)
        _BY_TAG[name] = info
        _BY_CLASS[cls] = info
        return cls

    return wrap if cls is None else wrap(cls)


def _bind_after_init(cls: type) -> None:
    """Wrap ``cls.__init__`` so that, when a component is built, its subcollection records where
    the object keeps each parameter's array (``Subcollection.bind``): the next save can then tell
    an in-place update from a rebinding."""
    init = cls.__dict__.get("__init__")
    if init is None or getattr(init, "_xser_binds", False):
        return

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        info = _BY_CLASS.get(type(self))
        if info is not None and info.adapter is not None:
            info.adapter.after_init(self)
            return
        sub = self.__dict__.get("_xser_params")
        if sub is not None:
            sub.bind()

    __init__._xser_binds = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]


def lookup(tag: str, location: Any = None) -> ComponentInfo:
    """The class registered under ``tag``; an unknown tag is a ``SpecError`` with a suggestion."""
    info = _BY_TAG.get(tag)
    if info is None and tag in BUILTIN_ARGS:
        raise SpecError(f"{tag} is one of xser's own tags (arguments: {', '.join(BUILTIN_ARGS[tag])}), not a component class; "
                        "it cannot be used here", location)
    if info is None and plugin_tag(tag):  # !TorchModule, !AngelMatrix...: the module that defines it registers it
        info = _BY_TAG.get(tag)
    if info is None:
        hint = did_you_mean(tag, list(_BY_TAG) + sorted(PLUGIN_TAGS) + sorted(RESERVED_TAGS))
        if not hint:  # nothing close is registered: most likely its class's module was never imported
            hint = ("; import the module that defines its class before building or loading (xser.read_params and the "
                    "xser tools need no classes)")
        raise SpecError(f"unknown component {tag!r}{hint}", location)
    return info


def info_for(obj_or_cls: Any) -> ComponentInfo | None:
    """Registry entry of an instance or class, or ``None`` if it is not a component."""
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    return _BY_CLASS.get(cls)


def tag_of(obj: Any) -> str:
    info = info_for(obj)
    if info is None:
        raise RegistryError(f"{_qualname(type(obj))} is not an @xser.serializable class")
    return info.tag


def _unregister(tag: str) -> None:
    """Remove a registration (tests only)."""
    info = _BY_TAG.pop(tag, None)
    if info is not None:
        _BY_CLASS.pop(info.cls, None)
