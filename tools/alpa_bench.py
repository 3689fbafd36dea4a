"""alpa-bench: Alpa's weak-scaling benchmark (§8.1) under the simulator.

For each paper size of a suite at its GPU count (or ``--gpus``), the step is
traced abstractly (shapes only) at the micro-batch shape with automatic
layers (``cluster-operators``), every layer range is priced on every logical
mesh view (``construct-stages``' cost table), the stage DP picks the plan and
the plan is outlined. Every plan, Alpa's and the baselines', is then
simulated from the same cost table (:func:`alpa_ir.backends.simulate.simulate`):
a stage's forward takes one third of its forward+backward latency and its
backward two thirds (backward matmuls are twice the forward FLOPs; with
rematerialization, one quarter and three quarters: the backward also runs the
forward again); its
apply-grad reads and writes its persistent state once at HBM speed; the
transfers between consecutive stages are ``construct-stages``' cross-stage
estimates (:meth:`StageCostTable.transfer_times`): the activations the later
stage receives forward, the gradients the earlier one receives back, each
link carrying one micro-batch at a time. (Re-pricing the outlined functions
with ``plan_from_module`` would auto-shard every forward, backward and
apply-grad function again; the table already holds their sum.)

As in the paper's benchmark suites, every method trains with per-layer
rematerialization (``--remat``, the default; gradient checkpointing at the
automatic layers, as Alpa's ``AutoLayerOption(remat_layer=True)``) and ZeRO-2
where data parallelism replicates parameters (``--zero``, the default; Alpa
runs the benchmark with ``prefer_reduce_scatter``): see
:mod:`alpa_ir.costs.analytical_stage_cost` for how the cost model counts both. The paper sizes
train in mixed precision (fp16 computation, fp32 parameters and Adam state,
:mod:`alpa_ir.models.registry`), and the memory estimates model XLA's operator
fusion (``--fusion``, the default; :mod:`alpa_ir.costs.fusion`): only fusion outputs
occupy memory and move through HBM. Where a layer's persistent memory is
large, it is also priced with every parameter sharded (``--memory-fallback``,
the default; ``StageCostOptions.memory_fallback``), and each stage takes the
fastest of the two plans that fits, as Alpa keeps the fastest of several
auto-sharding options per logical mesh.

Besides Alpa's plan, every run reports ``alpa+comm``: the stage DP on the same
cost table with the cross-stage transfers in its objective (option 6a,
``--cross-stage-comm`` makes that the main plan instead).

Baselines under the same simulator: ``intra-op`` (one stage on all devices),
``inter-op`` (the DP restricted to 1x1 submeshes; it needs a layer per device,
so with fewer automatic layers than devices the step is traced again with one
automatic layer per device and costed on one device), ``megatron`` (GPT:
dp x op x pp grid, equal layer counts per stage, every stage on a (dp, op)
view), ``pp-dp`` (Wide-ResNet: the same grid with op = 1) and ``deepspeed``
(MoE, below).

**DeepSpeed-style MoE** (the paper §8.1: DeepSpeed-MoE combines GShard's
expert parallelism, which "partitions the expert axis for the operators in MoE
layers, but switches back to data parallelism for non-expert layers", with
ZeRO data parallelism; it has no inter-operator parallelism, and its degrees
are grid-searched). Modelled as one stage on all devices. The grid: every
logical view ``(dp', ep)`` of the whole cluster whose minor axis ``ep``, the
expert-parallel degree, divides the expert count and spans at least one node
(DeepSpeed's ``ep_size``; the experts are replicated ``dp'`` times). On each
view every layer's function is planned by the same ILP with its argument
shardings fixed (``keep_argument_specs``) and all-gathers forbidden:
expert weights and biases (parameters whose first dimension is the expert
count) split along the expert axis over mesh axis 1, every other parameter
replicated, every batch-dependent argument (the batch, the tensors between
layers) split along its first dimension over all devices where it divides.
The ILP then finds the communication this implies: the all-to-alls between
batch-split tokens and expert-split experts (dispatch and combine, forward
and backward) and the gradient all-reduces of the replicated parameters
(ZeRO-2: reduce-scatter plus all-gather, the same bytes; optimizer state and
gradients partitioned over the replicas, ``StageCostOptions.zero``). An
all-to-all over a view axis that spans nodes is priced at the inter-node
α/β for all its bytes: DeepSpeed-MoE then had no hierarchical (intra-node
first) all-to-all, and the paper notes it "only maintains a good performance
within a node". Not modelled: DeepSpeed's tensor model parallelism for the
non-expert layers (replicated here; MoE's hidden sizes are small) and ZeRO-3.
Remat and micro-batches (gradient accumulation) as for every method.

Compile time is broken down like the paper's Table 5: clustering (tracing,
import and operator clustering), intra-op costing, DP, other (extraction,
outlining, simulation).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.passmanager.progress import ProgressBar
from alpa_ir.tools.cli_args import (
    BooleanOption,
    OneLineParser,
    nonnegative_finite_float,
    positive_int,
    positive_seconds,
)

if TYPE_CHECKING:  # imported where used: a bad option is rejected before jax loads
    from xdsl.dialects.builtin import ModuleOp

    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.costs.stage_cost import StageCostOptions
    from alpa_ir.costs.stage_table import StageCostTable, ViewCost
    from alpa_ir.dialects.sharding import ShardingSpec
    from alpa_ir.hardware.clusters import Cluster
    from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.pipeline.stage_construction import StageChoice

SUITES = {
    "gpt3": ("gpt3-350m", "gpt3-1.3b", "gpt3-2.6b", "gpt3-6.7b", "gpt3-15b", "gpt3-39b"),
    "moe": ("moe-380m", "moe-1.3b", "moe-2.4b", "moe-10b", "moe-27b", "moe-70b"),
    "wresnet": (
        "wresnet-250m",
        "wresnet-1b",
        "wresnet-2b",
        "wresnet-4b",
        "wresnet-6.8b",
        "wresnet-13b",
    ),
}
MEMORY_EFFICIENCY = 0.8


@dataclass
class Breakdown:
    clustering: float = 0.0
    costing: float = 0.0
    dp: float = 0.0
    other: float = 0.0

    @property
    def total(self) -> float:
        return self.clustering + self.costing + self.dp + self.other


@dataclass
class Outcome:
    method: str
    stages: list[dict[str, Any]] = field(default_factory=list)
    iteration_time: float = math.inf
    pflops: float = 0.0
    peak_memory_gib: float = 0.0
    error: str = ""
    pflops_ignoring_memory: float = 0.0
    """The simulated throughput with the memory check off (a plan that does not
    fit: what it would reach with enough memory; for reference only)."""
    eq2_latency: float = 0.0
    """The stage DP's objective for this plan (Eq. 2 of the stage latencies: no
    apply-grad, no transfers unless ``--cross-stage-comm``), seconds."""
    schedule: str = "1f1b"
    """The pipeline schedule the plan is simulated under."""


def bench_cluster(preset: str, gpus: int, presets: Any = None) -> Cluster:
    """The preset with ``gpus`` devices; fewer than a node: one node of ``gpus``.
    ``presets``: where to find ``preset`` (default: the built-in presets)."""
    from alpa_ir.hardware.clusters import get_cluster

    base = get_cluster(preset, presets=presets)
    if gpus >= base.devices_per_node:
        return get_cluster(preset, num_devices=gpus, presets=presets)
    return base.one_node(gpus)


def default_layers(name: str) -> int:
    """``--layers auto``: one automatic layer per block of the model (transformer
    layer, bottleneck block) and one more, where operator clustering then
    cuts at the block boundaries: the first layer holds the embedding (the
    stem), the last the head, and the layers between are identical blocks
    that are costed once (GPT-3 39B: 49 layers of 3 kinds). The stage DP gets
    the finest slicing, and rematerialization is per block."""
    from alpa_ir.models.registry import get_config

    config = get_config(name)
    stages = getattr(config, "stage_sizes", None)  # a ResNet: its bottleneck blocks
    blocks = sum(stages) if stages else getattr(config, "num_layers", 0)
    return int(blocks) + 1 if blocks else 8


def bench_optimizer(name: str) -> tuple[str, float]:
    """The optimizer a suite trains with, and its state per parameter byte for
    the cost model: Adam (m and v: 2) for GPT-3 and Wide-ResNet; Adafactor for
    MoE, as Alpa's MoE benchmark trains (its second moments are factored into
    a row and a column per matrix: next to nothing). Without that, MoE-70B's
    16 bytes per parameter exceed 64 GPUs of 16 GB whatever the plan."""
    return ("adafactor", 0.0) if name.startswith("moe") else ("adam", 2.0)


def trace(name: str, num_micro_batches: int, layers: int) -> Any:
    from alpa_ir.frontend.arguments import micro_batch_args
    from alpa_ir.frontend.jaxpr_import import import_jax
    from alpa_ir.frontend.markers import AutomaticLayers, automatic_layers
    from alpa_ir.models.train_step import make_train_step

    step, args = make_train_step(name, abstract=True, optimizer=bench_optimizer(name)[0])
    micro = micro_batch_args(tuple(args), (1,), num_micro_batches)
    with automatic_layers(AutomaticLayers(layers, 0.5, fit_delta=True)):
        # a fresh function object: JAX's trace cache must not reuse an unmarked trace
        return import_jax(lambda *a: step(*a), *micro, batch_argnums=(1,))


def outcome(
    method: str,
    table: StageCostTable,
    stages: Sequence[StageChoice],
    num_micro_batches: int,
    model_flops: float,
    remat: bool = False,
    schedule: str = "1f1b",
    mesh_of: Sequence[int] | None = None,
    phase_times: Sequence[tuple[float, ...]] | None = None,
) -> Outcome:
    """``stages`` simulated under ``schedule`` (``mesh_of``: each stage's mesh
    where several share one; ``phase_times``: the times a zero-bubble order is
    built with, None for unit times: as ``StagePlan`` has them)."""
    from alpa_ir.backends.simulate import simulate
    from alpa_ir.pipeline.schedule_choice import stage_sim_plan

    out = Outcome(method, schedule=schedule)
    out.stages = [
        {
            "layers": [s.first, s.last],
            "submesh": list(s.submesh),
            "logical_mesh": list(s.mesh.shape),
            "devices": [min(s.mesh.devices or (0,)), max(s.mesh.devices or (0,))],
        }
        for s in stages
    ]
    out.eq2_latency = sum(s.latency for s in stages) + (num_micro_batches - 1) * max(
        (s.pace for s in stages), default=0.0
    )
    plan = stage_sim_plan(table, stages, num_micro_batches, schedule, remat, mesh_of)
    plan = replace(plan, phase_times=None if phase_times is None else tuple(phase_times))
    unchecked = simulate(plan, check_memory=False)
    out.peak_memory_gib = max(unchecked.peak_memory) / 2**30
    if unchecked.iteration_time > 0:
        out.pflops_ignoring_memory = model_flops / unchecked.iteration_time / 1e15
    try:
        result = simulate(plan)
    except PlanError as error:
        out.error = f"out of memory ({error})"
        return out
    out.iteration_time = result.iteration_time
    out.pflops = model_flops / result.iteration_time / 1e15
    return out


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
    """One device of ``cluster`` (its figures, no links to price)."""
    from alpa_ir.hardware.clusters import Cluster, ClusterLevel

    inner = cluster.levels[-1]
    return Cluster(
        cluster.name,
        (ClusterLevel(inner.name, 1, inner.bandwidth, inner.latency, inner.shared),),
        cluster.device_memory,
        cluster.peak_flops,
        cluster.hbm_bandwidth,
        cluster.device_name,
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


Baselines = Callable[["LayerRanges", "StageCostTable", "StageCostOptions"], list[Outcome]]
"""Model-specific baselines of :func:`bench_module`: given the step's layer
ranges, the cost table and the cost options, their outcomes."""


def bench_model(
    name: str,
    cluster: Cluster,
    *,
    num_micro_batches: int,
    layers: int,
    cost_mode: str,
    submesh_space: str,
    cross_stage_comm: bool,
    epsilon: float,
    time_limit: float,
    remat: bool = True,
    zero: bool = True,
    fusion: bool = True,
    memory_fallback: bool = True,
    workers: int = 1,
    progress: bool = True,
    cost_model: str = "auto",
    schedule: str = "1f1b",
) -> dict[str, Any]:
    """:func:`bench_module` for the zoo model ``name``: traced abstractly with
    ``layers`` automatic layers, its analytic FLOPs, its suite's baselines."""
    from alpa_ir.models.train_step import train_step_flops

    t0 = time.perf_counter()
    module = trace(name, num_micro_batches, layers)
    clustering = time.perf_counter() - t0
    flops = train_step_flops(name)

    def baselines(
        ranges: LayerRanges, table: StageCostTable, options: StageCostOptions
    ) -> list[Outcome]:
        return zoo_baselines(name, ranges, table, options, num_micro_batches, flops)

    return bench_module(
        module,
        cluster,
        name=name,
        model_flops=flops,
        num_micro_batches=num_micro_batches,
        cost_mode=cost_mode,
        submesh_space=submesh_space,
        cross_stage_comm=cross_stage_comm,
        epsilon=epsilon,
        time_limit=time_limit,
        remat=remat,
        zero=zero,
        fusion=fusion,
        memory_fallback=memory_fallback,
        workers=workers,
        progress=progress,
        cost_model=cost_model,
        schedule=schedule,
        optimizer_state_factor=bench_optimizer(name)[1],
        clustering_time=clustering,
        retrace=lambda count: trace(name, num_micro_batches, count),
        baselines=baselines,
    )


