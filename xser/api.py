"""The public verbs: ``load_config``, ``build``, ``save``, ``load``, ``resume``, ``read_params``, ``load_training_state``.

Readers open one checkpoint (a directory descriptor plus its manifest) and read its spec and
files through it, so a saver rotating checkpoints in another process never gives them a mix
of two checkpoints. If the checkpoint is deleted while it is read (pruned), they start over
from the model's name a few times before giving up with a ``CheckpointError``.
"""

from __future__ import annotations

import os

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from .dist import Coordinator, using
from .errors import CheckpointError, DataError, Frozen, Location, SpecError, did_you_mean, key_lists
from .storage.listing import open_checkpoint, selector
from .storage.named import read_named
from .storage.opened import CheckpointVanished, gather
from .storage.stores import options

if TYPE_CHECKING:
    from .model.build import ExperimentSpec
    from .storage.scanned import Best, Checkpoint

# Each verb imports the layers it needs when called: a process that only reads arrays imports storage alone.

__all__ = ["Resumed", "build", "load", "load_config", "load_into", "load_training_state", "read_params", "resume", "save"]

T = TypeVar("T")
#: times a reader starts over when the checkpoint it reads is pruned under it
RETRIES = 5


def retrying(path: str, fn: Callable[[], T]) -> T:
    """``fn()``, started over if the checkpoint it reads was removed meanwhile (a few times)."""
    for _ in range(RETRIES):
        try:
            return fn()
        except CheckpointVanished:
            continue
    raise CheckpointError(
        f"the checkpoint was removed while it was being read, {RETRIES} times in a row (a saver is pruning it); "
        "read an older checkpoint or keep more of them",
        Location(path),
    )


def load_config(path: str | os.PathLike, *, overrides: list[str] | None = None,
                storage_options: Mapping[str, Any] | None = None) -> ExperimentSet:
    """The experiments of a config file, ``{name: spec}`` in file order (unbuilt).

    A saved model's file gives its one experiment, with the spec its newest checkpoint was saved with, or the
    file itself when it was edited by hand since (see ``load``).
    ``overrides`` (``["small.model.hidden.out_dim=64", "+small.tag=x", "~small.dropout"]``, as Hydra users
    write them; ``xser.split_overrides(sys.argv[1:])`` takes them off a script's command line) change
    the experiments before they are built; their values are YAML, checked like values from the file,
    and errors name the override. ``storage_options``: for a config or model on an object store (a URL).
    """
    with options(storage_options):
        return _load_config(os.fspath(path), overrides)


def _load_config(path: str, overrides: list[str] | None) -> ExperimentSet:
    from .model.build import ExperimentSpec
    from .model.overrides import apply_overrides
    from .spec import read
    from .spec.saved import is_saved, open_saved
    from .storage.listing import refuse_slot
    refuse_slot(path)
    doc = read(path)
    if is_saved(doc):
        saved = open_saved(path)
        name = saved.name if saved.name is not None else os.path.basename(path)
        tree = {name: saved.experiment}
        if overrides:
            apply_overrides(tree, saved.doc, overrides)
        return ExperimentSet(path, {name: ExperimentSpec(saved.name, tree[name], saved.doc, path, saved.data, saved.sealed)})
    if doc.tree is None:
        return {}
    if not isinstance(doc.tree, dict):
        raise SpecError(
            f"a config file is a mapping of named experiments, got {type(doc.tree).__name__}", doc.where(doc.tree) or Location(path, 1, 1)
        )
    for name in doc.tree:
        if not isinstance(name, str):
            raise SpecError(f"experiment names must be strings, got {name!r}", doc.where(doc.tree, name, of_key=True))
    if overrides:
        apply_overrides(doc.tree, doc, list(overrides))
    return ExperimentSet(path, {name: ExperimentSpec(name, tree, doc, path) for name, tree in doc.tree.items()})


class ExperimentSet(dict):
    """``load_config``'s result: a dict of experiments whose missing key is an error listing them."""

    def __init__(self, path: str, items: dict) -> None:
        super().__init__(items)
        self.path = path

    def __missing__(self, key: Any) -> Any:
        raise SpecError(f"no experiment {key!r} in this config (experiments: {', '.join(map(str, self)) or 'none'})"
                        f"{did_you_mean(str(key), [str(k) for k in self])}", Location(self.path))


