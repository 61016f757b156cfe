"""The write plan of a data directory: which piece goes to which file in which format.

Pure: no I/O. The planner names files so that several writers never collide (a block file is
named after its start in every dimension, ``W@4096_0.npy``), picks each piece's format from the
``formats`` patterns, cuts arrays into blocks from the ``blocks`` patterns, and marks the
previous checkpoint's file with the same place and shape as a link candidate (the writer links
it when the bytes turn out equal).
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import math
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from ..errors import DataError, did_you_mean
from .formats import FORMATS, get_format
from .manifest import SPEC_FILE, STATE_DIR
from .dtypes import find
from .payloads import Bundle, FromFile, FromFiles, Lazy, Stream, identity

__all__ = ["CONTAINER_BYTES", "PACK_BELOW", "PACK_MIN_ARRAYS", "Piece", "Plan", "PlannedParam", "block_size_for", "format_for", "pack_limit",
           "place", "plan_save"]

#: by default an array stored as npy, not cut into blocks, of fewer bytes than this goes into a packed container
PACK_BELOW = 1 << 20
#: a default packed container is cut once it holds this many bytes (the arrays are dealt in save order)
CONTAINER_BYTES = 64 << 20
#: default packing packs only when a save has at least this many such small arrays (fewer files cost little)
PACK_MIN_ARRAYS = 64


@attrs.frozen
class Piece:
    """One file of the new data directory and what goes into it."""

    rel: str
    payload: Any = attrs.field(eq=False)  # np.ndarray | Stream | FromFile | bytes
    format: str = "npy"
    options: dict = attrs.field(factory=dict)
    link: tuple | None = attrs.field(default=None, eq=False)  # (opened previous dir, Block): link if equal


@attrs.frozen
class PlannedParam:
    sub: str
    name: str
    dtype: np.dtype
    shape: tuple
    trainable: bool
    pieces: tuple  # ((piece index, start or None, block shape or None, key in the file or None), ...)
    attrs: dict = attrs.field(factory=dict, eq=False)  # carried into the manifest entry as it is


@attrs.frozen
class Plan:
    dirs: tuple[str, ...]  # subdirectories, in order (one per subcollection, then training_state)
    pieces: tuple[Piece, ...]
    params: tuple[PlannedParam, ...]
    subcollections: tuple[str, ...]  # every subcollection, empty ones too, in save order
    spec: int | None = None  # index of the spec file's piece
    state_tree: Any = None
    state: tuple[PlannedParam, ...] | None = None  # training-state arrays (sub = "training_state")


class Patterns:
    """Glob patterns in order, the first that matches a key wins: looked up in O(1) for the patterns without glob
    characters (a component's declared formats: one per parameter) plus one ``fnmatch`` per real glob, never one
    per pattern (that would be O(n^2) over a model's parameters)."""

    def __init__(self, patterns: Mapping[str, Any] | None) -> None:
        self.exact: dict[str, tuple[int, str, Any]] = {}
        self.globs: list[tuple[int, str, Any]] = []
        for i, (pattern, value) in enumerate((patterns or {}).items()):
            if any(c in pattern for c in "*?["):
                self.globs.append((i, pattern, value))
            else:
                self.exact.setdefault(pattern, (i, pattern, value))

    def __bool__(self) -> bool:
        return bool(self.exact or self.globs)

    def match(self, key: str) -> tuple[str, Any] | None:
        """(pattern, value) of the first pattern matching ``key``, or None."""
        best = self.exact.get(key)
        for g in self.globs:
            if best is not None and g[0] > best[0]:
                break
            if fnmatch.fnmatchcase(key, g[1]):
                return g[1], g[2]
        return None if best is None else (best[1], best[2])


def _as_patterns(patterns: Any) -> Patterns:
    return patterns if isinstance(patterns, Patterns) else Patterns(patterns)


def format_for(formats: Mapping[str, Any] | Patterns | None, key: str) -> tuple[str, dict]:
    """(format name, write options) the ``formats`` patterns give ``sub/param``; npy by default."""
    hit = _as_patterns(formats).match(key) if formats else None
    if hit is not None:
        pattern, spec = hit
        name, options = (spec, {}) if isinstance(spec, str) else (spec[0], dict(spec[1]))
        if not isinstance(name, str) or get_format(name) is None:
            raise DataError(f"unknown weight format {name!r} for {pattern!r} (known: {', '.join(sorted(FORMATS))}){did_you_mean(str(name), FORMATS)}")
        return name, options
    return "npy", {}


def block_size_for(blocks: Mapping[str, Any] | Patterns | None, key: str) -> tuple | None:
    """The block size (rows, or rows and columns, ...) the ``blocks`` patterns give ``sub/param``."""
    hit = _as_patterns(blocks).match(key) if blocks else None
    if hit is None:
        return None
    pattern, size = hit
    if isinstance(size, list):  # explicit row ranges: [(first, count), ...], contiguous from 0
        ranges = [tuple(int(x) for x in r) for r in size]
        if not ranges or any(len(r) != 2 or r[1] < 1 for r in ranges) or any(
            b[0] != a[0] + a[1] for a, b in zip(ranges, ranges[1:])
        ) or ranges[0][0] != 0:
            raise DataError(f"row ranges for {pattern!r} must be contiguous (first, count) pairs from row 0, got {size!r}")
        return tuple(ranges)
    size = (size,) if isinstance(size, int) else tuple(size)
    if not size or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in size):
        raise DataError(f"block size for {pattern!r} must be an int >= 1 or a tuple of them, got {size!r}")
    return size


def block_name(base: str, start: tuple, suffix: str) -> str:
    """``sub/W@4096_0.npy``: a block is named after its start, so writers never collide."""
    return f"{base}@{'_'.join(str(int(a)) for a in start)}{suffix}"


def _cut(base: str, item: Any, block: tuple | None, suffix: str) -> list[tuple[str, tuple | None, tuple | None, Any]]:
    """(relative file, start, block shape, payload) for each file a parameter is stored in."""
    if isinstance(item, FromFiles):
        return [(block_name(base, f.start, FORMATS[f.format].suffix), f.start, f.shape, f) for f in item.blocks]
    if isinstance(item, FromFile):
        return [(f"{base}{FORMATS[item.format].suffix}", None, None, item)]
    if not isinstance(item, (np.ndarray, Lazy)) or block is None or len(item.shape) == 0:
        return [(f"{base}{suffix}", None, None, item)]
    if isinstance(item, Lazy):  # each block copied to the host on its own
        return [(rel, start, shape, attrs.evolve(item, shape=shape, take=functools.partial(item.take, index), key=None))
                for rel, start, shape, index in _boxes(base, item.shape, block, suffix)]
    return [(rel, start, shape, item[index]) for rel, start, shape, index in _boxes(base, item.shape, block, suffix)]


def _boxes(base: str, full: tuple, block: tuple, suffix: str) -> list[tuple[str, tuple, tuple, tuple]]:
    """(relative file, start, shape, index) of each block of an array of shape ``full``."""
    if block and isinstance(block[0], tuple):  # explicit row ranges [(first, count), ...]
        out = []
        for first, count in block:
            start = (first,) + (0,) * (len(full) - 1)
            out.append((block_name(base, start, suffix), start, (count,) + tuple(full[1:]), (slice(first, first + count),)))
        return out
    steps = tuple(block) + tuple(full[len(block):])
    ranges = [range(0, max(n, 1), max(step, 1)) for n, step in zip(full, steps)]
    out = []
    for start in itertools.product(*ranges):
        shape = tuple(min(step, n - a) for a, step, n in zip(start, steps, full))
        out.append((block_name(base, tuple(start), suffix), tuple(start), shape, tuple(slice(a, a + n) for a, n in zip(start, shape))))
    return out


def _link_candidate(previous: Any, sub: str, name: str, payload: Any, fmt: str, start: tuple | None, shape: tuple | None) -> tuple | None:
    """The previous checkpoint's block with the same place, shape and format, if any."""
    if previous is None or not isinstance(payload, np.ndarray) or not hasattr(FORMATS[fmt], "digest"):
        return None
    entry = previous.subcollections.get(sub, {}).get(name)
    if entry is None or entry.dtype != payload.dtype:
        return None
    for b in entry.blocks:
        if b.format == fmt and b.start == start and b.box(entry.shape)[1] == (shape if shape is not None else payload.shape):
            return previous, b
    return None


def _deal(sizes: list[int], shards: int | None) -> tuple[int, list[int]]:
    """(number of containers, container of each packed array). ``shards=N``: at most N containers balanced by bytes
    (largest first, to the lightest one: never an empty file). None (default packing): in save order, a container
    cut once it holds ``CONTAINER_BYTES``, so one model's arrays fall into the same containers save after save (an
    unchanged container is linked to the previous checkpoint's)."""
    if shards is None:
        where, n, held = [], 0, 0
        for size in sizes:
            if held and held + size > CONTAINER_BYTES:
                n, held = n + 1, 0
            where.append(n)
            held += size
        return n + 1, where
    n = min(shards, len(sizes))
    if n == 1:
        return 1, [0] * len(sizes)
    load = [0] * n
    where = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        b = min(range(n), key=lambda k: (load[k], k))
        where[i] = b
        load[b] += sizes[i]
    return n, where


def _pack(packed: list, shards: int | None, pieces: list, params: list, previous: Any) -> list:
    """Deal the packed arrays to containers (``_deal``), append one piece per container, and point the parameters'
    references (``-1 - i``: the i-th packed array) at them."""
    n, where = _deal([math.prod(p.shape) * np.dtype(p.dtype).itemsize for _, p in packed], shards)
    names = [f"model-{i:06d}-of-{n:06d}.safetensors" for i in range(n)]
    first = len(pieces)
    bins: list[dict] = [{} for _ in range(n)]
    for i, (key, payload) in enumerate(packed):
        bins[where[i]][key] = payload
    for name, arrays in zip(names, bins):
        pieces.append(Piece(name, Bundle(arrays), "safetensors", {}, _file_link(previous, name)))
    return _point(params, lambda r: (first + where[-1 - r[0]], *r[1:]))


def _unpack(packed: list, pieces: list, params: list, previous: Any) -> list:
    """Fewer small arrays than ``PACK_MIN_ARRAYS``: each in its own ``.npy`` file after all."""
    first = len(pieces)
    for key, item in packed:
        sub, _, name = key.partition("/")
        pieces.append(Piece(f"{key}.npy", item, "npy", {}, _link_candidate(previous, sub, name, item, "npy", None, None)))
    return _point(params, lambda r: (first - 1 - r[0], None, None, None))


def _point(params: list, ref: Any) -> list:
    """The parameters, their references to packed arrays (``-1 - i``: the i-th) replaced by ``ref(reference)``. The
    planner's own new objects are updated in place (no second object per parameter)."""
    for p in params:
        refs = p.pieces
        if refs[0][0] < 0 or (len(refs) > 1 and any(r[0] < 0 for r in refs)):
            object.__setattr__(p, "pieces", tuple(ref(r) if r[0] < 0 else r for r in refs))
    return params


def pack_limit(pack: Any) -> int:
    """The byte limit below which arrays are packed: ``pack=True`` (the default) ``PACK_BELOW``, ``False`` or 0 none
    (one ``.npy`` file per array), an int that many bytes."""
    if pack is True:
        return PACK_BELOW
    if pack is False or pack is None:
        return 0
    if not isinstance(pack, int) or pack < 0:
        raise DataError(f"pack must be True, False or a byte size >= 0, got {pack!r}")
    return pack


_PACKABLE: dict[np.dtype, bool] = {}


def _packable(dtype: np.dtype) -> bool:
    """Whether default packing may put an array of this dtype in a safetensors container (safetensors has a dtype
    for it; big-endian arrays keep their own ``.npy`` file, which holds their bytes as they are)."""
    ok = _PACKABLE.get(dtype)
    if ok is None:
        d = find(dtype)
        ok = d is not None and d.safetensors is not None and dtype.byteorder != ">"
        if len(_PACKABLE) < 4096:  # (record dtypes are without number)
            _PACKABLE[dtype] = ok
    return ok


def _file_link(previous: Any, rel: str) -> tuple | None:
    """The previous checkpoint's file of this name that holds several tensors (a subcollection's safetensors file or
    a packed container): linked if the new one has the same bytes. Only its own subcollection is searched when the
    name is inside one."""
    if previous is None:
        return None
    sub, slash, _ = rel.partition("/")
    for entries in [previous.subcollections.get(sub, {})] if slash else previous.subcollections.values():
        for entry in entries.values():
            for b in entry.blocks:
                if b.file == rel and b.key is not None:
                    return previous, b
    return None


def plan_save(
    arrays: Mapping[str, Mapping[str, tuple[Any, bool]]],
    *,
    spec_text: str | None = None,
    state_tree: Any = None,
    state_arrays: Mapping[str, Any] | None = None,
    formats: Mapping[str, Any] | None = None,
    blocks: Mapping[str, Any] | None = None,
    previous: Any = None,
    shards: int | None = None,
    pack: int | bool = True,
) -> Plan:
    """The plan for ``arrays`` (``{sub: {param: (array | Stream | FromFile | FromFiles, trainable[, attrs])}}``).

    By default (``pack=True``) the arrays stored as npy, not cut into blocks, of fewer than ``PACK_BELOW`` bytes (a
    safetensors dtype, not big-endian, not in Fortran order) go into packed safetensors containers,
    ``model-%06d-of-%06d.safetensors`` of about ``CONTAINER_BYTES`` each, dealt in save order, when there are at
    least ``PACK_MIN_ARRAYS`` of them (fewer: one ``.npy`` each); ``pack=n`` packs those under n bytes, ``pack=False``
    none (one ``.npy`` per array). ``shards=N`` packs every array stored as npy (blocks included) into at most N
    containers, balanced by bytes. Each container is one piece (one writer).
    """
    if shards is not None and (not isinstance(shards, int) or isinstance(shards, bool) or shards < 1):
        raise DataError(f"shards must be an int >= 1, got {shards!r}")
    limit = pack_limit(pack)
    pieces: list[Piece] = []
    packed: list[tuple[str, Any]] = []  # (key in the container, array or Lazy): placed after every parameter is seen
    params: list[PlannedParam] = []
    dirs: list[str] = []

    bundles: dict[tuple, int] = {}  # (subcollection, format) or (source, file): the piece of a file holding several tensors

    def add(sub: str, name: str, item: Any, trainable: bool, fmt: str, options: dict, block: tuple | None, prev: Any,
            pack: bool = True) -> PlannedParam:
        refs = []
        dtype, shape = np.dtype(item.dtype), tuple(item.shape)
        if isinstance(item, FromFile) and item.key is not None:  # a tensor of a published bundle: link the file once
            at = bundles.get((id(item.source), item.rel))
            if at is None:
                at = bundles[(id(item.source), item.rel)] = len(pieces)
                pieces.append(Piece(f"{sub}/{item.rel.rpartition('/')[2]}", item, item.format))
            return PlannedParam(sub, name, dtype, shape, bool(trainable), ((at, None, None, item.key),))
        if getattr(FORMATS[fmt], "bundle", False) and isinstance(item, (np.ndarray, Lazy)):
            if block is not None:
                raise DataError(f"{sub}/{name}: blocks= cannot cut a parameter stored as {fmt} (row ranges of it read only their bytes anyway)")
            at = bundles.get((sub, fmt))
            if at is None:
                at = bundles[(sub, fmt)] = len(pieces)
                rel = f"{sub}/params{FORMATS[fmt].suffix}"
                pieces.append(Piece(rel, Bundle({}), fmt, options, _file_link(prev, rel)))
            pieces[at].payload.arrays[name] = item
            return PlannedParam(sub, name, dtype, shape, bool(trainable), ((at, None, None, name),))
        if pack and fmt == "npy" and isinstance(item, (np.ndarray, Lazy)):
            if shards is not None:
                for rel, start, bshape, payload in _cut(f"{sub}/{name}", item, block, ""):
                    refs.append((-1 - len(packed), start, bshape, rel))
                    packed.append((rel, payload))
                return PlannedParam(sub, name, dtype, shape, bool(trainable), tuple(refs))
            if block is None and math.prod(shape) * dtype.itemsize < limit and _packable(dtype) and not (
                    isinstance(item, np.ndarray) and item.flags.f_contiguous and not item.flags.c_contiguous):
                # (a Fortran-ordered array keeps its .npy file, which loads it in Fortran order)
                key = f"{sub}/{name}"
                packed.append((key, item))
                return PlannedParam(sub, name, dtype, shape, bool(trainable), ((-len(packed), None, None, key),))
        for rel, start, bshape, payload in _cut(f"{sub}/{name}", item, block, FORMATS[fmt].suffix):
            pfmt = payload.format if isinstance(payload, FromFile) else ("npy" if isinstance(payload, Stream) else fmt)
            link = _link_candidate(prev, sub, name, payload, pfmt, start, bshape)
            refs.append((len(pieces), start, bshape, None))
            pieces.append(Piece(rel, payload, pfmt, options if pfmt == fmt else {}, link))
        return PlannedParam(sub, name, dtype, shape, bool(trainable), tuple(refs))

    stored: dict[Any, PlannedParam] = {}  # memory already planned (tied weights) -> its plan
    formats, blocks = Patterns(formats), Patterns(blocks)
    ndarray = np.ndarray
    for sub, items in arrays.items():
        dirs.append(sub)
        for name, spec in items.items():
            item, trainable, extra = spec if len(spec) == 3 else (*spec, None)
            key = f"{sub}/{name}"
            fmt, options = format_for(formats, key) if formats else ("npy", {})
            if not isinstance(item, (ndarray, Lazy)):
                fmt, options = "npy", {}
            block = block_size_for(blocks, key) if blocks else None
            same = identity(item)
            if same is not None:
                same = (same, fmt, repr(options) if options else "", block)
                first = stored.get(same)
                if first is not None:  # one tensor under two names: stored once, both entries name its files
                    params.append(attrs.evolve(first, sub=sub, name=name, trainable=bool(trainable), attrs=dict(extra or {})))
                    continue
            if (limit and shards is None and fmt == "npy" and block is None and type(item) is ndarray
                    and item.nbytes < limit and _packable(item.dtype) and (item.flags.c_contiguous or not item.flags.f_contiguous)):
                packed.append((key, item))  # the common case, without add()'s questions
                params.append(PlannedParam(sub, name, item.dtype, item.shape, bool(trainable), ((-len(packed), None, None, key),)))
            else:
                params.append(add(sub, name, item, trainable, fmt, options, block, previous))
            if extra:
                params[-1] = attrs.evolve(params[-1], attrs=dict(extra))
            if same is not None:
                stored[same] = params[-1]
    if packed and shards is None and len(packed) < PACK_MIN_ARRAYS:
        params = _unpack(packed, pieces, params, previous)
    elif packed:
        params = _pack(packed, shards, pieces, params, previous)
    spec = None
    if spec_text is not None:
        spec = len(pieces)
        link = (previous, previous.manifest.spec) if previous is not None and previous.manifest.spec is not None else None
        pieces.append(Piece(SPEC_FILE, spec_text.encode("utf-8"), "spec", link=link))
    state = None
    if state_arrays is not None:
        dirs.append(STATE_DIR)
        state = tuple(add(STATE_DIR, key, value, False, "npy", {}, None, None, pack=False) for key, value in state_arrays.items())
    return Plan(tuple(dirs), tuple(pieces), tuple(params), tuple(arrays), spec, state_tree, state)


def place(plan: Plan, at: Mapping[str, tuple[int, tuple]], tag: str) -> Plan:
    """One rank's plan inside a checkpoint that several ranks write: ``at`` maps ``"sub/param"`` to (first row, full
    shape) for the arrays that hold rows of a larger parameter; their blocks start at that row and files of their own
    are named after their start in the whole parameter (``W@4096_0.npy``: ranks never collide, the tiling is checked
    first). Files holding several tensors (a subcollection's safetensors file, ``shards=`` containers) take the rank's
    ``tag`` in their names."""
    pieces = list(plan.pieces)
    params = []
    for p in plan.params:
        spec = at.get(f"{p.sub}/{p.name}")
        if spec is None:
            params.append(p)
            continue
        first, full = spec
        refs = []
        for index, start, bshape, key in p.pieces:
            here = (first + (start[0] if start is not None else 0),) + (tuple(start[1:]) if start is not None else (0,) * (len(full) - 1))
            shape = tuple(bshape) if bshape is not None else tuple(p.shape)
            if key is None:
                piece = pieces[index]
                pieces[index] = attrs.evolve(piece, rel=block_name(f"{p.sub}/{p.name}", here, FORMATS[piece.format].suffix))
            refs.append((index, here, shape, key))
        params.append(attrs.evolve(p, shape=tuple(full), pieces=tuple(refs)))
    for i, piece in enumerate(pieces):
        if isinstance(piece.payload, Bundle):
            head, slash, name = piece.rel.rpartition("/")
            stem, dot, suffix = name.partition(".")
            pieces[i] = attrs.evolve(piece, rel=f"{head}{slash}{stem}-{tag}{dot}{suffix}")
    return attrs.evolve(plan, pieces=tuple(pieces), params=tuple(params))
