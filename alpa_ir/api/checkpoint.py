"""Checkpoints of a training state on orbax-checkpoint, independent of the plan.

    alpa_ir.save_checkpoint("ckpt", state, step=2)
    state = alpa_ir.restore_checkpoint("ckpt", target=executable)

A checkpoint is an orbax ``CheckpointManager`` directory: one committed step
(``ckpt/2/``) holding two items, ``state`` (every array leaf, saved by orbax
from the shards each process holds, never gathered: multi-host saves each
host's shards) and ``manifest`` (JSON: the pytree structure as text, each
leaf's path, shape, dtype and checksum). Only global values are stored, never
a mesh or a sharding, so a checkpoint written under one plan (ZeRO-3 on
(1, 4), a pipeline over several meshes, several hosts) restores under any
other: orbax reads, for each device of the target placement, its slice.

Safety, by orbax's commit protocol: a step is written into a temporary
directory and renamed once complete, so a save killed mid-write leaves the
previous step restorable, and the next save (or restore) clears the debris;
overwriting writes the new step first and deletes the old one only once the
new one is committed, so the path always holds a complete checkpoint.
Integrity: every leaf carries a checksum of its values and their positions
(a sum over elements, so any sharding computes the same), checked after each
restore; a file that was edited, truncated or removed, a manifest that does
not parse or does not match the data give a one-line
:class:`~alpa_ir.errors.AlpaError` naming the checkpoint and the leaf.
Restoring never imports a module named in the data (node types resolve only
among loaded types, see :mod:`alpa_ir.frontend.pytree_codec`).

Leaves: arrays (any dtype; PRNG keys as their key data, restored as keys),
Python ints (restored as 0-d arrays); leaves that are not arrays (an equinox
module's functions, Python bools and floats) are written into the manifest
when they are literals and otherwise come from ``target``.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.frontend.pytree_codec import (
    decode_treedef,
    encode_treedef,
    flat_names,
    is_array_leaf,
)

FORMAT = "alpa_ir.api.checkpoint"
VERSION = 2
_MASK = (1 << 64) - 1


def _orbax() -> Any:
    import orbax.checkpoint as ocp

    logging.getLogger("absl").setLevel(logging.WARNING)
    return ocp


def _manager(path: Path, *, create: bool) -> Any:
    ocp = _orbax()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=1, create=create, cleanup_tmp_directories=True
    )
    return ocp.CheckpointManager(path.resolve(), options=options)


# --------------------------------------------------------------------------- checksums


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 of each element (uint64, wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _bits(data: np.ndarray) -> np.ndarray:
    """Each element's bits as uint64."""
    flat = np.ascontiguousarray(data).reshape(-1)
    width = flat.dtype.itemsize
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(width)
    if unsigned is None:  # complex128 & co: fold the words
        words = flat.view(np.uint64).reshape(flat.size, -1)
        return np.bitwise_xor.reduce(words, axis=1)
    return flat.view(unsigned).astype(np.uint64)


def _block_sum(data: np.ndarray, index: tuple[slice, ...], shape: tuple[int, ...]) -> int:
    """Σ mix(global flat index, bits) over one block of a global array."""
    if data.size == 0:
        return 0
    ranges = [
        np.arange(s.start or 0, (s.start or 0) + n) for s, n in zip(index, data.shape, strict=True)
    ]
    grids = np.meshgrid(*ranges, indexing="ij") if ranges else []
    flat = (
        np.ravel_multi_index([g.reshape(-1) for g in grids], shape).astype(np.uint64)
        if ranges
        else np.zeros(1, np.uint64)
    )
    with np.errstate(over="ignore"):
        mixed = _mix(flat * np.uint64(0x100000001B3) + _bits(data))
    return int(mixed.sum(dtype=np.uint64))