def zoo_baselines(
    name: str,
    ranges: LayerRanges,
    table: StageCostTable,
    options: StageCostOptions,
    num_micro_batches: int,
    flops: float,
) -> list[Outcome]:
    """The suite's own baseline of zoo model ``name`` (module docstring):
    Megatron's grid for GPT, PP-DP for Wide-ResNet, DeepSpeed for MoE."""
    if name.startswith("gpt"):
        return [uniform_grid(table, num_micro_batches, flops, None, options.remat)]
    if name.startswith("wresnet"):
        return [uniform_grid(table, num_micro_batches, flops, 1, options.remat)]
    if name.startswith("moe"):
        from alpa_ir.models.registry import get_config

        experts = get_config(name).num_experts
        return [deepspeed(ranges, table, options, experts, num_micro_batches, flops)]
    return []


def bench_module(
    module: ModuleOp,
    cluster: Cluster,
    *,
    name: str,
    model_flops: float,
    num_micro_batches: int,
    cost_mode: str,
    submesh_space: str,
    cross_stage_comm: bool,
    epsilon: float,
    time_limit: float,
    remat: bool = True,
    zero: bool = True,
    fusion: bool = True,
    memory_fallback: bool = True,
    workers: int = 1,
    progress: bool = True,
    cost_model: str = "auto",
    optimizer_state_factor: float = 2.0,
    clustering_time: float = 0.0,
    retrace: Callable[[int], ModuleOp] | None = None,
    baselines: Baselines | None = None,
    schedule: str = "1f1b",
) -> dict[str, Any]:
    """Alpa's plan and the baselines of a step already imported at the
    micro-batch shape with its automatic layers (``module``; ``name`` labels
    the result): every layer priced on every view, the stage DP, the plans
    simulated. ``model_flops``: FLOPs of one training step (the PFLOPS
    figures); ``clustering_time``: seconds the import and clustering took
    (Table 5's first column); ``retrace(layers)``: the step imported again
    with that many automatic layers, for the inter-op baseline (None: it
    plans on the layers ``module`` has); ``baselines``: more baselines;
    ``schedule``: Alpa's plan's pipeline schedule (``auto``: chosen with the
    stages, every candidate's time in ``schedules``)."""
    from alpa_ir.api.why_plan import stage_reasons
    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.costs.stage_table import cost_table
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.passmanager.pipeline_syntax import format_pipeline
    from alpa_ir.pipeline.layer_phases import layer_phase_flops
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.pipeline.stage_assignment import count_layers
    from alpa_ir.pipeline.stage_construction import StagePlan, plan_stages, write_plan
    from alpa_ir.plugins.registry import default_registry

    times = Breakdown(clustering=clustering_time)
    t1 = time.perf_counter()
    ranges = LayerRanges(main_function(module))
    t2 = time.perf_counter()
    stage_pass = default_registry().get_pass("construct-stages")(
        cluster=cluster.name,
        num_devices=cluster.num_devices,
        num_micro_batches=num_micro_batches,
        submesh_space=submesh_space,  # type: ignore[arg-type]
        epsilon=epsilon,
        cost_mode=cost_mode,  # type: ignore[arg-type]
        cross_stage_comm=cross_stage_comm,
        progress=progress,
        workers=workers,
        remat=remat,
        zero=zero,
        fusion=fusion,
        memory_fallback=memory_fallback,
        optimizer_state_factor=optimizer_state_factor,
        time_limit=time_limit,
        cost_model=cost_model,
        schedule=schedule,
    )
    options = stage_pass.cost_options()
    model = AnalyticalStageCostModel(options)
    table = cost_table(
        ranges,
        cluster,
        model,
        space=submesh_space,
        cost_mode=cost_mode,
        workers=workers,
        progress=progress,
        phase_flops=layer_phase_flops(ranges),
    )
    t3 = time.perf_counter()
    times.costing = t3 - t2
    flops = model_flops
    result: dict[str, Any] = {
        "model": name,
        "gpus": cluster.num_devices,
        "cluster": cluster.name,
        "num_micro_batches": num_micro_batches,
        "layers": count_layers(main_function(module)),
        "cost_mode": cost_mode,
        "submesh_space": submesh_space,
        "cross_stage_comm": cross_stage_comm,
        "remat": remat,
        "zero": zero,
        "fusion": fusion,
        "memory_fallback": memory_fallback,
        "workers": workers,
        "pass_pipeline": format_pipeline([stage_pass]),
        "cache": {"hits": model.stats.hits, "misses": model.stats.misses},
    }
    plan: StagePlan | None = None
    plan_options = {"epsilon": epsilon, "remat": remat}
    try:
        plan = plan_stages(
            table,
            num_micro_batches,
            schedule,
            cross_stage_comm=cross_stage_comm,
            **plan_options,  # type: ignore[arg-type]
        )
        alpa = outcome(
            "alpa",
            table,
            plan.stages,
            num_micro_batches,
            flops,
            remat,
            plan.schedule,
            plan.mesh_of,
            plan.phase_times,
        )
        result["why"] = [r.text() for r in stage_reasons(table, plan)]
        if plan.candidates:
            result["schedules"] = {
                c.schedule: {
                    "iteration_time": c.iteration_time,
                    "stages": len(c.plan.stages) if c.plan is not None else 0,  # type: ignore[attr-defined]
                    "meshes": len(set(c.plan.mesh_of or c.plan.stages)) if c.plan else 0,  # type: ignore[attr-defined]
                    "note": c.note.split(";")[0],
                }
                for c in plan.candidates
            }
    except (AlpaError, PlanError) as error:
        alpa = Outcome("alpa", error=str(error))
    t4 = time.perf_counter()
    times.dp = t4 - t3
    if plan is not None:
        write_plan(module, plan, num_micro_batches)
    times.other = (t2 - t1) + (time.perf_counter() - t4)
    whole = max(table.submeshes, key=lambda s: s[0] * s[1])
    outcomes = [alpa]
    if not cross_stage_comm:
        # option 6a on the same table: the DP also counts the cross-stage transfers
        try:
            with_comm = plan_stages(
                table,
                num_micro_batches,
                schedule,
                cross_stage_comm=True,
                **plan_options,  # type: ignore[arg-type]
            )
            outcomes.append(
                outcome(
                    "alpa+comm",
                    table,
                    with_comm.stages,
                    num_micro_batches,
                    flops,
                    remat,
                    with_comm.schedule,
                    with_comm.mesh_of,
                    with_comm.phase_times,
                )
            )
        except (AlpaError, PlanError) as error:
            outcomes.append(Outcome("alpa+comm", error=str(error).split(";")[0]))
    outcomes += [
        restricted("intra-op", table, [whole], num_micro_batches, flops, remat),
        inter_op(retrace, table, model, num_micro_batches, flops, cost_mode, remat),
    ]
    if baselines is not None:
        outcomes += baselines(ranges, table, options)
    result["outcomes"] = [o.__dict__ for o in outcomes]
    result["compile_time"] = {**times.__dict__, "total": times.total}
    return result


