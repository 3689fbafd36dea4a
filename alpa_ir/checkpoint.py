"""Checkpoints of a training state that do not depend on the plan that made them.

    alpa_ir.save_checkpoint("ckpt/step_2", state, step=2)
    state = alpa_ir.restore_checkpoint("ckpt/step_2", target=executable)

Format (a directory, version 1)::

    manifest.json   {"format": "alpa_ir.checkpoint", "version": 1, "step": 2,
                     "treedef": <pytree_codec text>,
                     "leaves": [{"path": "state.params.dense_0.kernel",
                                 "file": "00003.npy", "shape": [32, 64],
                                 "dtype": "float32"}, ...]}
    00000.npy ...   one plain .npy per leaf: the GLOBAL array, in pytree-leaf order

Only global values are stored, never a mesh, a sharding or a device id, so a
checkpoint written under one plan (ZeRO-3 on (1, 4), a pipeline over several
meshes, ...) restores under any other: the reader re-slices each leaf for its
own placement.

Writing: each leaf's .npy is created as a memory-mapped file of the global shape
and every distinct addressable shard (``replica_id == 0``) is copied into its
slice, one shard at a time. No array is ever gathered onto one device, and the
host holds at most one shard (plus the OS page cache) at a time. Arrays on
different device subsets are fine: each leaf is written on its own. Only
fully addressable arrays (one process) are supported.

Reading: each .npy is memory-mapped; with a target sharding each device's slice
is read and put on it (``jax.make_array_from_callback``), so the full array is
not built on one device or in host memory either.

Atomicity: everything is written into a hidden sibling temp directory
(``.<name>.tmp-<random>``), the files are fsynced, the manifest written last,
and the directory then renamed to ``path``. An exception removes the temp
directory; a crash may leave it behind, but never anything under ``path``. With
``overwrite=True`` an existing checkpoint is first renamed aside and removed only
after the new one is in place, so ``path`` always holds a complete checkpoint
(either one) or nothing during the swap.

dtypes without a native numpy descr (bfloat16, the float8 types) are written as
raw void records of the same width; the manifest's dtype restores them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.frontend.pytree_codec import decode_treedef, encode_treedef, flat_names

FORMAT = "alpa_ir.checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
ROOT = "state"


def _leaf_file(k: int) -> str:
    return f"{k:05d}.npy"


def _leaf_paths(tree: Any) -> list[str]:
    return flat_names((tree,), [ROOT])


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_leaf(file: Path, leaf: Any, name: str) -> None:
    """The global value of ``leaf`` as a .npy, written shard by shard."""
    if isinstance(leaf, jax.Array):
        if leaf.is_deleted():
            raise AlpaError(
                f"leaf {name} was deleted (donated to a step?); save the state the step returned"
            )
        if not leaf.is_fully_addressable:
            raise AlpaError(
                f"leaf {name} spans several processes; only single-process checkpoints are supported"
            )
        out = np.lib.format.open_memmap(file, mode="w+", dtype=leaf.dtype, shape=leaf.shape)
        for shard in leaf.addressable_shards:
            if shard.replica_id == 0:  # one copy of each distinct slice
                out[shard.index] = np.asarray(shard.data)
        out.flush()
        del out
    else:
        np.save(file, np.asarray(leaf), allow_pickle=False)
    _fsync(file)


def save_checkpoint(
    path: str | os.PathLike[str], state: Any, step: int | None = None, *, overwrite: bool = False
) -> Path:
    """Write ``state`` (any pytree of arrays, sharded in any way) to the directory
    ``path`` atomically; ``step`` is recorded in the manifest. An existing
    ``path`` is an error unless ``overwrite``. Returns the directory."""
    target = Path(path)
    if target.exists() and not overwrite:
        raise AlpaError(f"checkpoint directory {target} already exists (pass overwrite=True)")
    leaves, treedef = jax.tree.flatten(state)
    names = _leaf_paths(state)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "step": None if step is None else int(step),
        "treedef": encode_treedef(treedef),
        "leaves": [],
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        for k, (leaf, name) in enumerate(zip(leaves, names, strict=True)):
            _write_leaf(tmp / _leaf_file(k), leaf, name)
            manifest["leaves"].append(  # type: ignore[attr-defined]
                {
                    "path": name,
                    "file": _leaf_file(k),
                    "shape": [int(d) for d in np.shape(leaf)],
                    "dtype": np.dtype(
                        leaf.dtype if hasattr(leaf, "dtype") else np.result_type(leaf)
                    ).name,
                }
            )
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync(tmp)
        _publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _publish(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target``; an existing ``target`` is moved aside first
    and removed once the new one is in place."""
    old: Path | None = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rename(target, old / "ckpt")
    try:
        os.rename(tmp, target)
    except BaseException:
        if old is not None:
            os.rename(old / "ckpt", target)
            shutil.rmtree(old, ignore_errors=True)
        raise
    _fsync(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ----------------------------------------------------------------------------
# Restore
# ----------------------------------------------------------------------------


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checked manifest of the checkpoint at ``path`` (step, leaves, ...)."""
    return _read_manifest(Path(path))[0]


def _read_manifest(where: Path) -> tuple[dict[str, Any], Any]:
    """The checked manifest and its tree structure."""
    if not where.is_dir():
        raise AlpaError(f"no checkpoint at {where}: not a directory")
    file = where / MANIFEST
    if not file.is_file():
        raise AlpaError(f"no checkpoint at {where}: {MANIFEST} is missing")
    try:
        manifest = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise AlpaError(f"malformed manifest {file}: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise AlpaError(f"{file} is not an alpa_ir checkpoint manifest")
    if manifest.get("version") != VERSION:
        raise AlpaError(
            f"{file} has checkpoint version {manifest.get('version')}, this reader knows {VERSION}"
        )
    treedef = decode_treedef(manifest["treedef"])
    leaves = manifest["leaves"]
    if treedef.num_leaves != len(leaves):
        raise AlpaError(
            f"{file}: the tree structure has {treedef.num_leaves} leaves but {len(leaves)} are listed"
        )
    names = _leaf_paths(jax.tree.unflatten(treedef, [0] * treedef.num_leaves))
    for name, entry in zip(names, leaves, strict=True):
        if entry["path"] != name:
            raise AlpaError(
                f"{file}: leaf {entry['path']} is listed where the tree structure has {name}"
            )
        if not (where / entry["file"]).is_file():
            raise AlpaError(f"checkpoint {where}: leaf {name} has no file {entry['file']}")
    return manifest, treedef


def _is_placement(x: Any) -> bool:
    return isinstance(x, jax.sharding.Sharding | jax.ShapeDtypeStruct | jax.Array)


def _target_leaves(target: Any, treedef: Any, names: list[str], path: Path) -> list[Any]:
    """The target's leaves (Sharding, ShapeDtypeStruct or Array) in the
    checkpoint's leaf order, after checking that both trees name the same leaves."""
    if hasattr(target, "get_input_avals"):  # an executable: its state, argument 0
        target = target.get_input_avals()[0]
    elif hasattr(target, "get_input_shardings"):
        target = target.get_input_shardings()[0]
    leaves, tree = jax.tree.flatten(target, is_leaf=_is_placement)
    if tree != treedef:
        theirs = _leaf_paths(jax.tree.unflatten(tree, [0] * tree.num_leaves))
        only_ckpt = [n for n in names if n not in set(theirs)]
        only_target = [n for n in theirs if n not in set(names)]
        detail = (
            f"leaf {only_ckpt[0]} is in the checkpoint but not the target"
            if only_ckpt
            else f"leaf {only_target[0]} is in the target but not the checkpoint"
            if only_target
            else "same leaves, different container types"
        )
        raise AlpaError(
            f"checkpoint {path} does not match the target's structure "
            f"({len(names)} vs {len(theirs)} leaves): {detail}"
        )
    for leaf, name in zip(leaves, names, strict=True):
        if not _is_placement(leaf):
            raise AlpaError(
                f"target leaf {name} is a {type(leaf).__name__}, not a Sharding, "
                "ShapeDtypeStruct or jax.Array"
            )
    return leaves


def _loader(file: Path, dtype: np.dtype) -> np.ndarray:
    data = np.load(file, mmap_mode="r", allow_pickle=False)
    if data.dtype != dtype and data.dtype.kind == "V" and data.dtype.itemsize == dtype.itemsize:
        data = data.view(dtype)  # bfloat16 & co. are stored as raw records
    return data


def restore_checkpoint(
    path: str | os.PathLike[str], target: Any = None, shardings: Any = None
) -> Any:
    """The pytree saved at ``path``.

    ``target`` places and checks it: a pytree like the saved state whose leaves
    are ``jax.sharding.Sharding``, ``jax.ShapeDtypeStruct`` or ``jax.Array``
    (shape and dtype are checked against the latter two; their ``sharding``
    places the leaf), or an executable of ``parallelize`` (its state argument's
    placement, via ``get_input_avals``/``get_input_shardings``). ``shardings``
    (a pytree of Shardings, or one Sharding for every leaf) overrides the
    placement. Without either, each leaf goes to the default device."""
    where = Path(path)
    manifest, treedef = _read_manifest(where)
    entries = manifest["leaves"]
    names = [e["path"] for e in entries]
    placements: list[Any] = [None] * len(entries)
    if target is not None:
        placements = _target_leaves(target, treedef, names, where)
    if shardings is not None:
        if isinstance(shardings, jax.sharding.Sharding):
            chosen = [shardings] * len(entries)
        else:
            chosen = _target_leaves(shardings, treedef, names, where)
        placements = [
            jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s)
            if isinstance(p, jax.ShapeDtypeStruct | jax.Array)
            else s
            for p, s in zip(placements, chosen, strict=True)
        ]
    leaves = []
    for entry, placement in zip(entries, placements, strict=True):
        leaves.append(_restore_leaf(where, entry, placement))
    return jax.tree.unflatten(treedef, leaves)