def build(spec: ExperimentSpec | Any, *, placeholders: dict[str, Any] | None = None, seed: Any = None,
          storage_options: Mapping[str, Any] | None = None, coordinator: Coordinator | None = None) -> Any:
    """Build the object graph of one experiment (parameters are numpy arrays).

    Components loaded with ``!LoadSerialized`` come from one whole checkpoint each; if one is
    pruned while it is read, the build starts over. ``storage_options``: for models it loads from an object store.
    ``coordinator``: the job this process is a rank of (``xser.dist.current()`` in the components' constructors,
    for ``add(..., rows=xser.dist.rows(n))``).
    """
    from .model.build import build as _build
    where = getattr(spec, "file", None) or "<spec>"
    with options(storage_options), using(coordinator):
        return retrying(where, lambda: _build(spec, placeholders=placeholders, seed=seed))


def save(
    obj: Any,
    path: str | os.PathLike,
    *,
    durable: bool = True,
    name: str | None = None,
    training: dict | None = None,
    custom: dict | None = None,
    blocks: dict | None = None,
    formats: dict | None = None,
    threads: int = 2,
    shards: int | None = None,
    pack: int | bool = True,
    storage_options: Mapping[str, Any] | None = None,
    coordinator: Coordinator | None = None,
) -> None:
    """Save ``obj`` as ``path`` (the spec) and ``path.data/`` (its parameters and its own spec copy).

    ``blocks`` maps ``"subcollection/param"`` glob patterns to a block size: an int (rows per
    block) or a tuple (rows, columns, ...). Matching parameters are stored as blocks of
    contiguous rows (or tiles), one file each, so that row ranges load without reading the rest.
    ``formats`` maps patterns to a weight format name (``"dense-text"``, ``"sparse-text"``, a
    registered one), or to ``(name, {options})`` such as ``("sparse-text", {"threshold": 1e-3})``;
    it overrides the format a component declared with ``add(..., format=...)``.

    Replaces the newest checkpoint by one atomic exchange; older ones (``.data.1``, ...) are
    kept and must still match the model. ``training`` and ``custom`` are JSON mappings stored
    in the manifest; xser never writes ``custom`` itself. A durable save fsyncs files and
    directories before it returns; ``durable=False`` skips that. ``threads`` files are written
    at once. By default (``pack=True``) the small arrays (stored as npy, not cut into blocks, under 1 MiB) go into
    packed safetensors containers (``model-000000-of-00000N.safetensors`` at the directory's root, about 64 MiB
    each, in save order); larger ones are one ``.npy`` file each. ``pack=n`` packs the arrays under n bytes;
    ``pack=False`` writes one ``.npy`` per array (the layout ``np.load`` reads file by file).
    ``shards=N`` packs every array stored as npy into at most N safetensors containers, balanced by bytes,
    each written by its own thread. The manifest records each packed array's file, offset and length (a row range
    reads only its bytes).
    ``coordinator=xser.dist.TorchDistributed()``, called on every rank of a job: one checkpoint from all of them,
    each rank writing its own rows, id slices and a share of the replicated arrays, rank 0 committing once
    (``docs/distributed.md``); every rank returns after the commit, or every rank raises.
    """
    from .checkpoints.saver import SaveOptions, save_model
    with options(storage_options, collect=False):
        save_model(obj, os.fspath(path), SaveOptions(durable, blocks, formats, threads, shards, pack), name=name, training=training,
                   custom=custom, coordinator=coordinator)