def checksum(value: Any) -> int:
    """A checksum of an array's values and positions that every sharding of it
    gives alike: the sum, over elements, of a 64-bit mix of (index, bits); each
    process adds its replica-0 shards, the processes' sums are added."""
    if isinstance(value, jax.Array):
        shape = tuple(value.shape)
        total = 0
        for shard in value.addressable_shards:
            if shard.replica_id == 0:
                index = tuple(shard.index) or ()
                total += _block_sum(np.asarray(shard.data), index, shape)
        total &= _MASK
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            # as two 32-bit halves: without x64, JAX would cut a uint64 to 32 bits
            halves = np.array([total >> 32, total & 0xFFFFFFFF], np.uint32)
            parts = np.asarray(multihost_utils.process_allgather(halves), np.uint64).reshape(-1, 2)
            with np.errstate(over="ignore"):
                total = int(((parts[:, 0] << np.uint64(32)) | parts[:, 1]).sum(dtype=np.uint64))
        return total & _MASK
    data = np.asarray(value)
    return _block_sum(data, tuple(slice(0, n) for n in data.shape), tuple(data.shape)) & _MASK


# --------------------------------------------------------------------------- leaves


def _is_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _literal(value: Any) -> Any:
    """``value`` as a JSON/Python literal, or raise ValueError."""
    text = repr(value)
    if ast.literal_eval(text) != value:
        raise ValueError(text)
    return text


def _leaf_paths(state: Any) -> list[str]:
    return flat_names((state,), ["state"])


# --------------------------------------------------------------------------- save


def save_checkpoint(
    path: str | os.PathLike[str],
    state: Any,
    step: int | None = None,
    *,
    overwrite: bool = False,
    on: Any = None,
) -> Path:
    """Write ``state`` (any pytree of arrays, sharded in any way, on any number
    of processes) to the checkpoint directory ``path``; ``step`` is recorded.
    A path that already holds a checkpoint is an error unless ``overwrite``.
    With ``on`` (a pipeline executable on the ray backend) its hosts write it
    together, each the shards its devices hold: every array is split over
    all the hosts' devices for writing (along its largest dimension they
    divide, else kept whole) and the path must be on a file system every
    host sees. Returns the directory."""
    where = Path(path)
    if where.exists() and not where.is_dir():
        raise AlpaError(f"checkpoint path {where} exists and is not a directory")
    for parent in where.absolute().parents:  # the nearest existing one must be a directory
        if parent.exists():
            if not parent.is_dir():
                raise AlpaError(f"cannot save checkpoint {where}: {parent} is not a directory")
            break
    latest = _latest_step(where) if where.is_dir() else None
    if latest is not None and not overwrite:
        raise AlpaError(f"checkpoint directory {where} already exists (pass overwrite=True)")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise AlpaError(f"save_checkpoint: step must be an int >= 0, got {step!r}")
    leaves, treedef = jax.tree.flatten(state)
    names = _leaf_paths(state)
    statics = {k: x for k, x in enumerate(leaves) if not is_array_leaf(x)}
    entries: list[dict[str, Any]] = []
    arrays: dict[str, Any] = {}
    for k, (leaf, name) in enumerate(zip(leaves, names, strict=True)):
        if k in statics:
            entry: dict[str, Any] = {"path": name, "kind": "static"}
            try:
                entry["value"] = _literal(leaf)
            except (ValueError, SyntaxError, TypeError, RecursionError):
                entry["value"] = None  # a function or an object: comes from the target
            entries.append(entry)
            continue
        if isinstance(leaf, jax.Array) and leaf.is_deleted():
            raise AlpaError(
                f"cannot save {where}: leaf {name} was deleted (donated to a step that "
                "consumed it); save the state the step returned"
            )
        value = leaf
        kind = "array"
        impl = None
        if _is_key(leaf):
            kind, impl = "key", str(jax.random.key_impl(leaf))
            value = jax.random.key_data(leaf)
        elif not isinstance(leaf, jax.Array | np.ndarray):
            kind = "python" if isinstance(leaf, int | float | complex) else "array"
            value = np.asarray(jax.numpy.asarray(leaf))  # the dtype JAX computes in
        item = f"leaf{k:05d}"
        arrays[item] = value
        entries.append(
            {
                "path": name,
                "kind": kind,
                "item": item,
                "shape": [int(d) for d in np.shape(value)],
                "dtype": str(value.dtype),
                "checksum": f"{checksum(value):016x}",
                **({"impl": impl} if impl else {}),
            }
        )
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        "treedef": encode_treedef(treedef, statics),
        "leaves": entries,
    }
    number = step if step is not None else (latest + 1 if latest is not None else 0)
    if latest is not None and number <= latest:
        number = latest + 1  # orbax keeps steps increasing; the manifest has the user's
    remote = getattr(on, "remote", None)
    if remote is not None and hasattr(remote, "write_checkpoint"):
        hosts = {k: np.asarray(v) for k, v in arrays.items()}
        remote.write_checkpoint(str(where.resolve()), number, hosts, manifest, write_checkpoint)
        return where
    write_checkpoint(str(where), number, arrays, manifest)
    return where