def auto_micro_batches(name: str, candidates: Sequence[int], **kwargs: Any) -> dict[str, Any]:
    """Option ``micro-batches=auto``: the best simulated Alpa plan over ``candidates``."""
    best: dict[str, Any] | None = None
    tried = []
    for b in candidates:
        result = bench_model(name, num_micro_batches=b, **kwargs)
        time_b = result["outcomes"][0]["iteration_time"]
        tried.append({"num_micro_batches": b, "iteration_time": time_b})
        if best is None or time_b < best["outcomes"][0]["iteration_time"]:
            best = result
    assert best is not None
    best["micro_batch_search"] = tried
    return best


def batch_divisors(batch: int, limit: int) -> list[int]:
    return [
        1 << k for k in range(limit.bit_length()) if (1 << k) <= limit and batch % (1 << k) == 0
    ]


def format_result(result: dict[str, Any], why: bool = False) -> str:
    lines = [
        f"{result['model']} on {result['gpus']} GPUs ({result['cluster']}), "
        f"B={result['num_micro_batches']}, {result['layers']} layers, "
        f"remat {'on' if result['remat'] else 'off'}, zero {'on' if result['zero'] else 'off'}, "
        f"fusion {'on' if result.get('fusion') else 'off'}, "
        f"cost cache {result['cache']['hits']} hits / {result['cache']['misses']} misses"
    ]
    lines.append(
        f"  {'method':<10} {'PFLOPS':>8} {'iter s':>9} {'Eq.2 s':>9} {'peak GiB':>9} "
        f"{'schedule':<8}  plan"
    )
    for o in result["outcomes"]:
        plan = " | ".join(
            f"L{s['layers'][0]}-{s['layers'][1]} {s['submesh'][0]}x{s['submesh'][1]}"
            f"->{s['logical_mesh'][0]}x{s['logical_mesh'][1]}"
            for s in o["stages"]
        )
        if o["error"]:
            unchecked = o.get("pflops_ignoring_memory", 0.0)
            if unchecked:
                plan = f"(ignoring memory: {unchecked:.4g} PFLOPS) {plan}"
            plan = f"{o['error']}  {plan}"[:300]
        lines.append(
            f"  {o['method']:<10} {o['pflops']:8.4g} {o['iteration_time']:9.4g} "
            f"{o.get('eq2_latency', 0.0):9.4g} {o['peak_memory_gib']:9.2f} "
            f"{o.get('schedule', '1f1b'):<8}  {plan}"
        )
    if result.get("schedules"):
        tried = ", ".join(
            f"{name} {c['iteration_time']:.4g} s ({c['stages']} stages)"
            if c["stages"] and c["iteration_time"] != math.inf
            else f"{name}: {c['note'] or 'no plan'}"
            for name, c in result["schedules"].items()
        )
        lines.append(f"  schedules (chosen first): {tried}")
    for reason in result.get("why", []) if why else []:
        lines.append(f"  why: {reason}")
    c = result["compile_time"]
    lines.append(
        f"  compile time {c['total']:.1f} s: clustering {c['clustering']:.1f}, "
        f"intra-op costing {c['costing']:.1f}, DP {c['dp']:.2f}, other {c['other']:.1f}"
    )
    if "micro_batch_search" in result:
        tried = ", ".join(
            f"B={t['num_micro_batches']}: {t['iteration_time']:.4g} s"
            for t in result["micro_batch_search"]
        )
        lines.append(f"  micro-batch search: {tried}")
    return "\n".join(lines)