def load(
    path: str | os.PathLike,
    *,
    mmap: bool = False,
    strict: bool = True,
    verify: bool = False,
    checkpoint: int | str | Best = 0,
    metric: str | None = None,
    mode: str = "max",
    rows: dict | None = None,
    device: Any = None,
    tables: dict | None = None,
    missing: str = "error",
    storage_options: Mapping[str, Any] | None = None,
    coordinator: Coordinator | None = None, copy: bool = False,
) -> Any:
    """Build a saved model; its parameters come from ``path.data/`` (or checkpoint ``checkpoint``).

    ``mmap=True`` maps arrays copy-on-write (lazy, fast open). Without it numpy arrays are read, and torch tensors of local
    files are private copy-on-write maps (as ``safetensors.torch.load_file`` gives: writes stay in the process; a file
    truncated under it by another program gives ``SIGBUS``); ``copy=True`` reads them too. ``strict=False`` tolerates
    subcollections on disk that the spec does not use; a subcollection the spec needs but the data lacks is always an error.
    ``verify=True`` checks every file's checksum. The spec is the one the checkpoint was saved with, unless the file at ``path`` was
    edited by hand since (it equals no checkpoint's spec): then that file is built, checked against the
    checkpoint's data (a mismatch is a ``SpecError`` at the edit), with one warning (logger ``xser``) naming
    both files and the first line that differs. ``checkpoint=k`` loads the k-th newest checkpoint (0 = ``.data``); ``checkpoint="last"`` is the newest, ``checkpoint="best",
    metric="dev_bleu", mode="max"`` the one with the best recorded metric (the ranking ``KeepBest`` uses: missing or NaN values never count, ties go to the newer).
    ``rows={"subcol/param": (first, stop)}`` loads only those rows of those parameters (the component then holds a partial
    array: its first dimension is ``stop - first``).
    ``device`` (torch components): where their tensors go after they are read (default: the CPU).
    ``tables={"subcol/table": ids or xser.IdSlice(begin, end, size)}`` loads only those rows of hash tables
    (the ids given, or those with ``id % size`` in ``[begin, end)``: RecIS's resharding rule).
    ``missing="init"``: a parameter the code declares but the checkpoint lacks (added to the class since
    the save) starts from its declared ``init``, as does a new child component; what was initialised is
    logged as a warning (logger ``xser``). The default refuses, naming the parameter.
    ``coordinator``: the job this process is a rank of; components that declare ``add(..., rows=xser.dist.rows(n))``
    or ``add_table(..., slice=...)`` read only their rows and ids, at any world size (``docs/distributed.md``).
    """
    from .model.build import ExperimentSpec, build_spec
    from .spec.saved import open_saved

    path = os.fspath(path)
    checkpoint = selector(checkpoint, metric, mode, path)

    def once() -> Any:
        with open_saved(path, checkpoint) as saved:
            spec = ExperimentSpec(saved.name, saved.experiment, saved.doc, path, saved.data, saved.sealed)
            return build_spec(spec, mmap=mmap, verify=verify, strict=strict, rows=rows, device=device, tables=tables, missing=missing, copy=copy)

    with options(storage_options, collect=False), using(coordinator):
        return retrying(path, once)


def load_into(obj: Any, path: str | os.PathLike, *, checkpoint: int | str | Best = 0, metric: str | None = None, mode: str = "max",
              strict: bool = True, verify: bool = False, missing: str = "error",
              storage_options: Mapping[str, Any] | None = None) -> None:
    """Fill the parameters of an object already built (``obj``) in place from a saved model.

    Components are matched by their place in the object graph (``model.encoder``), parameters by
    name; arrays and tensors keep their identity, so an optimizer made before the load stays valid.
    A parameter the object has and the checkpoint lacks is an error; with ``strict`` (the default)
    so is one the checkpoint has and the object lacks. Both are listed, sorted, with the file.
    ``missing="init"`` keeps what the object holds for parameters the checkpoint lacks (logged).
    """
    from .model.serialize import subcols_by_path, to_tree
    from .spec.saved import open_saved

    path = os.fspath(path)
    checkpoint = selector(checkpoint, metric, mode, path)
    if missing not in ("error", "init"):
        raise DataError(f'missing must be "error" or "init", got {missing!r}', Location(path))
    _, live = to_tree(obj)

    def once() -> None:
        kept: list[str] = []
        with open_saved(path, checkpoint) as saved:
            data = saved.data
            stored = subcols_by_path(saved.experiment)
            plan = []
            for name, (sub, where) in live.items():
                key = "" if where == "the root" else where
                disk = stored.get(key)
                if disk is None or disk not in data.subcollections:
                    text = f"the saved model has no parameters for the component at {where} ({name})"
                    if saved.sealed is not None:
                        raise SpecError(f"{text}; {path} was edited since checkpoint {data.path} was saved and no longer matches "
                                        f"its data: undo the edit (the spec saved with the data is {saved.sealed})", Location(path))
                    raise DataError(text, Location(path))
                entries = data.subcollections[disk]
                have = set(sub.names())
                absent, unexpected = sorted(have - set(entries)), sorted(set(entries) - have)
                if absent and missing == "init":
                    kept.extend(f"{name}/{n}" for n in absent)
                    absent = []
                if absent or (strict and unexpected):
                    text = key_lists(absent, unexpected if strict else [])
                    raise DataError(f"{text} (component at {where})", Location(os.path.join(data.path, disk)))
                plan.append((sub, disk, [e for n, e in entries.items() if n in have]))
            if strict:
                unused = sorted(set(data.subcollections) - {disk for _, disk, _ in plan})
                if unused:
                    raise DataError(f"subcollections on disk are not used by the object: {', '.join(unused)} (strict=False ignores them)", Location(data.path))
            _refuse_mismatches(plan, live, saved.experiment, data.path)
            for sub, disk, entries in plan:
                arrays = gather(data.read_many(entries, verify=verify), {disk: {}})[disk]
                sub.fill(arrays, os.path.join(data.path, disk))
            if kept:
                import logging

                logging.getLogger("xser").warning("%s: not in the checkpoint, kept as the object holds them (missing=\"init\"): %s", data.path, ", ".join(kept))

    with options(storage_options):
        retrying(path, once)