def write_checkpoint(
    path: str, number: int, arrays: dict[str, Any], manifest: dict[str, Any]
) -> None:
    """Write one orbax step of ``arrays`` and ``manifest`` (every process of
    the JAX world calls it; each writes the shards it holds)."""
    where = Path(path)
    ocp = _orbax()
    manager = _manager(where, create=True)
    try:
        manager.save(
            number,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(arrays), manifest=ocp.args.JsonSave(manifest)
            ),
            force=True,
        )
        manager.wait_until_finished()
    except (OSError, ValueError, TypeError) as err:
        raise AlpaError(f"cannot save checkpoint {where}: {_one_line(err)}") from None
    finally:
        manager.close()


# --------------------------------------------------------------------------- restore


def _latest_step(where: Path) -> int | None:
    manager = _manager(where, create=False)
    try:
        return manager.latest_step()
    finally:
        manager.close()


@contextlib.contextmanager
def _committed(path: str | os.PathLike[str]) -> Iterator[tuple[Path, Any, int]]:
    """The checkpoint directory, an open manager on it and its latest committed
    step; a one-line error where there is none."""
    where = Path(path)
    if not where.is_dir():
        raise AlpaError(f"no checkpoint at {where}: not a directory")
    manager = _manager(where, create=False)
    try:
        step = manager.latest_step()
        if step is None:
            raise AlpaError(f"no checkpoint at {where}: no committed step in the directory")
        yield where, manager, step
    finally:
        manager.close()


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path`` (its step, tree and leaves)."""
    with _committed(path) as (where, manager, step):
        return _read_manifest(where, manager, step)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return (text[:300] + "...") if len(text) > 300 else (text or type(err).__name__)


def _read_manifest(where: Path, manager: Any, step: int) -> dict[str, Any]:
    ocp = _orbax()
    try:
        restored = manager.restore(step, args=ocp.args.Composite(manifest=ocp.args.JsonRestore()))
        manifest = restored.manifest
    except Exception as err:  # orbax raises many kinds for a damaged file
        raise AlpaError(f"checkpoint {where}: cannot read its manifest: {_one_line(err)}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise AlpaError(f"checkpoint {where}: the manifest is not an alpa_ir checkpoint manifest")
    if manifest.get("version") != VERSION:
        raise AlpaError(
            f"checkpoint {where}: manifest version {manifest.get('version')!r}, this reader "
            f"knows {VERSION}"
        )
    leaves = manifest.get("leaves")
    if not isinstance(leaves, list) or not isinstance(manifest.get("treedef"), str):
        raise AlpaError(f"checkpoint {where}: the manifest has no leaves or no tree structure")
    for k, entry in enumerate(leaves):
        _check_entry(where, k, entry)
    return manifest


def _check_entry(where: Path, k: int, entry: Any) -> None:
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise AlpaError(f"checkpoint {where}: manifest leaf {k} is malformed")
    name = entry["path"]
    if entry.get("kind") == "static":
        return
    if entry.get("kind") not in ("array", "key", "python"):
        raise AlpaError(f"checkpoint {where}: leaf {name} has unknown kind {entry.get('kind')!r}")
    shape, dtype, item = entry.get("shape"), entry.get("dtype"), entry.get("item")
    if not (
        isinstance(shape, list)
        and all(isinstance(d, int) and d >= 0 for d in shape)
        and isinstance(dtype, str)
        and isinstance(item, str)
        and item.startswith("leaf")
        and item[4:].isdigit()
        and isinstance(entry.get("checksum"), str)
    ):
        raise AlpaError(f"checkpoint {where}: leaf {name} has a malformed manifest entry")
    try:
        np.dtype(jax.numpy.dtype(dtype))
    except TypeError:
        raise AlpaError(f"checkpoint {where}: leaf {name} has unknown dtype {dtype!r}") from None


def _placements(target: Any, shardings: Any) -> tuple[Any, list[Any] | None]:
    """The target's treedef and its leaves (Sharding/ShapeDtypeStruct/Array or
    any other value), None without a target."""
    if target is None and shardings is None:
        return None, None
    tree_source = target
    if hasattr(target, "get_input_avals"):  # an executable: its state, argument 0
        tree_source = target.get_input_avals()[0]
    elif hasattr(target, "get_input_shardings"):
        tree_source = target.get_input_shardings()[0]
    if tree_source is None:
        return None, None
    leaves, tree = jax.tree.flatten(tree_source, is_leaf=_is_placement)
    return tree, leaves


def _is_placement(x: Any) -> bool:
    return isinstance(x, jax.sharding.Sharding | jax.ShapeDtypeStruct | jax.Array)


def restore_checkpoint(
    path: str | os.PathLike[str], target: Any = None, shardings: Any = None
) -> Any:
    """The pytree saved at ``path``.

    ``target`` places and checks it: a pytree like the saved state whose leaves
    are ``jax.sharding.Sharding``, ``jax.ShapeDtypeStruct`` or ``jax.Array``
    (shape and dtype are checked against the latter two; their ``sharding``
    places the leaf), or an executable of ``parallelize`` (its state argument's
    placement). ``shardings`` (a pytree of Shardings, or one Sharding for every
    leaf) overrides the placement. Without either, each leaf goes to the
    default device, and the tree's node types must be rebuildable from the
    text (a ``TrainState`` needs a target: its ``apply_fn`` is not saved)."""
    with _committed(path) as (where, manager, step):
        manifest = _read_manifest(where, manager, step)
        return _restore(where, manager, step, manifest, target, shardings)


def _restore(
    where: Path, manager: Any, step: int, manifest: dict[str, Any], target: Any, shardings: Any
) -> Any:
    entries: list[dict[str, Any]] = manifest["leaves"]
    tree, targets = _placements(target, shardings)
    known = [tree] if tree is not None else []
    try:
        treedef = decode_treedef(manifest["treedef"], known=known)
    except AlpaError as err:
        raise AlpaError(f"checkpoint {where}: {err}") from None
    if treedef.num_leaves != len(entries):
        raise AlpaError(
            f"checkpoint {where}: the tree structure has {treedef.num_leaves} leaves but the "
            f"manifest lists {len(entries)}"
        )
    if targets is not None and len(targets) != len(entries):
        raise AlpaError(
            f"checkpoint {where} does not match the target's structure ({len(entries)} vs "
            f"{len(targets)} leaves)"
        )
    if tree is not None:
        _check_leaf_paths(where, entries, tree)
    placements = _with_shardings(targets, shardings, entries, where)
    abstract: dict[str, jax.ShapeDtypeStruct] = {}
    for entry, placement in zip(entries, placements, strict=True):
        if entry["kind"] == "static":
            continue
        abstract[entry["item"]] = _abstract_leaf(where, entry, placement)
    arrays = _restore_arrays(where, manager, step, abstract, entries)
    leaves = []
    for k, entry in enumerate(entries):
        if entry["kind"] == "static":
            leaves.append(_static_leaf(where, entry, targets[k] if targets else None))
            continue
        value = arrays[entry["item"]]
        if f"{checksum(value):016x}" != entry["checksum"]:
            raise AlpaError(
                f"checkpoint {where}: leaf {entry['path']} does not match its checksum (the "
                "data was changed or damaged)"
            )
        if entry["kind"] == "key":
            value = jax.random.wrap_key_data(value, impl=entry.get("impl") or "threefry2x32")
        leaves.append(value)
    return jax.tree.unflatten(treedef, leaves)


def _check_leaf_paths(where: Path, entries: list[dict[str, Any]], tree: Any) -> None:
    """The target's leaves must be the saved ones, path for path (a dict with
    other keys but as many leaves would otherwise take the saved values)."""
    paths = _leaf_paths(jax.tree.unflatten(tree, [0] * tree.num_leaves))
    for entry, path in zip(entries, paths, strict=True):
        if entry["path"] != path:
            raise AlpaError(
                f"checkpoint {where} does not match the target: the checkpoint has leaf "
                f"{entry['path']} where the target has {path}"
            )


def _with_shardings(
    targets: list[Any] | None, shardings: Any, entries: list[dict[str, Any]], where: Path
) -> list[Any]:
    placements: list[Any] = list(targets) if targets is not None else [None] * len(entries)
    if shardings is None:
        return placements
    if isinstance(shardings, jax.sharding.Sharding):
        chosen = [shardings] * len(entries)
    else:
        chosen = jax.tree.leaves(shardings, is_leaf=_is_placement)
        if len(chosen) != len(entries):
            raise AlpaError(
                f"checkpoint {where}: shardings has {len(chosen)} leaves, the checkpoint "
                f"{len(entries)}"
            )
    return [
        jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s)
        if isinstance(p, jax.ShapeDtypeStruct | jax.Array)
        else s
        for p, s in zip(placements, chosen, strict=True)
    ]


def _abstract_leaf(where: Path, entry: dict[str, Any], placement: Any) -> jax.ShapeDtypeStruct:
    """Shape, dtype and sharding to read a leaf with, checked against the target."""
    name = entry["path"]
    shape = tuple(entry["shape"])
    dtype = np.dtype(jax.numpy.dtype(entry["dtype"]))
    sharding = placement
    if isinstance(placement, jax.ShapeDtypeStruct | jax.Array):
        if entry["kind"] == "key":  # stored as key data: the key shape and one more dim
            if not _is_key(placement):
                raise AlpaError(f"leaf {name}: the checkpoint holds PRNG keys, the target does not")
            if tuple(placement.shape) != shape[:-1]:
                raise AlpaError(
                    f"leaf {name}: checkpoint key shape {list(shape[:-1])} != target shape "
                    f"{list(placement.shape)}"
                )
        else:
            if tuple(placement.shape) != shape:
                raise AlpaError(
                    f"leaf {name}: checkpoint shape {list(shape)} != target shape "
                    f"{list(placement.shape)}"
                )
            if np.dtype(placement.dtype) != dtype:
                raise AlpaError(
                    f"leaf {name}: checkpoint dtype {dtype} != target dtype {placement.dtype}"
                )
        sharding = placement.sharding
        if entry["kind"] == "key":
            sharding = _key_data_sharding(sharding, len(shape))
    if not isinstance(sharding, jax.sharding.Sharding):
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _key_data_sharding(sharding: Any, rank: int) -> Any:
    """The sharding of a key array's data (one more, unsplit, trailing dim)."""
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (rank - len(sharding.spec))
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec))
    return sharding