MAX_VIEWS = 1024
"""The most logical mesh views a benchmarked cluster may have over all the
submeshes of Alpa's space: ``construct-stages`` prices every layer on each of
them and the stage DP runs over every submesh and device count, so the work
grows with the cluster (64 GPUs of 8-GPU nodes: 62 views; 1024 GPUs: 1746
views, GPT-3 350M still costing after 5 minutes on 2 cores; 100000 GPUs:
312635 views, minutes before the first progress line). ``--gpus`` beyond it
is rejected at once, saying so, rather than left running."""
DEFAULT_MICRO_BATCHES = 16
DEFAULT_MAX_MICRO_BATCHES = 64
WORKERS_PER_CORE = 4


def _auto_or_positive(text: str) -> int | str:
    if text.strip() == "auto":
        return "auto"
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be 'auto' or a positive integer, got {text!r}"
        ) from None


def _micro_batches_arg(text: str) -> int | str:
    try:
        return _auto_or_positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be a positive integer or 'auto', got {text!r}"
        ) from None


def _cluster_presets(name: str = "") -> Any:
    """The cluster presets: the built-in ones (without loading the plugins) where
    they have ``name``, else the plugin registry's."""
    from alpa_ir.hardware.clusters import builtin_presets

    builtin = builtin_presets()
    if name and name in builtin:
        return builtin
    from alpa_ir.plugins.registry import default_registry

    return default_registry().cluster_presets


