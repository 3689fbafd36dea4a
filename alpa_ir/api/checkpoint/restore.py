"""restore_checkpoint and read_manifest: the latest committed step, checked
(confined, manifest, checksums) and placed as a target asks."""

from __future__ import annotations

import ast
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from alpa_ir.api.checkpoint.checksums import hex_checksum
from alpa_ir.api.checkpoint.confinement import check_step_confined
from alpa_ir.api.checkpoint.manifest import array_dtype, check_manifest
from alpa_ir.api.checkpoint.orbax_io import (
    describe,
    item_names,
    opened,
    read_leaves,
    read_manifest_item,
)
from alpa_ir.api.checkpoint.save import is_key, leaf_paths
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.pytree_codec import decode_treedef


@contextlib.contextmanager
def _committed(
    path: str | os.PathLike[str], wanted: int | None = None
) -> Iterator[tuple[str, Any, int]]:
    """The label of the checkpoint's latest committed step, or of step
    ``wanted`` (``checkpoint PATH (step N)``), an open manager on it and the
    step, once the step is known to hold no link out of it; a one-line error
    where there is none."""
    where = Path(path)
    if not where.is_dir():
        raise AlpaError(f"no checkpoint at {where}: not a directory")
    with opened(where, create=False) as manager:
        step = manager.latest_step()
        if step is None:
            raise AlpaError(f"no checkpoint at {where}: no committed step in the directory")
        if wanted is not None:
            step = _step_saved_as(manager, where, wanted)
        label = f"checkpoint {where} (step {step})"
        check_step_confined(label, where, where / str(step))
        yield label, manager, step