def _restore_arrays(
    where: Path,
    manager: Any,
    step: int,
    abstract: dict[str, jax.ShapeDtypeStruct],
    entries: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    ocp = _orbax()

    def load(items: dict[str, jax.ShapeDtypeStruct]) -> dict[str, Any]:
        out = manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(items))
        ).state
        return dict(out)

    try:
        return load(abstract)
    except Exception as err:  # find the leaf to blame, one at a time
        first = _one_line(err)
        by_item = {e.get("item"): e["path"] for e in entries}
        for item, spec in abstract.items():
            try:
                load({item: spec})
            except Exception as leaf_err:
                raise AlpaError(
                    f"checkpoint {where}: cannot read leaf {by_item.get(item, item)}: "
                    f"{_one_line(leaf_err)}"
                ) from None
        raise AlpaError(f"checkpoint {where}: cannot read its arrays: {first}") from None


def _static_leaf(where: Path, entry: dict[str, Any], target_leaf: Any) -> Any:
    if entry.get("value") is not None:
        try:
            return ast.literal_eval(entry["value"])
        except (ValueError, SyntaxError, TypeError, RecursionError):
            raise AlpaError(
                f"checkpoint {where}: leaf {entry['path']} has a malformed value"
            ) from None
    if target_leaf is None or _is_placement(target_leaf):
        raise AlpaError(
            f"checkpoint {where}: leaf {entry['path']} is not an array and was not saved; pass "
            "a target holding it"
        )
    return target_leaf