def _divisor_count(n: int) -> int:
    count, k = 0, 1
    while k * k <= n:
        if n % k == 0:
            count += 1 if k * k == n else 2
        k += 1
    return count


def count_views(cluster: Cluster, limit: int = MAX_VIEWS) -> tuple[int, int]:
    """(submeshes, logical views) of Alpa's submesh space of ``cluster`` (every
    view of each submesh, the ``all`` space); the views are counted only up to
    just past ``limit``, without building the submeshes of a huge cluster."""
    m, nodes = cluster.devices_per_node, cluster.num_nodes
    if m & (m - 1):
        cluster.submesh_shapes()  # raises: not a power of two per node
    shapes = itertools.chain(
        ((1, 1 << k) for k in range(m.bit_length())), ((n, m) for n in range(2, nodes + 1))
    )
    views = 0
    for n, size in shapes:
        views += _divisor_count(n * size)
        if views > limit:
            break
    return m.bit_length() + nodes - 1, views


def most_gpus(devices_per_node: int, limit: int = MAX_VIEWS) -> int:
    """The largest whole-node GPU count whose cluster has at most ``limit`` views."""
    m = devices_per_node
    views = sum(_divisor_count(1 << k) for k in range(m.bit_length()))
    nodes = 1
    while views + _divisor_count((nodes + 1) * m) <= limit:
        nodes += 1
        views += _divisor_count(nodes * m)
    return nodes * m