def _restore_leaf(where: Path, entry: dict[str, Any], placement: Any) -> jax.Array:
    name = entry["path"]
    shape = tuple(entry["shape"])
    dtype = np.dtype(jax.numpy.dtype(entry["dtype"]))
    data = _loader(where / entry["file"], dtype)
    if data.shape != shape or data.dtype != dtype:
        raise AlpaError(
            f"checkpoint {where}: leaf {name} file {entry['file']} holds {data.dtype}{list(data.shape)}, "
            f"the manifest says {dtype}{list(shape)}"
        )
    sharding = placement
    if isinstance(placement, jax.ShapeDtypeStruct | jax.Array):
        if tuple(placement.shape) != shape:
            raise AlpaError(
                f"leaf {name}: checkpoint shape {list(shape)} != target shape {list(placement.shape)}"
            )
        if np.dtype(placement.dtype) != dtype:
            raise AlpaError(
                f"leaf {name}: checkpoint dtype {dtype} != target dtype {placement.dtype}"
            )
        sharding = placement.sharding
    if sharding is None:
        return jax.device_put(np.array(data))
    read: Callable[[Any], np.ndarray] = lambda index: np.array(data[index])  # noqa: E731
    try:
        return jax.make_array_from_callback(shape, sharding, read)
    except ValueError as err:
        raise AlpaError(
            f"leaf {name}: cannot place shape {list(shape)} with {sharding}: {err}"
        ) from None