def _step_saved_as(manager: Any, where: Path, wanted: int) -> int:
    """The latest committed step whose manifest records the user's step
    ``wanted`` (orbax numbers steps increasingly; the manifest keeps the
    user's); a one-line error naming the steps there are."""
    saved = {}
    for number in sorted(manager.all_steps(), reverse=True):
        try:
            recorded = read_manifest_item(manager, number).get("step")
        except Exception:  # a damaged step is named when it is read
            recorded = number
        saved.setdefault(recorded if recorded is not None else number, number)
    if wanted not in saved:
        steps = ", ".join(str(k) for k in sorted(saved))
        raise AlpaError(f"no step {wanted} in checkpoint {where}: its committed steps are {steps}")
    return saved[wanted]


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path`` (its step, tree and leaves)."""
    with _committed(path) as (label, manager, step):
        return _read_manifest(label, manager, step)


def _read_manifest(label: str, manager: Any, step: int) -> dict[str, Any]:
    try:
        manifest = read_manifest_item(manager, step)
    except Exception as err:  # orbax raises many kinds for a damaged file
        raise AlpaError(f"{label}: cannot read its manifest: {describe(err, {})}") from None
    return check_manifest(label, manifest)


def restore_checkpoint(
    path: str | os.PathLike[str], target: Any = None, shardings: Any = None
) -> Any:
    """The pytree saved at ``path`` (its latest committed step).

    Alpa's form, ``restore_checkpoint(path, step, placement_specs)`` (an
    integer second argument), reads that step and places it by
    ``placement_specs`` (a target, e.g. ``executable.get_input_placement_specs()[0]``).

    ``target`` places and checks it: a pytree like the saved state whose leaves
    are ``jax.sharding.Sharding``, ``jax.ShapeDtypeStruct`` or ``jax.Array``
    (shape and dtype are checked against the latter two; their ``sharding``
    places the leaf), or an executable of ``parallelize`` (its state argument's
    placement). ``shardings`` (a pytree of Shardings, or one Sharding for every
    leaf) overrides the placement. Without either, each leaf goes to the
    default device, and the tree's node types must be rebuildable from the
    text (a ``TrainState`` needs a target: its ``apply_fn`` is not saved).

    Nothing is read from outside the checkpoint: a step holding a symbolic
    link that leads out of it is refused first. A damaged step is a one-line
    :class:`~alpa_ir.errors.AlpaError` naming the checkpoint, the step, the
    leaf and the reason."""
    wanted = None
    if isinstance(target, int | np.integer) and not isinstance(target, bool):
        wanted, target, shardings = int(target), shardings, None
    with _committed(path, wanted) as (label, manager, step):
        manifest = _read_manifest(label, manager, step)
        return _restore(label, manager, step, manifest, target, shardings)


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


def _restore(
    label: str, manager: Any, step: int, manifest: dict[str, Any], target: Any, shardings: Any
) -> Any:
    entries: list[dict[str, Any]] = manifest["leaves"]
    tree, targets = _placements(target, shardings)
    known = [tree] if tree is not None else []
    try:
        treedef = decode_treedef(manifest["treedef"], known=known)
    except AlpaError as err:
        raise AlpaError(f"{label}: {err}") from None
    if treedef.num_leaves != len(entries):
        raise AlpaError(
            f"{label}: the tree structure has {treedef.num_leaves} leaves but the "
            f"manifest lists {len(entries)}"
        )
    if targets is not None and len(targets) != len(entries):
        raise AlpaError(
            f"{label} does not match the target's structure ({len(entries)} vs "
            f"{len(targets)} leaves)"
        )
    if tree is not None:
        _check_leaf_paths(label, entries, tree)
    placements = _with_shardings(label, targets, shardings, entries)
    abstract: dict[str, jax.ShapeDtypeStruct] = {}
    for entry, placement in zip(entries, placements, strict=True):
        if entry["kind"] == "static":
            continue
        abstract[entry["item"]] = _abstract_leaf(entry, placement)
    arrays = read_leaves(label, manager, step, abstract, item_names(manifest))
    leaves = []
    for k, entry in enumerate(entries):
        if entry["kind"] == "static":
            leaves.append(_static_leaf(label, entry, targets[k] if targets else None))
            continue
        value = arrays[entry["item"]]
        if hex_checksum(value) != entry["checksum"]:
            raise AlpaError(
                f"{label}: leaf {entry['path']} does not match its checksum (the data was "
                "changed or damaged)"
            )
        if entry["kind"] == "key":
            value = jax.random.wrap_key_data(value, impl=entry.get("impl") or "threefry2x32")
        leaves.append(value)
    return jax.tree.unflatten(treedef, leaves)


def _check_leaf_paths(label: str, entries: list[dict[str, Any]], tree: Any) -> None:
    """The target's leaves must be the saved ones, path for path (a dict with
    other keys but as many leaves would otherwise take the saved values)."""
    paths = leaf_paths(jax.tree.unflatten(tree, [0] * tree.num_leaves))
    for entry, path in zip(entries, paths, strict=True):
        if entry["path"] != path:
            raise AlpaError(
                f"{label} does not match the target: the checkpoint has leaf "
                f"{entry['path']} where the target has {path}"
            )


def _with_shardings(
    label: str, targets: list[Any] | None, shardings: Any, entries: list[dict[str, Any]]
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
                f"{label}: shardings has {len(chosen)} leaves, the checkpoint {len(entries)}"
            )
    return [
        jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s)
        if isinstance(p, jax.ShapeDtypeStruct | jax.Array)
        else s
        for p, s in zip(placements, chosen, strict=True)
    ]


def _abstract_leaf(entry: dict[str, Any], placement: Any) -> jax.ShapeDtypeStruct:
    """Shape, dtype and sharding to read a leaf with, checked against the target."""
    name = entry["path"]
    shape = tuple(entry["shape"])
    dtype = array_dtype(entry["dtype"])
    if dtype is None:  # the manifest check lets only array data through
        raise AlpaError(f"leaf {name}: dtype {entry['dtype']!r} is not array data")
    sharding = placement
    if isinstance(placement, jax.ShapeDtypeStruct | jax.Array):
        if entry["kind"] == "key":  # stored as key data: the key shape and one more dim
            if not is_key(placement):
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


def _static_leaf(label: str, entry: dict[str, Any], target_leaf: Any) -> Any:
    if entry.get("value") is not None:
        try:
            return ast.literal_eval(entry["value"])
        except (ValueError, SyntaxError, TypeError, RecursionError):
            raise AlpaError(f"{label}: leaf {entry['path']} has a malformed value") from None
    if target_leaf is None or _is_placement(target_leaf):
        raise AlpaError(
            f"{label}: leaf {entry['path']} is not an array and was not saved; pass "
            "a target holding it"
        )
    return target_leaf