def _gpus(count: int) -> str:
    return f"{count} GPU{'s' * (count != 1)}"


def _epilog() -> str:
    """``--help``'s list of cluster presets, suites and models."""
    from alpa_ir.hardware.clusters import Cluster
    from alpa_ir.models.registry import get_config, list_configs

    presets = []
    for name, factory in sorted(_cluster_presets().items()):
        try:
            probe = factory(None)
        except AlpaError:
            presets.append(f"  {name}")
            continue
        if isinstance(probe, Cluster):
            presets.append(
                f"  {name}: {probe.devices_per_node} {probe.device_name or 'devices'} per node, "
                f"{probe.num_nodes} node{'s' * (probe.num_nodes != 1)} by default"
            )
    suites = []
    for suite, names in SUITES.items():
        sizes = ", ".join(f"{n} ({_gpus(get_config(n).num_gpus)})" for n in names)
        suites.append(f"  {suite}: {sizes}")
    in_suites = {n for names in SUITES.values() for n in names}
    others = ", ".join(n for n in list_configs() if n not in in_suites)
    return "\n".join(
        [
            "cluster presets (--cluster):",
            *presets,
            "",
            "suites (--suite) and their sizes (--models), each on its GPU count by default:",
            *suites,
            "",
            f"other models (--models only, without --suite): {others}",
            "",
            "--gpus must fit the preset (whole nodes, or a power of two below one node) and "
            f"give at most {MAX_VIEWS} logical mesh views (alpa-testbed: {most_gpus(8)} GPUs).",
        ]
    )


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="alpa-bench", description=__doc__.splitlines()[0], epilog_fn=_epilog
    )
    parser.add_argument(
        "--suite",
        choices=sorted(SUITES),
        default=None,
        help="the suite whose sizes to run (default: gpt3, unless --models names the models)",
    )
    parser.add_argument(
        "--models",
        default=None,
        help="comma-separated model configs (default: every size of the suite); with "
        "--suite, sizes of that suite only",
    )
    parser.add_argument("--cluster", default="alpa-testbed", help="cluster preset (see below)")
    parser.add_argument(
        "--gpus",
        type=positive_int,
        default=None,
        help="GPUs for every model (default: each size's GPU count in the paper)",
    )
    parser.add_argument(
        "--micro-batches",
        type=_micro_batches_arg,
        default=DEFAULT_MICRO_BATCHES,
        help="micro-batches per step: a positive integer dividing each model's global batch, "
        "or 'auto' (the best power of two up to --max-micro-batches)",
    )
    parser.add_argument(
        "--max-micro-batches",
        type=positive_int,
        default=None,
        help=f"with --micro-batches auto: the most micro-batches tried "
        f"(default: {DEFAULT_MAX_MICRO_BATCHES})",
    )
    parser.add_argument(
        "--layers",
        type=_auto_or_positive,
        default="auto",
        help="automatic layers: a positive integer, or 'auto' (one per block of the model and "
        "one more, see default_layers)",
    )
    parser.add_argument(
        "--cost-mode",
        choices=("range", "layer-sum"),
        default="layer-sum",
        help="price every layer range, or each layer once and sum",
    )
    parser.add_argument(
        "--submesh-space",
        choices=("all", "single-node-model-parallel", "one-dimensional"),
        default="all",
        help="the logical mesh views kept per submesh",
    )
    parser.add_argument(
        "--cross-stage-comm",
        action="store_true",
        help="the stage DP counts the cross-stage transfers (option 6a) for the main plan",
    )
    parser.add_argument(
        "--epsilon",
        type=nonnegative_finite_float,
        default=0.0,
        help="the stage DP's epsilon gap in seconds (0: exact)",
    )
    parser.add_argument(
        "--time-limit",
        type=positive_seconds,
        default=60.0,
        help="ILP time limit in seconds (inf: none)",
    )
    parser.add_argument(
        "--schedule",
        choices=("1f1b", "gpipe", "zb-h1", "interleaved-1f1b", "zb-v", "auto"),
        default="1f1b",
        help="the pipeline schedule of Alpa's plan (auto: chosen with the stages among "
        "1f1b, zb-h1, interleaved-1f1b, zb-v and gpipe; the baselines keep 1F1B)",
    )
    parser.add_argument(
        "--cost-model",
        default="auto",
        help="the stages' communication cost model (auto: calibrated on GPU presets; "
        "alpha-beta: Alpa's formulas; or any registered one)",
    )
    for flag, help_text in (
        ("--remat", "rematerialize every layer (the paper's setting)"),
        ("--zero", "ZeRO-2 for replicated parameters (Alpa's prefer_reduce_scatter)"),
        ("--fusion", "model XLA's operator fusion in activation memory and memory traffic"),
        ("--memory-fallback", "also price every large layer with all parameters sharded"),
    ):
        parser.add_argument(flag, action=BooleanOption, default=True, help=help_text)
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=os.cpu_count() or 1,
        help=f"processes that cost the stage-mesh pairs (at most {WORKERS_PER_CORE} per core; "
        "the default is one per core)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--quiet", action="store_true", help="no progress display (shown only on a terminal)"
    )
    parser.add_argument(
        "--why",
        action="store_true",
        help="print why each stage has its logical mesh: its latency beside the runner-up's "
        "(always in --json, as 'why')",
    )
    parser.add_argument(
        "--figure",
        metavar="PATH",
        help="draw PFLOPS against GPUs for every method (the paper's Figure 7) into PATH "
        "(.png or .svg); saved --json results: python -m alpa_ir.plots.scaling",
    )
    return parser


