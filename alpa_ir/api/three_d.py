"""``get_3d_parallel_method``: Megatron-style 3-D parallelism as an Alpa method.

As Alpa's ``alpa.get_3d_parallel_method``: ``data_parallel × operator_parallel
× pipeline_parallel`` devices; the step is sliced into ``pipeline_parallel``
automatic layers (``cluster-operators``), layer ``i`` is stage ``i`` on the
``i``-th block of ``dp × op`` devices, each stage auto-sharded on a
``(dp, op)`` logical mesh with the batch dimension forced onto mesh axis 0
(the data-parallel axis; not forced when ``data_parallel`` is 1), so the ILP
only chooses how the operator-parallel axis splits the ops. Functions of a
stage without batch arguments (apply-grad) are planned without the force.
Alpa's version also rematerializes every layer (``remat_layer``); this one
runs the layers as traced. With ``pipeline_parallel == 1`` (and degeneration
allowed) it is a :class:`~alpa_ir.api.shard_parallel.ShardParallel` on the ``(dp, op)``
mesh with the same forced batch axis.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from alpa_ir.api.pipeshard import AutoLayerOption, ManualStageOption, PipeshardParallel
from alpa_ir.api.shard_parallel import AutoShardingOption, ShardParallel
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh


def get_3d_parallel_method(
    num_micro_batches: int,
    data_parallel: int,
    operator_parallel: int,
    pipeline_parallel: int,
    allow_degenerate_into_shard_parallel: bool = True,
    devices: Sequence[int] | None = None,
) -> PipeshardParallel | ShardParallel:
    """The 3-D parallel method (module docstring). ``devices``: the device ids
    to use (default: every local device); their number must be
    ``data_parallel × operator_parallel × pipeline_parallel``."""
    degrees = {
        "num_micro_batches": num_micro_batches,
        "data_parallel": data_parallel,
        "operator_parallel": operator_parallel,
        "pipeline_parallel": pipeline_parallel,
    }
    for name, value in degrees.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise AlpaError(
                f"get_3d_parallel_method: {name} must be a positive integer, got {value!r}"
            )
    ids = tuple(range(len(jax.devices()))) if devices is None else tuple(int(d) for d in devices)
    need = data_parallel * operator_parallel * pipeline_parallel
    if need != len(ids):
        raise AlpaError(
            f"get_3d_parallel_method: data_parallel x operator_parallel x pipeline_parallel = "
            f"{data_parallel} x {operator_parallel} x {pipeline_parallel} = {need}, but there are "
            f"{len(ids)} devices"
        )
    shape = (data_parallel, operator_parallel)
    # a mesh axis of size 1 splits nothing (and no spec may name it)
    batch_axis = 0 if data_parallel > 1 else None
    if pipeline_parallel == 1 and allow_degenerate_into_shard_parallel:
        return ShardParallel(
            devices=LogicalDeviceMesh(shape, devices=ids),
            num_micro_batches=num_micro_batches,
            auto_sharding_option=AutoShardingOption(force_batch_dim_to_mesh_dim=batch_axis),
        )
    return PipeshardParallel(
        devices=ids,
        num_micro_batches=num_micro_batches,
        layer_option=AutoLayerOption(layer_num=pipeline_parallel),
        stage_option=ManualStageOption(
            [[k] for k in range(pipeline_parallel)], [shape] * pipeline_parallel
        ),
        auto_sharding_option=AutoShardingOption(
            reduce_scatter="none", force_batch_dim_to_mesh_dim=batch_axis
        ),
    )


__all__ = ["get_3d_parallel_method"]
