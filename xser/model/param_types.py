"""Types of the parameter API for type checkers: what ``xser.params(owner)`` and its ``add`` give.

``add`` on a numpy component returns an array whose dtype type checkers know (``NDArray[np.float32]``
by default, ``NDArray[np.float64]`` for ``dtype=np.float64`` or ``"float64"``); ``xser.params`` of a
``torch.nn.Module`` is a ``TorchParams``, whose ``add`` returns a ``torch.Tensor``. Nothing here
imports torch: a torch module is recognised by its shape (``register_parameter``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, Union

import attrs
import numpy as np

if TYPE_CHECKING:
    import torch
    from typing_extensions import Unpack

    from .tables import HashTable

__all__ = ["AddOptions", "ParamDecl", "ShapeLike", "TorchLike", "TorchParams"]


@attrs.frozen
class ParamDecl:
    """A declared parameter: name, shape, dtype, whether it is trained, and its weight format."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    trainable: bool
    format: str | None = None  # weight format to store it in (None: npy, or what save() says)

#: a shape as ``add`` takes it: an int (one dimension) or a sequence of ints
ShapeLike = Union[int, tuple[int, ...], list[int]]


class AddOptions(TypedDict, total=False):
    """The keyword arguments of ``add`` besides ``dtype``."""

    init: str | Callable[..., Any] | np.ndarray
    trainable: bool
    format: str | None
    rows: tuple[int, int] | None


class TorchLike(Protocol):
    """What type checkers take for a ``torch.nn.Module`` (without importing torch)."""

    def register_parameter(self, name: str, param: Any, /) -> None: ...


class TorchParams(Protocol):
    """``xser.params(module)`` of a torch component: its state, live; ``add`` registers a Parameter (or a buffer)."""

    name: str

    def add(self, name: str, shape: ShapeLike, *, dtype: Any = ..., **options: Unpack[AddOptions]) -> torch.Tensor: ...

    def add_table(self, name: str, dim: Any, *, dtype: Any = ..., slots: Any = ..., init: Any = ...) -> HashTable: ...

    def __getitem__(self, name: str) -> torch.Tensor: ...

    def __setitem__(self, name: str, value: Any) -> None: ...

    def __contains__(self, name: object) -> bool: ...

    def __iter__(self) -> Iterator[str]: ...

    def __len__(self) -> int: ...

    def items(self) -> Iterator[tuple[str, torch.Tensor]]: ...

    def names(self) -> list[str]: ...

    @property
    def decls(self) -> dict[str, ParamDecl]: ...

    @property
    def tables(self) -> dict[str, HashTable]: ...