@dataclass(frozen=True)
class BenchRun:
    """One model of the run, checked before any work starts."""

    name: str
    cluster: Cluster
    layers: int
    batch_size: int


def _model_names(parser: OneLineParser, args: argparse.Namespace) -> list[str]:
    from alpa_ir.models.registry import list_configs

    if args.models is None:
        return list(SUITES[args.suite or "gpt3"])
    names = [n.strip() for n in args.models.split(",")]
    if not any(names):
        parser.error(f"--models must name at least one model, got {args.models!r}")
    if not all(names):
        parser.error(f"--models has an empty name in {args.models!r}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        parser.error(f"--models names {repeated[0]!r} twice in {args.models!r}")
    known = list_configs()
    for n in names:
        if n not in known:
            parser.error(f"--models: unknown model {n!r}; known: {', '.join(known)}")
    if args.suite is not None:
        for n in names:
            if n not in SUITES[args.suite]:
                home = [s for s, sizes in SUITES.items() if n in sizes]
                where = f"a size of suite {home[0]}" if home else "in no suite"
                parser.error(
                    f"--models {n!r} is not a size of --suite {args.suite} ({n} is {where}; "
                    f"{args.suite} has {', '.join(SUITES[args.suite])}); drop --suite to run it"
                )
    return names


def _bench_cluster_checked(
    parser: OneLineParser, args: argparse.Namespace, gpus: int, name: str
) -> Cluster:
    """``bench_cluster`` for ``name`` on ``gpus`` GPUs, with every reason it cannot
    be benchmarked as a usage error."""
    preset = args.cluster
    presets = _cluster_presets(preset)
    if preset not in presets:
        parser.error(
            f"--cluster: unknown cluster preset {preset!r}; known: {', '.join(sorted(presets))}"
        )
    where = (
        f"--gpus {gpus}"
        if args.gpus is not None
        else f"--cluster {preset} cannot run {name} on its {gpus} GPU{'s' * (gpus != 1)} "
        "(--gpus picks another count)"
    )
    try:
        cluster = bench_cluster(preset, gpus, presets=presets)
        subs, views = count_views(cluster)
    except AlpaError as error:
        parser.error(f"{where}: {error}")
    if views > MAX_VIEWS:
        best = most_gpus(cluster.devices_per_node)
        parser.error(
            f"{where}: too many GPUs to plan on {preset}: its {subs} submeshes have more "
            f"than {MAX_VIEWS} logical mesh views, each priced for every layer (at most "
            f"{best} GPUs on nodes of {cluster.devices_per_node})"
        )
    return cluster


def check_args(parser: OneLineParser, args: argparse.Namespace) -> list[BenchRun]:
    """Every option checked (and every model's cluster built) before any work:
    a bad value is a usage error that names the option and the value."""
    cores = os.cpu_count() or 1
    if args.figure is not None:
        figure = Path(args.figure)
        if figure.suffix.lower() not in (".png", ".svg"):
            parser.error(f"--figure must name a .png or .svg file, got {args.figure!r}")
        if not figure.parent.is_dir():
            parser.error(f"--figure {args.figure}: folder {figure.parent} does not exist")
    if args.workers > WORKERS_PER_CORE * cores:
        parser.error(
            f"--workers must be at most {WORKERS_PER_CORE} per CPU core "
            f"({WORKERS_PER_CORE * cores} on {cores} cores), got {args.workers}"
        )
    if args.max_micro_batches is not None and args.micro_batches != "auto":
        parser.error(
            f"--max-micro-batches {args.max_micro_batches} applies only with "
            f"--micro-batches auto, got --micro-batches {args.micro_batches}"
        )
    from alpa_ir.hardware.memory_budget import given_memory_budget
    from alpa_ir.models.registry import get_config

    try:  # the local devices' budget given by hand (read by the local-cpu preset)
        given_memory_budget()
    except AlpaError as error:
        parser.error(str(error))
    runs = []
    clusters: dict[int, Cluster] = {}
    for name in _model_names(parser, args):
        config = get_config(name)
        gpus = args.gpus if args.gpus is not None else int(config.num_gpus)
        if gpus not in clusters:
            clusters[gpus] = _bench_cluster_checked(parser, args, gpus, name)
        batch = int(config.batch_size)
        if args.micro_batches != "auto" and batch % args.micro_batches:
            parser.error(
                f"--micro-batches {args.micro_batches} does not divide the global batch of "
                f"{name} ({batch}); use a divisor of {batch} or 'auto'"
            )
        layers = default_layers(name) if args.layers == "auto" else args.layers
        runs.append(BenchRun(name, clusters[gpus], layers, batch))
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    runs = check_args(parser, args)
    max_micro_batches = args.max_micro_batches or DEFAULT_MAX_MICRO_BATCHES
    results = []
    suite = ProgressBar("alpa-bench", len(runs), enabled=not args.quiet and len(runs) > 1)
    try:
        with suite:
            for done, run in enumerate(runs):
                suite.update(done, f"alpa-bench: {run.name} on {run.cluster.num_devices} GPUs")
                common = {
                    "cluster": run.cluster,
                    "layers": run.layers,
                    "cost_mode": args.cost_mode,
                    "submesh_space": args.submesh_space,
                    "cross_stage_comm": args.cross_stage_comm,
                    "epsilon": args.epsilon,
                    "time_limit": args.time_limit,
                    "remat": args.remat,
                    "zero": args.zero,
                    "fusion": args.fusion,
                    "memory_fallback": args.memory_fallback,
                    "workers": args.workers,
                    "progress": not args.quiet,
                    "cost_model": args.cost_model,
                    "schedule": args.schedule,
                }
                try:
                    if args.micro_batches == "auto":
                        candidates = batch_divisors(run.batch_size, max_micro_batches)
                        result = auto_micro_batches(run.name, candidates, **common)
                    else:
                        result = bench_model(
                            run.name, num_micro_batches=args.micro_batches, **common
                        )
                except AlpaError as error:
                    if args.layers != "auto" and str(error).startswith("cluster-operators:"):
                        raise AlpaError(
                            f"--layers {args.layers} for {run.name}: {error}"
                        ) from error
                    raise AlpaError(f"{run.name}: {error}") from error
                results.append(result)
                if not args.json:
                    print(format_result(result, args.why), flush=True)
            suite.update(len(runs))
        if args.json:
            print(json.dumps(results, indent=1, default=float))
        if args.figure:
            from alpa_ir.plots.scaling import draw_scaling

            drawn = draw_scaling(results, args.figure).path
            print(f"figure: {drawn}", file=sys.stderr if args.json else sys.stdout)
    except AlpaError as error:
        print(f"alpa-bench: error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    os.environ["JAX_PLATFORMS"] = "cpu"  # before jax loads (as jax_platforms=cpu)
    sys.exit(main())
