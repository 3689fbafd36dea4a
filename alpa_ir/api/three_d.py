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

Beyond Alpa's, the options of real pre-training runs
(:class:`~alpa_ir.api.parallel_config.ParallelConfig`, whose docstring says
how each runs): ``virtual_stages`` interleaved chunks per stage (the
interleaved 1F1B schedule on ``pipeline_parallel × virtual_stages``
automatic layers), ``zero_stage`` (0-3; None keeps each method's default),
``context_parallel`` (stage meshes ``(dp, cp, op)``, the batch argument
split over data and sequence) and ``recompute`` (``"full"``: every layer's
forward runs again in its backward). :func:`parallel_method` builds the
same from a ``ParallelConfig``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from alpa_ir.api.manual_sharding import ManualShardingOption
from alpa_ir.api.parallel_config import ParallelConfig, Recompute
from alpa_ir.api.pipeshard import (
    AutoLayerOption,
    ManualStageOption,
    PipeshardParallel,
    UniformStageOption,
)
from alpa_ir.api.shard_parallel import AutoShardingOption, ShardParallel
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh

CONTEXT_AXES = ("data", "context", "tensor")
"""Axis names of a stage mesh with context parallelism."""


def get_3d_parallel_method(
    num_micro_batches: int,
    data_parallel: int,
    operator_parallel: int,
    pipeline_parallel: int,
    allow_degenerate_into_shard_parallel: bool = True,
    devices: Sequence[int] | None = None,
    *,
    virtual_stages: int = 1,
    zero_stage: int | None = None,
    context_parallel: int = 1,
    recompute: Recompute = "none",
) -> PipeshardParallel | ShardParallel:
    """The 3-D parallel method (module docstring). ``devices``: the device ids
    to use (default: every local device); their number must be
    ``data_parallel × operator_parallel × pipeline_parallel`` (× ``context_parallel``)."""
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
    config = ParallelConfig(
        tensor=operator_parallel,
        pipeline=pipeline_parallel,
        data=data_parallel,
        context=context_parallel,
        virtual_stages=virtual_stages,
        zero_stage=0 if zero_stage is None else zero_stage,
        recompute=recompute,
        num_micro_batches=num_micro_batches,
    )
    return _build(config, devices, allow_degenerate_into_shard_parallel, zero_stage is not None)


def parallel_method(
    config: ParallelConfig,
    devices: Sequence[int] | None = None,
    allow_degenerate_into_shard_parallel: bool = True,
) -> PipeshardParallel | ShardParallel:
    """The method that runs ``config`` (its ``num_micro_batches``, default 1) on
    ``devices`` (default: every local device)."""
    return _build(config, devices, allow_degenerate_into_shard_parallel, True)


def _build(
    config: ParallelConfig,
    devices: Sequence[int] | None,
    degenerate: bool,
    zero_given: bool,
) -> PipeshardParallel | ShardParallel:
    ids = tuple(range(len(jax.devices()))) if devices is None else tuple(int(d) for d in devices)
    need = config.num_devices
    if need != len(ids):
        cp = f" x {config.context}" if config.context > 1 else ""
        raise AlpaError(
            f"get_3d_parallel_method: data_parallel x operator_parallel x pipeline_parallel"
            f"{' x context_parallel' if cp else ''} = {config.data} x {config.tensor} x "
            f"{config.pipeline}{cp} = {need}, but there are {len(ids)} devices"
        )
    shape = config.stage_mesh_shape
    micro = config.num_micro_batches or 1
    # a mesh axis of size 1 splits nothing (and no spec may name it)
    batch_axis = 0 if config.data > 1 else None
    manual = None
    if config.context > 1:
        from jax.sharding import PartitionSpec

        names = CONTEXT_AXES
        batch_spec = PartitionSpec(names[0] if config.data > 1 else None, names[1])
        manual = ManualShardingOption(names, in_axis_resources=(None, batch_spec))
    pipelined = config.pipeline > 1 or config.recompute == "full" or not degenerate
    if not pipelined:
        option = AutoShardingOption(force_batch_dim_to_mesh_dim=batch_axis)
        if zero_given:
            option.reduce_scatter = config.reduce_scatter
        return ShardParallel(
            devices=LogicalDeviceMesh(shape, devices=ids),
            num_micro_batches=micro,
            auto_sharding_option=option,
            manual_sharding_option=manual,
        )
    if manual is not None:
        raise AlpaError(
            "get_3d_parallel_method: context parallelism runs on one stage (pipeline_parallel=1, "
            "recompute='none'); with pipeline stages it is simulated only (alpa-bench)"
        )
    stage_shape = (config.data, config.tensor)
    stage_option: ManualStageOption | UniformStageOption
    if config.virtual_stages > 1:
        stage_option = UniformStageOption(
            num_stages=config.pipeline, submesh_logical_shape=stage_shape
        )
    else:
        stage_option = ManualStageOption(
            [[k] for k in range(config.pipeline)], [stage_shape] * config.pipeline
        )
    return PipeshardParallel(
        devices=ids,
        num_micro_batches=micro,
        layer_option=AutoLayerOption(
            layer_num=config.num_chunks, remat_layer=config.recompute == "full"
        ),
        stage_option=stage_option,
        pipeline_schedule=config.schedule if config.virtual_stages > 1 else "auto",
        virtual_stages=config.virtual_stages if config.virtual_stages > 1 else None,
        auto_sharding_option=AutoShardingOption(
            reduce_scatter=config.reduce_scatter if zero_given else "none",
            force_batch_dim_to_mesh_dim=batch_axis,
        ),
    )


__all__ = ["get_3d_parallel_method", "parallel_method"]
