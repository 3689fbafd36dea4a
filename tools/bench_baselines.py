"""``alpa-bench``'s baselines on the stage cost table (see
:mod:`alpa_ir.tools.alpa_bench`): Megatron's grid and PP-DP
(:func:`uniform_grid`), DeepSpeed-style MoE (:func:`deepspeed`) and inter-op
only (:func:`inter_op`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from alpa_ir.errors import AlpaError, PlanError

if TYPE_CHECKING:  # imported where used: a bad option is rejected before jax loads
    from xdsl.dialects.builtin import ModuleOp

    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.costs.stage_cost import StageCostOptions
    from alpa_ir.costs.stage_table import StageCostTable, ViewCost
    from alpa_ir.dialects.sharding import ShardingSpec
    from alpa_ir.hardware.clusters import Cluster
    from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
    from alpa_ir.pipeline.layer_ranges import LayerRanges
from alpa_ir.tools.bench_outcome import Outcome, outcome


def uniform_grid(
    table: StageCostTable,
    num_micro_batches: int,
    model_flops: float,
    op_max: int | None,
    remat: bool = False,
) -> Outcome:
    """Megatron-style dp x op x pp: equal layer counts, every stage on (dp, op)."""
    from alpa_ir.pipeline.stage_construction import StageChoice

    cluster = table.cluster
    devices = cluster.num_devices
    num = table.num_layers
    best = Outcome("megatron" if op_max is None else "pp-dp", error="no grid point fits")
    for pp in range(1, num + 1):
        if devices % pp:
            continue
        size = devices // pp
        submesh = next((s for s in table.submeshes if s[0] * s[1] == size), None)
        if submesh is None:
            continue
        bounds = [round(k * num / pp) for k in range(pp + 1)]
        if any(bounds[k + 1] <= bounds[k] for k in range(pp)):
            continue
        for view in table.views[submesh]:
            if op_max is not None and view.shape[1] > op_max:
                continue
            stages = []
            for k in range(pp):
                cost = table.cost(bounds[k], bounds[k + 1] - 1, view.shape).fitting(
                    cluster.device_memory
                )
                devs = tuple(range(k * size, (k + 1) * size))
                mesh = cluster.logical_mesh(view.shape, devs)
                stages.append(
                    StageChoice(bounds[k], bounds[k + 1] - 1, submesh, mesh, cost, cost.latency)
                )
            candidate = outcome(best.method, table, stages, num_micro_batches, model_flops, remat)
            if candidate.iteration_time < best.iteration_time:
                best = candidate
    return best


def restricted(
    method: str,
    table: StageCostTable,
    submeshes: list[tuple[int, int]],
    num_micro_batches: int,
    model_flops: float,
    remat: bool = False,
) -> Outcome:
    from alpa_ir.pipeline.stage_construction import solve_stages

    try:
        plan = solve_stages(table, num_micro_batches, submeshes=submeshes)
    except (AlpaError, PlanError) as error:
        return Outcome(method, error=str(error).split(";")[0])
    return outcome(method, table, plan.stages, num_micro_batches, model_flops, remat)


def deepspeed_views(table: StageCostTable, num_experts: int) -> list[LogicalDeviceMesh]:
    """The grid of the DeepSpeed-style baseline: views ``(dp', ep)`` of the whole
    cluster whose minor axis ``ep`` (the expert-parallel degree) divides the
    expert count and spans at least a node (or the whole cluster if smaller)."""
    cluster = table.cluster
    whole = max(table.submeshes, key=lambda s: s[0] * s[1])
    smallest = min(cluster.devices_per_node, cluster.num_devices)
    return [
        v
        for v in table.views[whole]
        if len(v.shape) == 2 and v.shape[1] >= smallest and num_experts % v.shape[1] == 0
    ]


def deepspeed_specs(
    function: Any, param_args: Sequence[int], num_experts: int, mesh_shape: tuple[int, ...]
) -> dict[int, ShardingSpec]:
    """The argument shardings of the DeepSpeed-style plan on a ``(dp', ep)``
    view (module docstring): expert parameters split along the expert axis
    over mesh axis 1, other parameters replicated, batch-dependent arguments
    split along their first dimension over all devices where it divides."""
    from alpa_ir.dialects.sharding import ShardingSpec
    from alpa_ir.dialects.types import shape_of

    all_axes = tuple(a for a, n in enumerate(mesh_shape) if n > 1)
    devices = math.prod(mesh_shape)
    experts = (1,) if len(mesh_shape) == 2 and mesh_shape[1] > 1 else ()
    specs: dict[int, ShardingSpec] = {}
    params = set(param_args)
    for k, arg in enumerate(function.body.block.args):
        shape = tuple(shape_of(arg.type))
        if not shape:
            specs[k] = ShardingSpec(())
            continue
        rest: tuple[tuple[int, ...], ...] = ((),) * (len(shape) - 1)
        if k in params:
            is_expert = len(shape) >= 2 and shape[0] == num_experts
            specs[k] = ShardingSpec((experts if is_expert else (), *rest))
        elif shape[0] % devices == 0:
            specs[k] = ShardingSpec((all_axes, *rest))
    return specs


def deepspeed(
    ranges: LayerRanges,
    table: StageCostTable,
    options: StageCostOptions,
    num_experts: int,
    num_micro_batches: int,
    model_flops: float,
) -> Outcome:
    """DeepSpeed-style expert parallelism + ZeRO (module docstring): the best
    grid point, one stage on all devices, each layer planned with fixed
    argument shardings and without all-gathers (token exchange by all-to-all),
    the layers' costs added (as ``layer-sum``)."""
    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.costs.function_plan import with_argument_specs
    from alpa_ir.costs.stage_table import ViewCost
    from alpa_ir.pipeline.stage_construction import StageChoice

    model = AnalyticalStageCostModel(
        replace(options, keep_argument_specs=True, allow_all_gather=False)
    )
    cluster = table.cluster
    whole = max(table.submeshes, key=lambda s: s[0] * s[1])
    views = deepspeed_views(table, num_experts)
    best = Outcome(
        "deepspeed",
        error=f"no view (dp, ep) of {cluster.num_devices} devices has ep dividing "
        f"{num_experts} experts",
    )
    devices = tuple(range(cluster.num_devices))
    for view in views:
        total: ViewCost | None = None
        try:
            for k in range(ranges.num_layers):
                extracted = ranges.function(k, k)
                specs = deepspeed_specs(
                    extracted.function, extracted.param_args, num_experts, view.shape
                )
                function = with_argument_specs(extracted.function, specs)
                cost = model.stage_cost(function, view, cluster, extracted.param_args)
                m = cost.memory
                layer = ViewCost(cost.latency, m.persistent, m.activations, 0.0, m.transient)
                total = layer if total is None else add_views(total, layer)
        except AlpaError as error:  # no plan under these constraints on this view
            if not best.stages:
                best = Outcome("deepspeed", error=f"view {list(view.shape)}: {error}")
            continue
        assert total is not None
        mesh: LogicalDeviceMesh = cluster.logical_mesh(view.shape, devices)
        last = ranges.num_layers - 1
        stage = StageChoice(0, last, whole, mesh, total, total.latency)
        candidate = outcome(
            "deepspeed", table, [stage], num_micro_batches, model_flops, options.remat
        )
        if (
            not best.stages
            or candidate.iteration_time < best.iteration_time
            or (
                math.isinf(best.iteration_time)
                and math.isinf(candidate.iteration_time)
                and candidate.peak_memory_gib < best.peak_memory_gib
            )
        ):
            best = candidate
    return best


def add_views(a: ViewCost, b: ViewCost) -> ViewCost:
    """Two layers' costs on one view as one stage (``layer-sum``: latencies and
    memory added, the larger transient)."""
    from alpa_ir.costs.stage_table import ViewCost

    return ViewCost(
        a.latency + b.latency,
        a.persistent + b.persistent,
        a.activations + b.activations,
        0.0,
        max(a.transient, b.transient),
    )


def one_device(cluster: Cluster) -> Cluster:
    """One device of ``cluster`` (its figures and its device profile, no links to price)."""
    from alpa_ir.hardware.clusters import Cluster, ClusterLevel

    inner = cluster.levels[-1]
    return Cluster(
        cluster.name,
        (ClusterLevel(inner.name, 1, inner.bandwidth, inner.latency, inner.shared),),
        cluster.device_memory,
        cluster.peak_flops,
        cluster.hbm_bandwidth,
        cluster.device_name,
        profile=cluster.profile,
    )


def inter_op(
    retrace: Callable[[int], ModuleOp] | None,
    table: StageCostTable,
    model: AnalyticalStageCostModel,
    num_micro_batches: int,
    model_flops: float,
    cost_mode: str,
    remat: bool,
) -> Outcome:
    """Inter-operator parallelism only: the stage DP on 1x1 submeshes. It needs
    a layer per device; with fewer automatic layers than devices the step is
    traced again with one automatic layer per device (as Alpa's inter-op-only
    baseline clusters the model into as many layers as it needs) and only the
    1x1 costs are computed. ``retrace(layers)``: the step imported again with
    that many automatic layers (None: the table's layers only)."""
    from alpa_ir.costs.stage_table import StageCostTable, cost_table
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.pipeline.stage_construction import StageChoice

    cluster = table.cluster
    if table.num_layers < cluster.num_devices and retrace is not None:
        try:
            module = retrace(cluster.num_devices)
        except AlpaError as error:
            return Outcome("inter-op", error=f"{cluster.num_devices} layers: {error}")
        ranges = LayerRanges(main_function(module))
        single = cost_table(ranges, one_device(cluster), model, cost_mode=cost_mode)
        views = {(1, 1): single.views[(1, 1)]}
        table = StageCostTable(cluster, ((1, 1),), views, single.num_layers, single.costs)
    if table.num_layers != cluster.num_devices:
        return restricted("inter-op", table, [(1, 1)], num_micro_batches, model_flops, remat)
    # a layer per device: the only slicing, simulated even where it does not fit
    # (the outcome then reports the out-of-memory peak)
    picks = table.picks((1, 1))
    stages = []
    for k in range(table.num_layers):
        view, cost = table.picked((1, 1), picks, k, k)
        mesh = cluster.logical_mesh(view.shape, (k,))
        stages.append(StageChoice(k, k, (1, 1), mesh, cost, float(picks.latency[k, k])))
    return outcome("inter-op", table, stages, num_micro_batches, model_flops, remat)
