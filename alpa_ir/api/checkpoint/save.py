"""save_checkpoint: a state's leaves and manifest, written as one orbax step."""

from __future__ import annotations

import ast
import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

from alpa_ir.api.checkpoint.cache_moves import start_move, sync_moves
from alpa_ir.api.checkpoint.checksums import hex_checksum
from alpa_ir.api.checkpoint.confinement import check_save_confined
from alpa_ir.api.checkpoint.manifest import FORMAT, VERSION
from alpa_ir.api.checkpoint.orbax_io import latest_step, write_checkpoint
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.pytree_codec import encode_treedef, flat_names, is_array_leaf


def is_key(x: Any) -> bool:
    """Whether ``x`` is an array of typed PRNG keys."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def leaf_paths(state: Any) -> list[str]:
    """The user's path of each leaf (``state.params.w``)."""
    return flat_names((state,), ["state"])


def _literal(value: Any) -> Any:
    """``value`` as a JSON/Python literal, or raise ValueError."""
    text = repr(value)
    if ast.literal_eval(text) != value:
        raise ValueError(text)
    return text


def save_checkpoint(
    path: str | os.PathLike[str],
    state: Any,
    step: int | None = None,
    local_cache_dir: str | os.PathLike[str] | None = None,
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
    host sees. Returns the directory.

    With ``local_cache_dir`` (Alpa's), the step is written into a new
    folder under it (a fast local disk) and the call returns; the step is
    then moved into ``path`` in the background
    (:mod:`alpa_ir.api.checkpoint.cache_moves`), and an executable's
    ``sync_move_workers()`` waits until it is there. A save that reads the
    directory (``step=None``, which takes the next step, or no
    ``overwrite``) first waits for the moves of earlier saves, so that two
    quick saves never get one step number.

    A failed write (no space left, a read-only file system) is a one-line
    :class:`~alpa_ir.errors.AlpaError` naming the leaf being written and the
    cause; the partial step is removed and the previous one stays restorable.
    A checkpoint folder holding a symbolic link that leads out of it is
    refused before anything is written."""
    where = Path(path)
    if where.exists() and not where.is_dir():
        raise AlpaError(f"checkpoint path {where} exists and is not a directory")
    for parent in where.absolute().parents:  # the nearest existing one must be a directory
        if parent.exists():
            if not parent.is_dir():
                raise AlpaError(f"cannot save checkpoint {where}: {parent} is not a directory")
            break
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise AlpaError(f"save_checkpoint: step must be an int >= 0, got {step!r}")
    check_save_confined(where)
    if step is None or not overwrite:
        # what is there decides the step number or a refusal: let the moves
        # of earlier cached saves land first (a no-op without Ray)
        sync_moves()
    latest = _latest(where)
    if latest is not None and not overwrite:
        raise AlpaError(f"checkpoint directory {where} already exists (pass overwrite=True)")
    arrays, manifest = _leaves_and_manifest(where, state, step)
    number = step if step is not None else (latest + 1 if latest is not None else 0)
    if latest is not None and number <= latest:
        number = latest + 1  # orbax keeps steps increasing; the manifest has the user's
    remote = getattr(on, "remote", None)
    if local_cache_dir is not None:
        if remote is not None:
            raise AlpaError(
                "save_checkpoint: local_cache_dir is for a state the driver writes; with on= "
                "the hosts write into path themselves"
            )
        cache = Path(local_cache_dir)
        try:
            cache.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix="alpa_ir-checkpoint-", dir=cache))
        except OSError as err:
            raise AlpaError(f"local_cache_dir {cache}: {err.strerror or err}") from None
        write_checkpoint(str(staging), number, arrays, manifest)
        start_move(staging, where)
        return where
    if remote is not None and hasattr(remote, "write_checkpoint"):
        hosts = {k: np.asarray(v) for k, v in arrays.items()}
        remote.write_checkpoint(str(where.resolve()), number, hosts, manifest, write_checkpoint)
        return where
    write_checkpoint(str(where), number, arrays, manifest)
    return where


def _latest(where: Path) -> int | None:
    """The checkpoint's newest step, None where there is none; a folder orbax
    cannot even list (unreadable) is a one-line error."""
    if not where.is_dir():
        return None
    try:
        return latest_step(where)
    except OSError as err:
        raise AlpaError(f"cannot save checkpoint {where}: {err.strerror or err}") from None


def _leaves_and_manifest(
    where: Path, state: Any, step: int | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The arrays to write (by orbax item name) and the manifest."""
    leaves, treedef = jax.tree.flatten(state)
    names = leaf_paths(state)
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
        if is_key(leaf):
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
                "checksum": hex_checksum(value),
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
    return arrays, manifest
