"""Stage construction (Alpa OSDI'22 §5.2, steps 2 and 3) and the schedule choice.

2. **DP.** :func:`alpa_ir.algorithms.stage_dp` over the cost table
   (:mod:`alpa_ir.costs.stage_table`): Eq. 2–5, exact; ``epsilon`` as there, in
   seconds.
3. **Placement.** Submeshes are laid out on the device ids largest first (so
   every ``(1, 2^k)`` block and every whole-node block stays aligned), stages
   of one size in pipeline order (neighbouring stages on neighbouring
   devices). Each stage gets a ``mesh.logical_mesh @meshK`` of its chosen view
   with α/β re-derived on its real devices, then :func:`outline_stages`
   writes the pipeline IR.

Beyond Alpa: ``cross-stage-comm`` puts the transfers between stages into the
DP's objective. Each link is treated as a pipeline stage of its own: one
micro-batch's trip through the pipeline crosses every link once each way, so
the transfers add to the stage's latency in Eq. 2's sum, and a link carries
one micro-batch at a time, so in the ``(B − 1)·max`` term a stage counts as
the slowest of its compute and its two incoming links (``stage_dp``'s
``bottleneck``): a transfer shorter than the compute is hidden behind it, a
slower link paces the pipeline. The ``simulate`` backend models links the
same way. The number of micro-batches cannot be searched inside a pass (the
step is traced at one micro-batch shape); ``alpa-bench --micro-batches auto``
does it by re-tracing per candidate.

The schedule is chosen with the stages (:mod:`alpa_ir.pipeline.schedule_choice`):
``schedule=auto`` runs the DP once per candidate schedule with that schedule's
latency (Eq. 2 generalised) and keeps the plan the simulator times fastest
among those that fit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from xdsl.dialects.builtin import FloatAttr, ModuleOp, f64

from alpa_ir.algorithms.stage_dp import StageDPResult, stage_dp
from alpa_ir.costs.stage_cost import (
    AnalyticalStageCostModel,
    StageCostModel,
)
from alpa_ir.costs.stage_table import StageCostTable, ViewCost, cost_table
from alpa_ir.dialects.mesh import ClusterOp
from alpa_ir.dialects.pipeline import PlanOp
from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.hardware.memory_budget import format_gib
from alpa_ir.ir.module_utils import main_function, top_level_ops
from alpa_ir.pipeline.stage_outline import LayerRanges, StageSlice, fresh_mesh_names, outline_stages

LATENCY_ATTR = "construct_stages.latency"


@dataclass
class Timings:
    """Seconds spent per part (the paper's Table 5 columns, minus clustering)."""

    costing: float = 0.0
    dp: float = 0.0
    other: float = 0.0


@dataclass(frozen=True)
class StageChoice:
    """One stage of a plan: layers, submesh, logical mesh (on its real devices), cost."""

    first: int
    last: int
    submesh: tuple[int, int]
    mesh: LogicalDeviceMesh
    cost: ViewCost
    latency: float
    pace: float = math.nan
    """The stage's value in the DP's ``(B − 1)·max`` term: its latency, or with
    ``cross-stage-comm`` the slowest of its compute and incoming links (NaN: the latency)."""

    def __post_init__(self) -> None:
        if math.isnan(self.pace):
            object.__setattr__(self, "pace", self.latency)


@dataclass(frozen=True)
class StagePlan:
    stages: tuple[StageChoice, ...]
    latency: float
    """Eq. 2 of the DP's stage latencies, seconds per iteration."""
    dp_solves: int = 0


def solve_stages(
    table: StageCostTable,
    num_micro_batches: int,
    *,
    epsilon: float = 0.0,
    cross_stage_comm: bool = False,
    submeshes: Sequence[tuple[int, int]] | None = None,
) -> StagePlan:
    """The DP over the table (step 2) and the placement (step 3)."""
    cluster = table.cluster
    chosen = list(submeshes or table.submeshes)
    num = table.num_layers
    devices = cluster.num_devices
    largest = max(a * b for a, b in chosen)
    if largest * num < devices:
        need = -(-devices // largest)
        raise AlpaError(
            f"construct-stages: the {devices} devices need at least {need} stages of at most "
            f"{largest} devices but the step has only {num} layers"
        )
    picks = [table.picks(submesh, cross_stage_comm) for submesh in chosen]
    costs = np.stack([p.latency for p in picks], axis=-1)
    pace = np.stack([p.pace for p in picks], axis=-1)
    limit = np.stack([p.max_stages_after for p in picks], axis=-1)
    sizes = [a * b for a, b in chosen]
    try:
        result: StageDPResult = stage_dp(
            costs,
            sizes,
            devices,
            num_micro_batches,
            limit,
            epsilon=epsilon,
            bottleneck=pace if cross_stage_comm else None,
        )
    except PlanError as error:
        whole = [m for m, s in enumerate(sizes) if s == devices]
        if not whole:
            raise
        one_stage = min(picks[m].peak[0, num - 1] for m in whole)
        source = f" ({cluster.memory_source})" if cluster.memory_source else ""
        raise PlanError(
            f"construct-stages: no pipeline plan fits in {format_gib(cluster.device_memory)} "
            f"per device{source}; the best one-stage plan on all {devices} devices needs "
            f"{format_gib(one_stage)}"
        ) from error
    stages = _place(cluster, [(i, j, chosen[m]) for i, j, m in result.stages])
    out = []
    for (i, j, m), (submesh, devices_of) in zip(result.stages, stages, strict=True):
        view, cost = table.picked(submesh, picks[m], i, j)
        mesh = cluster.logical_mesh(view.shape, devices_of)
        latency = float(costs[i, j, m])
        stage_pace = float(pace[i, j, m]) if cross_stage_comm else latency
        out.append(StageChoice(i, j, submesh, mesh, cost, latency, stage_pace))
    return StagePlan(tuple(out), result.total_latency, result.dp_solves)


def _place(
    cluster: Cluster, stages: Sequence[tuple[int, int, tuple[int, int]]]
) -> list[tuple[tuple[int, int], tuple[int, ...]]]:
    """Device ids per stage: largest submeshes first, stages of one size in order."""
    order = sorted(range(len(stages)), key=lambda k: (-stages[k][2][0] * stages[k][2][1], k))
    start = 0
    devices: dict[int, tuple[int, ...]] = {}
    for k in order:
        n, m = stages[k][2]
        devices[k] = tuple(range(start, start + n * m))
        start += n * m
    return [(stages[k][2], devices[k]) for k in range(len(stages))]


def write_plan(
    module: ModuleOp,
    plan: StagePlan,
    num_micro_batches: int,
    schedule: str,
    remat: bool = False,
) -> None:
    """``mesh.logical_mesh @meshK`` per stage, then the outlined pipeline IR."""
    main = main_function(module)
    names = fresh_mesh_names(module, len(plan.stages))
    for stage, name in zip(plan.stages, names, strict=True):
        module.body.block.insert_op_before(stage.mesh.to_op(name), main)
    slices = [StageSlice(s.first, s.last, n) for s, n in zip(plan.stages, names, strict=True)]
    outline_stages(module, slices, num_micro_batches, schedule, remat)
    for op in top_level_ops(module, PlanOp):
        op.attributes[LATENCY_ATTR] = FloatAttr(plan.latency, f64)


def _on_devices(plan: StagePlan, devices: tuple[int, ...]) -> StagePlan:
    """``plan`` with its meshes' device ids ``0..n-1`` replaced by ``devices``."""
    stages = tuple(
        replace(s, mesh=replace(s.mesh, devices=tuple(devices[d] for d in s.mesh.devices or ())))
        for s in plan.stages
    )
    return replace(plan, stages=stages)


def module_cluster(
    module: ModuleOp,
    preset: str,
    presets: Mapping[str, Callable[..., object]] | None = None,
    num_devices: int = 0,
) -> Cluster:
    """The cluster: preset ``preset`` (as many nodes as hold ``num_devices``
    devices, or as it has by default) among ``presets`` (default: the default
    registry's), else the module's ``mesh.cluster``."""
    if preset:
        from alpa_ir.hardware.clusters import get_cluster

        return get_cluster(preset, presets=presets, num_devices=num_devices or None)
    cluster = Cluster.of_module(module)
    if cluster is None:
        raise AlpaError(
            "construct-stages: the module has no mesh.cluster; give the option cluster=<preset>"
        )
    return cluster


def construct_stages(
    module: ModuleOp,
    cluster: Cluster,
    *,
    num_micro_batches: int = 1,
    schedule: str = "1f1b",
    submesh_space: str = "all",
    epsilon: float = 0.0,
    cost_mode: str = "range",
    cross_stage_comm: bool = False,
    model: StageCostModel | None = None,
    progress: bool = True,
    timings: Timings | None = None,
    workers: int = 1,
    remat: bool = False,
    devices: Sequence[int] = (),
) -> StagePlan:
    """The pass as a function: plan, write the plan into ``module``, return it
    (``remat``: the stages' backward functions recompute their forward values;
    ``devices``: the ids the cluster's devices stand for, default ``0..n-1``)."""
    if devices and len(devices) != cluster.num_devices:
        raise AlpaError(
            f"construct-stages: {len(devices)} device ids given for the {cluster.num_devices} "
            f"devices of cluster '{cluster.name}'"
        )
    timings = timings if timings is not None else Timings()
    if num_micro_batches < 1:
        raise AlpaError(
            f"construct-stages: num-micro-batches must be >= 1, got {num_micro_batches}"
        )
    if not list(top_level_ops(module, ClusterOp)):
        module.body.block.insert_op_before(cluster.to_op(), main_function(module))
    t0 = time.perf_counter()
    ranges = LayerRanges(main_function(module))
    t1 = time.perf_counter()
    table = cost_table(
        ranges,
        cluster,
        model or AnalyticalStageCostModel(),
        space=submesh_space,
        cost_mode=cost_mode,
        progress=progress,
        workers=workers,
    )
    t2 = time.perf_counter()
    plan = solve_stages(
        table, num_micro_batches, epsilon=epsilon, cross_stage_comm=cross_stage_comm
    )
    t3 = time.perf_counter()
    if devices:
        plan = _on_devices(plan, tuple(devices))
    write_plan(module, plan, num_micro_batches, schedule, remat)
    t4 = time.perf_counter()
    timings.costing += t2 - t1
    timings.dp += t3 - t2
    timings.other += (t1 - t0) + (t4 - t3)
    return plan


__all__ = [
    "LATENCY_ATTR",
    "StageChoice",
    "StagePlan",
    "Timings",
    "construct_stages",
    "module_cluster",
    "solve_stages",
    "write_plan",
]
