"""Checkpoints written to a local cache first (Alpa's ``local_cache_dir``):
``save_checkpoint`` returns once the cache holds the step, and the step is
moved into the checkpoint directory in the background; ``sync_moves`` (an
executable's ``sync_move_workers()``) waits until every move is done.

Connected to Ray, the moves run in a
:class:`~alpa_ir.runtime.checkpoint_mover.MoveWorker` on the driver's node
(a named actor, found again by every save: the state is Ray's and ends with
the driver). Without Ray there is no process to move in the background, so
the step is moved before ``save_checkpoint`` returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alpa_ir.errors import AlpaError
from alpa_ir.runtime.checkpoint_mover import MoveWorker, move_tree, mover_name

SYNC_TIMEOUT_S = 600.0


def _ray() -> Any | None:
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a dependency
        return None
    return ray if ray.is_initialized() else None


def start_move(src: Path, dst: Path) -> None:
    """Move the folder ``src`` (a step written in the cache) into ``dst``: in
    the background on Ray, else now."""
    ray = _ray()
    if ray is None:
        try:
            move_tree(src, dst)
        except OSError as err:
            raise AlpaError(f"moving {src} into {dst}: {err.strerror or err}") from None
        return
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    mover = (
        ray.remote(MoveWorker)
        .options(
            name=mover_name(node),
            get_if_exists=True,
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        )
        .remote()
    )
    mover.keep.remote(mover)
    mover.move.remote(str(src), str(dst))


def sync_moves(timeout_s: float = SYNC_TIMEOUT_S) -> None:
    """Wait until every move asked for is done; a move that failed is a
    one-line error naming both folders."""
    ray = _ray()
    if ray is None:
        return
    movers = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        try:
            movers.append(ray.get_actor(mover_name(node["NodeID"])))
        except ValueError:  # no save on that node
            continue
    refs = [m.sync.remote() for m in movers]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if len(ready) < len(refs):
        raise AlpaError(f"the checkpoint moves did not finish within {timeout_s:.0f} s")
    errors = [e for found in ray.get(refs) for e in found]
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise AlpaError(f"a checkpoint move failed: {errors[0]}{more}")