def _refuse_mismatches(plan: list, live: dict, experiment: Any, datadir: str) -> None:
    """Before anything is read: every parameter whose shape or dtype the object cannot take, in one ``DataError``, by
    component, with the constructor arguments that differ from the saved ones."""
    from .model.serialize import arg_clause, saved_args
    parts = []
    for sub, disk, entries in plan:
        lines = sub.mismatches({e.name: (e.shape, e.dtype) for e in entries})
        if lines:
            where = live[sub.name][1]
            parts.append((where, disk, "; ".join(lines) + arg_clause(sub.owner, saved_args(experiment, disk))))
    if len(parts) == 1:
        where, disk, text = parts[0]
        raise DataError(f"{text} (component at {where})", Location(os.path.join(datadir, disk)))
    if parts:
        raise DataError("parameters differ from the checkpoint in shape or dtype: "
                        + " | ".join(f"component at {where} ({disk}): {text}" for where, disk, text in parts), Location(datadir))


def read_params(
    path: str | os.PathLike,
    *,
    names: Iterable[str] | None = None,
    mmap: bool = False,
    verify: bool = False,
    checkpoint: int | str | Best = 0,
    metric: str | None = None,
    mode: str = "max",
    rows: dict | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """``{subcollection: {param: array}}`` of a saved model, without building objects.

    ``names=["subcol/param", ...]`` reads only those parameters (the result holds only them): nothing else of the
    checkpoint is read or even checked but its manifest, so a few arrays of a large model cost those arrays (an
    unknown name is a ``DataError`` with the nearest known one). ``rows={"subcol/param": (first, stop)}`` reads only
    those rows of those parameters: only the blocks that overlap them, and inside each only their bytes.
    ``checkpoint``, ``metric`` and ``mode`` select a checkpoint as for ``load``. ``mmap=True`` maps the arrays
    (copy-on-write) instead of reading them; ``verify=True`` checks the checksum of every file read.
    """
    path = os.fspath(path)
    checkpoint = selector(checkpoint, metric, mode, path)
    if isinstance(names, str):
        raise DataError(f"names= is a list of \"subcollection/param\" names, got the string {names!r}", Location(path))
    wanted = None if names is None else list(dict.fromkeys(names))

    def once() -> Any:
        with open_checkpoint(path, checkpoint, lazy=wanted is not None) as data:
            if wanted is None:
                return data.read_all(mmap=mmap, verify=verify, rows=rows)
            return read_named(data, wanted, mmap=mmap, verify=verify, rows=data.check_row_keys(rows))

    with options(storage_options, collect=False):
        return retrying(path, once)


def load_training_state(path: str | os.PathLike, *, checkpoint: int | str | Best = 0, metric: str | None = None, mode: str = "max",
                        mmap: bool = False, storage_options: Mapping[str, Any] | None = None,
                        coordinator: Coordinator | None = None, rank_state: str = "error") -> Any:
    """The ``training_state`` saved with a checkpoint: arrays back as numpy arrays, tensors as tensors (on the CPU).

    A checkpoint saved by the ranks of a job (``save(..., coordinator=)``) holds one training state per rank (RNG
    states, data-loader positions): each rank gets its own, ``coordinator``'s rank (default: ``xser.dist.current()``,
    ``Local()`` outside a ``using`` block). The world size must be the one of the save: loaded by another number of
    processes (a plain one-process load of a multi-rank checkpoint included) it is a ``CheckpointError`` naming
    both world sizes, since no rank's state is another's. ``rank_state`` says what to do then instead:
    ``"drop"`` returns None (the caller starts the per-rank state afresh; the model itself loads at any world size);
    ``"replicate"`` gives the one state of a checkpoint saved by a single process to every rank (state that is
    the same on every rank, such as a replicated optimizer's; a multi-rank checkpoint still refuses). At the
    saving world size ``rank_state`` changes nothing (``docs/distributed.md``, "Loading at another world size").
    """
    from .checkpoints.rank_state import check_rank_state, rank_part, without
    path = os.fspath(path)
    checkpoint = selector(checkpoint, metric, mode, path)
    check_rank_state(rank_state, path)

    def once() -> Any:
        with open_checkpoint(path, checkpoint) as data:
            mine = rank_part(data, coordinator, rank_state, "training_state")
            if mine is None:
                absent = without(data, coordinator)  # None: dropped at another world size, as asked
                if absent is not None:
                    raise CheckpointError(absent, Location(data.path))
            return None if mine is None else _state_of(data, mmap, mine)

    with options(storage_options):
        return retrying(path, once)


def _state_of(data: Any, mmap: bool, part: tuple[Any, dict] | None = None) -> Any:
    from .model.adapters import array_kind
    from .storage import training_state
    tree, entries = part if part is not None else (data.manifest.state, data.manifest.state_entries)
    futs = data.read_many(entries.values(), mmap=mmap)
    arrays = gather(futs, {"training_state": {}})["training_state"]
    return training_state.decode(tree, arrays, array_kind)


class Resumed(Frozen):
    """What ``resume`` gives back: the model, its training state (None if saved without), the step and the checkpoint."""

    __slots__ = ("model", "training_state", "step", "checkpoint")
    model: Any
    training_state: Any
    step: int | None
    checkpoint: Checkpoint

    def __init__(self, model: Any, training_state: Any, step: int | None, checkpoint: Checkpoint) -> None:
        for name, value in zip(self.__slots__, (model, training_state, step, checkpoint)):
            object.__setattr__(self, name, value)


def resume(
    path: str | os.PathLike,
    *,
    checkpoint: int | str | Best = "last",
    metric: str | None = None,
    mode: str = "max",
    mmap: bool = False,
    verify: bool = False,
    device: Any = None,
    storage_options: Mapping[str, Any] | None = None,
    coordinator: Coordinator | None = None,
    rank_state: str = "error",
) -> Resumed | None:
    """Continue a run: the saved model, its ``training_state``, step and checkpoint record, all from one
    checkpoint (the newest by default; see ``load`` for ``checkpoint``, ``metric``, ``mode``); ``None``
    if nothing was saved at ``path`` yet (start fresh).

    Nothing saved means neither the spec file nor any checkpoint exists; a spec file without data,
    or damaged data, is an error as for ``load``, never a silent fresh start.

    ``coordinator``: the job this process is a rank of (as for ``load``: each rank loads its rows and ids). Of a
    checkpoint saved by the ranks of a job, each rank gets its own ``training_state`` and, as
    ``.checkpoint.training``, its own ``training`` dict. At another world size than the save's this is a
    ``CheckpointError`` naming both (before anything is read) if any rank saved a training state or the ranks'
    ``training`` dicts differ; ``rank_state="drop"`` resumes without them (``training_state`` None, ``training``
    the entries every rank saved alike), ``rank_state="replicate"`` gives a state saved by one process to every
    rank (see ``load_training_state``).
    """
    import attrs

    from .checkpoints.rank_state import check_rank_state, rank_part, rank_training
    from .model.build import ExperimentSpec, build_spec
    from .spec.saved import open_saved
    from .storage.listing import checkpoint_record, checkpoints_exist
    from .storage.stores import store_for

    path = os.fspath(path)
    checkpoint = selector(checkpoint, metric, mode, path)
    check_rank_state(rank_state, path)
    with options(storage_options):
        if not store_for(path).exists(path) and not checkpoints_exist(path):
            return None

    def once() -> Resumed:
        with open_saved(path, checkpoint) as saved:
            data = saved.data
            mine = rank_part(data, coordinator, rank_state, "resume")  # refused before the model is read
            spec = ExperimentSpec(saved.name, saved.experiment, saved.doc, path, data, saved.sealed)
            model = build_spec(spec, mmap=mmap, verify=verify, device=device)
            state = _state_of(data, mmap, mine) if mine is not None else None
            record = checkpoint_record(data)
            index = data.index or 0  # its place in the listing it was chosen from
            if data.manifest.ranks:  # this rank's own training dict (at another world size: what every rank saved alike)
                record = attrs.evolve(record, training=rank_training(data, coordinator))
        return Resumed(model, state, record.step, attrs.evolve(record, index=index))

    with options(storage_options, collect=False), using(coordinator):
        return retrying(path, once)
