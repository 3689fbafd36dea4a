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
from typing import Literal

import numpy as np
from xdsl.dialects.builtin import DenseArrayBase, DictionaryAttr, FloatAttr, ModuleOp, f64, i64

from alpa_ir.algorithms.stage_dp import StageDPResult, stage_dp
from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.costs.costing_workers import StartedWorkers
from alpa_ir.costs.stage_cost import StageCostModel
from alpa_ir.costs.stage_table import StageCostTable, ViewCost, cost_table
from alpa_ir.dialects.mesh import ClusterOp
from alpa_ir.dialects.pipeline import PlanOp
from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.hardware.memory_budget import format_gib
from alpa_ir.ir.module_utils import main_function, top_level_ops
from alpa_ir.pipeline.layer_phases import layer_phase_flops
from alpa_ir.pipeline.layer_ranges import LayerRanges
from alpa_ir.pipeline.pipeline_simulation import SimPlan, simulate
from alpa_ir.pipeline.schedule_choice import (
    AUTO_SCHEDULES,
    VIRTUAL_STAGES,
    ScheduleCandidate,
    dp_latencies,
    phase_times,
    stage_sim_plan,
)
from alpa_ir.pipeline.stage_assignment import StageSlice, fresh_mesh_names
from alpa_ir.pipeline.stage_outline import outline_stages
from alpa_ir.pipeline.virtual_layout import (
    VirtualMesh,
    balance_chunks,
    chunk_layout,
    load_bound,
    memory_floor,
)

LATENCY_ATTR = "construct_stages.latency"
SCHEDULES_ATTR = "construct_stages.schedules"
"""Each schedule's simulated seconds per iteration, with ``schedule=auto``."""


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
    schedule: str = "1f1b"
    """The pipeline schedule the plan runs."""
    in_flight: tuple[int, ...] | None = None
    """Per stage, the micro-batches it may hold in flight (zero-bubble schedules)."""
    candidates: tuple[ScheduleCandidate, ...] = ()
    """With ``schedule=auto``: every schedule's best plan, the chosen one first."""
    mesh_of: tuple[int, ...] | None = None
    """Each stage's mesh where several stages share one (virtual stages): the
    index of the mesh's first stage among the distinct meshes; None: one each."""
    phase_times: tuple[tuple[float, ...], ...] | None = None
    """Per stage, the forward, B and W seconds (and when its forward and gradient
    inputs arrive) the zero-bubble order is built with."""


ONE_CHUNK = {"interleaved-1f1b": "1f1b", "zb-v": "zb-h1"}
"""The schedule of one chunk per mesh whose DP values a virtual schedule's are
(divided by its chunks per mesh, :func:`~alpa_ir.pipeline.schedule_choice.dp_latencies`)."""


def solve_stages(
    table: StageCostTable,
    num_micro_batches: int,
    *,
    epsilon: float = 0.0,
    cross_stage_comm: bool = False,
    submeshes: Sequence[tuple[int, int]] | None = None,
    schedule: str = "1f1b",
    dp_solves: dict[str, dict[float, object]] | None = None,
) -> StagePlan:
    """The DP over the table (step 2) with ``schedule``'s latency
    (:func:`~alpa_ir.pipeline.schedule_choice.dp_latencies`) and the placement (step 3).

    A schedule of ``v`` chunks per mesh sums its one-chunk schedule's values
    divided by ``v`` (interleaved 1F1B: 1F1B's; ZB-V: ZB-H1's) and keeps the
    same values in the max, so its DP runs on the one-chunk schedule's arrays
    with the sum weighted ``1 / v`` (the same plan: halving is exact) and reads
    the solves that schedule's DP made, by ``t_max`` (``dp_solves``: per
    one-chunk schedule, kept by the caller across calls on this ``table``,
    ``submeshes`` and ``cross_stage_comm``; :func:`~alpa_ir.algorithms.stage_dp.stage_dp`)."""
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
    compute = np.stack([p.compute for p in picks], axis=-1)
    one_chunk = ONE_CHUNK.get(schedule, schedule)
    summed = dp_latencies(one_chunk, costs, compute, table.phase_shares())
    limit = np.stack([p.max_stages_after for p in picks], axis=-1)
    sizes = [a * b for a, b in chosen]
    try:
        result: StageDPResult = stage_dp(
            summed,
            sizes,
            devices,
            num_micro_batches,
            limit,
            epsilon=epsilon,
            bottleneck=pace if cross_stage_comm else (None if summed is costs else costs),
            sum_scale=1.0 / VIRTUAL_STAGES.get(schedule, 1),
            solves=None if dp_solves is None else dp_solves.setdefault(one_chunk, {}),
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


def evaluate_schedule(
    table: StageCostTable,
    num_micro_batches: int,
    schedule: str,
    *,
    epsilon: float = 0.0,
    cross_stage_comm: bool = False,
    remat: bool = False,
    submeshes: Sequence[tuple[int, int]] | None = None,
    solved: dict[str, StagePlan | PlanError] | None = None,
    dp_solves: dict[str, dict[float, object]] | None = None,
) -> ScheduleCandidate:
    """The DP's plan for ``schedule``, simulated under it. For the schedules with
    several chunks per mesh, the chunks are cut anew (:func:`virtual_plans`) on
    the DP's meshes and on every equal split of the cluster; the fastest that
    fits is the candidate. ``solved``: DP results to reuse, by the latency the
    DP ran with (GPipe's is 1F1B's); ``dp_solves``: :func:`solve_stages`'."""
    plans = schedule_plans(
        table,
        num_micro_batches,
        schedule,
        epsilon=epsilon,
        cross_stage_comm=cross_stage_comm,
        submeshes=submeshes,
        solved=solved,
        dp_solves=dp_solves,
    )
    if isinstance(plans, str):
        return ScheduleCandidate(schedule, None, note=plans)
    tried = [_simulated(table, p, num_micro_batches, schedule, remat) for p in plans]
    return _fastest_plan(tried)


def _fastest_plan(tried: Sequence[ScheduleCandidate]) -> ScheduleCandidate:
    """One schedule's candidate among its simulated plans: the fastest that fits
    (then the smallest peak), the first on a tie."""
    return min(tried, key=lambda c: (not c.fits, c.iteration_time, c.peak_memory))


def schedule_plans(
    table: StageCostTable,
    num_micro_batches: int,
    schedule: str,
    *,
    epsilon: float = 0.0,
    cross_stage_comm: bool = False,
    submeshes: Sequence[tuple[int, int]] | None = None,
    solved: dict[str, StagePlan | PlanError] | None = None,
    dp_solves: dict[str, dict[float, object]] | None = None,
) -> list[StagePlan] | str:
    """The plans :func:`evaluate_schedule` simulates for ``schedule`` (the DP's;
    for virtual stages :func:`virtual_plans`), or why there is none
    (``dp_solves``: :func:`solve_stages`')."""
    key = "1f1b" if schedule == "gpipe" else schedule
    solved = {} if solved is None else solved
    if key not in solved:
        try:
            solved[key] = solve_stages(
                table,
                num_micro_batches,
                epsilon=epsilon,
                cross_stage_comm=cross_stage_comm,
                submeshes=submeshes,
                schedule=key,
                dp_solves=dp_solves,
            )
        except PlanError as error:
            solved[key] = error
    found = solved[key]
    if schedule not in VIRTUAL_STAGES:
        return str(found) if isinstance(found, PlanError) else [found]
    # the chunks are cut on the DP's meshes, where it found any, and on equal splits
    plan = None if isinstance(found, PlanError) else found
    plans = virtual_plans(
        table, plan, num_micro_batches, schedule, VIRTUAL_STAGES[schedule], submeshes
    )
    if not plans:
        return str(found) if plan is None else "no mesh split has the layers and fits in memory"
    return plans


def busy_bound(plan: StagePlan, num_micro_batches: int) -> float:
    """A floor on ``plan``'s simulated step under any schedule: a mesh runs the
    forward, B and W of each of its stages for every micro-batch one after
    another (their phase times sum to the stage's latency, recomputation
    included), so no step is shorter than the busiest mesh's
    ``num_micro_batches`` times its stages' latencies."""
    loads: dict[int, float] = {}
    of = plan.mesh_of or tuple(range(len(plan.stages)))
    for stage, k in zip(plan.stages, of, strict=True):
        loads[k] = loads.get(k, 0.0) + stage.cost.latency
    return num_micro_batches * max(loads.values(), default=0.0)


def step_floor(
    table: StageCostTable, plan: StagePlan, num_micro_batches: int, remat: bool
) -> float:
    """A floor on ``plan``'s simulated step under any schedule, at least
    :func:`busy_bound`'s: a mesh starts nothing before the first micro-batch's
    forward has passed every chunk ahead of its first chunk (each forward
    waits for the one before it; transfers only add), then runs its
    ``num_micro_batches`` times its stages' latencies. The forward of a stage
    is its share of the latency as the simulator is given it
    (:func:`~alpa_ir.pipeline.schedule_choice.phase_times`)."""
    of = plan.mesh_of or tuple(range(len(plan.stages)))
    shares = table.phase_shares()
    loads: dict[int, float] = {}
    ahead: dict[int, float] = {}
    before = 0.0
    for stage, k in zip(plan.stages, of, strict=True):
        latency = stage.cost.latency
        ahead.setdefault(k, before)
        loads[k] = loads.get(k, 0.0) + latency
        before += phase_times(table, stage.first, stage.last, latency, remat, shares)[0]
    return max((ahead[k] + num_micro_batches * load for k, load in loads.items()), default=0.0)


PRUNE_MARGIN = 1e-6
"""A plan is left unsimulated only when its :func:`step_floor` exceeds the step
to beat by more than this share (rounding of the two sums cannot flip a choice;
:func:`choose_schedule`'s ties are within 1e-9)."""


def _simulated(
    table: StageCostTable, plan: StagePlan, num_micro_batches: int, schedule: str, remat: bool
) -> ScheduleCandidate:
    """``plan`` timed and sized by the simulator under ``schedule``. A
    list-scheduled order is built with the stages' phase times and with unit
    times (both greedy; neither always wins): the faster is the plan's."""
    floors = held_floors(plan)
    held = max(floors, default=0.0)
    if held > table.cluster.device_memory:  # the simulator's check would fail: skip its orders
        k = floors.index(held)
        return ScheduleCandidate(
            schedule,
            plan,
            peak_memory=held,
            note=f"simulate: mesh {k} is out of memory under {schedule}: it needs at least "
            f"{format_gib(held)} per device (its stages' persistent bytes, largest transient "
            f"and one micro-batch's largest activations), the device has "
            f"{format_gib(table.cluster.device_memory)}",
        )
    try:
        sim = stage_sim_plan(table, plan.stages, num_micro_batches, schedule, remat, plan.mesh_of)
        sims = [sim] if sim.phase_times is None else [sim, replace(sim, phase_times=None)]
        tried = [_simulated_order(replace(plan, phase_times=s.phase_times), s) for s in sims]
    except AlpaError as error:  # the schedule cannot run these sizes
        return ScheduleCandidate(schedule, None, note=str(error))
    return min(tried, key=lambda c: (not c.fits, c.iteration_time))


def held_floors(plan: StagePlan) -> list[float]:
    """Per mesh of ``plan``, a floor on the bytes per device the simulator finds
    at its peak under any schedule: its stages' persistent bytes, the largest
    transient and the largest one micro-batch's activations (each forward holds
    them until its backward)."""
    of = plan.mesh_of or tuple(range(len(plan.stages)))
    out = []
    for k in dict.fromkeys(of):
        mine = [s.cost for s, m in zip(plan.stages, of, strict=True) if m == k]
        out.append(
            sum(c.persistent for c in mine)
            + max(c.transient for c in mine)
            + max(c.activations for c in mine)
        )
    return out


def _simulated_order(plan: StagePlan, sim: SimPlan) -> ScheduleCandidate:
    order = sim.task_order()
    try:
        result = simulate(sim, order=order)
    except PlanError as error:
        peak = max(simulate(sim, check_memory=False, order=order).peak_memory)
        return ScheduleCandidate(
            sim.schedule, plan, peak_memory=peak, in_flight=sim.in_flight_caps, note=str(error)
        )
    peak = max(result.peak_memory)
    return ScheduleCandidate(sim.schedule, plan, result.iteration_time, peak, sim.in_flight_caps)


def _equal_splits(
    table: StageCostTable, submeshes: Sequence[tuple[int, int]] | None
) -> list[list[VirtualMesh]]:
    """The cluster as ``p ≥ 2`` equal submeshes, for each submesh shape that
    divides it, on each of its views no more than 10 % slower over all the
    layers than its fastest."""
    cluster = table.cluster
    out = []
    for submesh in submeshes or table.submeshes:
        size = submesh[0] * submesh[1]
        count = cluster.num_devices // size
        if count < 2 or count * size != cluster.num_devices:
            continue
        placed = _place(cluster, [(0, 0, submesh)] * count)
        views = table.views[submesh]
        whole = [
            sum(table.cost(k, k, tuple(v.shape)).latency for k in range(table.num_layers))
            for v in views
        ]
        for view, seconds in zip(views, whole, strict=True):
            if seconds <= 1.1 * min(whole):
                out.append(
                    [VirtualMesh(submesh, cluster.logical_mesh(view.shape, d)) for _, d in placed]
                )
    return out


KEEP_ESTIMATED = 1.1
"""Virtual plans the simulator times: those whose slowest mesh is estimated
within this factor of the best one's."""


def virtual_plans(
    table: StageCostTable,
    plan: StagePlan | None,
    num_micro_batches: int,
    schedule: str,
    chunks: int,
    submeshes: Sequence[tuple[int, int]] | None = None,
) -> list[StagePlan]:
    """Plans with ``chunks`` layer chunks per mesh in ``schedule``'s layout
    (:mod:`alpa_ir.pipeline.virtual_layout`), on the meshes of ``plan`` (the
    DP's, if any) and on each equal split of the cluster, those that fit
    and whose slowest mesh is estimated within :data:`KEEP_ESTIMATED` of the
    best (all if none fits); each plan's latency is Eq. 2 over its meshes
    (``Σ t / v + (B − 1)·max`` of the meshes' summed chunk times)."""
    configs = [] if plan is None else [[VirtualMesh(s.submesh, s.mesh) for s in plan.stages]]
    configs += _equal_splits(table, submeshes)
    configs = [m for m in configs if len(m) * chunks <= table.num_layers]
    # a split whose fullest mesh must hold more than a device has never fits:
    # its balance would overflow and its simulation fail (dropping it is exact)
    configs = [m for m in configs if memory_floor(table, m) <= table.cluster.device_memory]
    bounds = [load_bound(table, m) for m in configs]
    balanced = []
    fitting: list[float] = []
    prices: dict[tuple[int, ...], dict[str, list]] = {}  # each view's, read out once
    # the most promising first; one whose bound is beyond what is kept is not balanced
    for bound, meshes in sorted(zip(bounds, configs, strict=True), key=lambda x: x[0]):
        if fitting and bound > KEEP_ESTIMATED * min(fitting):
            continue
        layout = chunk_layout(schedule, len(meshes), chunks)
        found = balance_chunks(table, meshes, layout, schedule, num_micro_batches, prices)
        balanced.append((meshes, layout, found))
        if found.overflow == 0:
            fitting.append(found.slowest)
    out = []
    for meshes, layout, found in balanced:
        if fitting and (found.overflow > 0 or found.slowest > KEEP_ESTIMATED * min(fitting)):
            continue  # the simulator would not pick it
        stages = []
        for chunk in found.chunks:
            mesh = meshes[chunk.mesh]
            cost = table.cost(chunk.first, chunk.last, tuple(mesh.mesh.shape))
            if chunk.choice and cost.memory_saving is not None:
                cost = cost.memory_saving
            stages.append(
                StageChoice(chunk.first, chunk.last, mesh.submesh, mesh.mesh, cost, cost.latency)
            )
        loads = [0.0] * len(meshes)
        for stage, k in zip(stages, layout, strict=True):
            loads[k] += stage.latency
        latency = sum(loads) / chunks + (num_micro_batches - 1) * max(loads)
        out.append(StagePlan(tuple(stages), latency, mesh_of=layout))
    return out


def choose_schedule(
    table: StageCostTable,
    num_micro_batches: int,
    schedules: Sequence[str] = AUTO_SCHEDULES,
    *,
    bound: float | None = None,
    **options: object,
) -> tuple[ScheduleCandidate, ...]:
    """Every candidate, the chosen one first: the fastest that fits (ties go to
    the earlier in ``schedules``); raise :class:`PlanError` if none fits.

    ``bound`` (seconds; None: every plan simulated, as before): branch and
    bound. Every schedule's plans are built first (the DPs and the chunk
    cuts), then simulated in the order of their :func:`step_floor`, and a plan
    whose floor exceeds the fastest fitting step found so far, or ``bound``
    (a step the caller already has), is not simulated: it could not be chosen
    (its schedule's candidate is then the fastest of its simulated plans, or
    none, noted). The choice is the unbounded one whenever that one is at most
    ``bound`` (tests)."""
    if not schedules:
        raise AlpaError("construct-stages: no schedule to choose from")
    solved: dict[str, StagePlan | PlanError] = {}
    dp_solves: dict[str, dict[float, object]] = {}  # the DP's solves, shared by its schedules
    if bound is None:
        candidates = [
            evaluate_schedule(
                table,
                num_micro_batches,
                s,
                solved=solved,
                dp_solves=dp_solves,
                **options,  # type: ignore[arg-type]
            )
            for s in schedules
        ]
    else:
        candidates = _bounded_candidates(
            table, num_micro_batches, schedules, bound, solved, dp_solves, **options
        )
    # a candidate must beat an earlier one by more than rounding to take its place
    ranked = sorted(
        range(len(candidates)),
        key=lambda k: (not candidates[k].fits, candidates[k].iteration_time, k),
    )
    first = ranked[0]
    for k in ranked[1:]:
        near = candidates[k].iteration_time <= candidates[first].iteration_time * (1 + 1e-9)
        if candidates[k].fits and near and k < first:
            first = k
    ranked = [first, *(k for k in ranked if k != first)]
    out = tuple(candidates[k] for k in ranked)
    if not out[0].fits:
        raise PlanError(out[0].note or "construct-stages: no schedule's plan fits")
    return out


def _bounded_candidates(
    table: StageCostTable,
    num_micro_batches: int,
    schedules: Sequence[str],
    bound: float,
    solved: dict[str, StagePlan | PlanError],
    dp_solves: dict[str, dict[float, object]],
    *,
    epsilon: float = 0.0,
    cross_stage_comm: bool = False,
    remat: bool = False,
    submeshes: Sequence[tuple[int, int]] | None = None,
) -> list[ScheduleCandidate]:
    """Each schedule's candidate under :func:`choose_schedule`'s branch and bound:
    the schedules of one stage per mesh first (one DP plan each, cheap), then
    the virtual ones. Their mesh splits are all balanced: skipping a split
    whose floor is beyond the bound changed :func:`virtual_plans`' choice of
    which plans to keep (it keeps those within 10 % of the best split's
    estimate) and so the plan found (Llama 3 405B, 8,192 GPUs: 32 replicas
    under ZB-V, 17.79 s, instead of the unpruned 64, 18.27 s)."""
    built: list[list[StagePlan] | str] = ["" for _ in schedules]
    tried: list[list[tuple[int, ScheduleCandidate]]] = [[] for _ in schedules]
    best = bound
    for virtual in (False, True):
        mine = [k for k, s in enumerate(schedules) if (s in VIRTUAL_STAGES) == virtual]
        for k in mine:
            built[k] = schedule_plans(
                table,
                num_micro_batches,
                schedules[k],
                epsilon=epsilon,
                cross_stage_comm=cross_stage_comm,
                submeshes=submeshes,
                solved=solved,
                dp_solves=dp_solves,
            )
        queue = sorted(
            (step_floor(table, p, num_micro_batches, remat), k, j)
            for k in mine
            if not isinstance(built[k], str)
            for j, p in enumerate(built[k])  # type: ignore[arg-type]
        )
        for floor, k, j in queue:
            if floor > best * (1 + PRUNE_MARGIN):
                break  # the queue is in the order of the floors: none after it can win
            plans = built[k]
            assert not isinstance(plans, str)
            found = _simulated(table, plans[j], num_micro_batches, schedules[k], remat)
            tried[k].append((j, found))
            if found.fits:
                best = min(best, found.iteration_time)
    out = []
    for s, plans, mine in zip(schedules, built, tried, strict=True):
        if isinstance(plans, str):
            out.append(ScheduleCandidate(s, None, note=plans))
        elif mine:  # in the plans' order, as evaluate_schedule breaks ties
            out.append(_fastest_plan([c for _, c in sorted(mine, key=lambda x: x[0])]))
        else:
            floor = min(step_floor(table, p, num_micro_batches, remat) for p in plans)
            note = f"not simulated: at least {floor:.6g} s, beyond the {best:.6g} s to beat"
            out.append(ScheduleCandidate(s, None, note=note))
    return out


PLANNED_SCHEDULES = ("auto", *AUTO_SCHEDULES, "inference")
"""What ``construct-stages{schedule=}`` plans (``inference``: a forward-only
step, whose table prices forwards only: GPipe's latency, the same sum of the
stages plus ``B - 1`` times the slowest, is Alpa's pipeline latency)."""


CrossStageComm = bool | Literal["auto"]
"""Whether the stage DP counts the transfers between stages: no (Alpa's DP),
yes (option 6a), or ``auto``: both, the plan the simulator times faster."""


def plan_stages(
    table: StageCostTable,
    num_micro_batches: int,
    schedule: str = "1f1b",
    *,
    epsilon: float = 0.0,
    cross_stage_comm: CrossStageComm = False,
    remat: bool = False,
    bound: float | None = None,
) -> StagePlan:
    """The stages for ``schedule``, or with ``auto`` the schedule too: the fastest
    candidate that fits (:func:`choose_schedule`; ``bound``: its branch and
    bound). ``1f1b`` and ``gpipe`` are Alpa's DP as it is; the others are simulated to fit (zero-bubble caps come
    from memory; interleaved and V chunks from :func:`virtual_plans`). With
    ``cross_stage_comm="auto"``, the faster under the simulator of the plans
    without and with the transfers in the DP (Alpa's on a tie)."""
    if cross_stage_comm == "auto":
        return _faster_of_comm_options(table, num_micro_batches, schedule, epsilon, remat)
    if schedule not in PLANNED_SCHEDULES:
        raise AlpaError(
            f"construct-stages: schedule must be one of {', '.join(PLANNED_SCHEDULES)}, got "
            f"'{schedule}'"
        )
    options = {"epsilon": epsilon, "cross_stage_comm": cross_stage_comm, "remat": remat}
    if schedule in ("1f1b", "gpipe", "inference"):
        plan = solve_stages(
            table, num_micro_batches, epsilon=epsilon, cross_stage_comm=cross_stage_comm
        )
        return replace(plan, schedule=schedule)
    if schedule == "auto":
        candidates = choose_schedule(
            table, num_micro_batches, AUTO_SCHEDULES, bound=bound, **options
        )
    else:
        candidates = (evaluate_schedule(table, num_micro_batches, schedule, **options),)
        if not candidates[0].fits:
            raise PlanError(candidates[0].note or f"construct-stages: no {schedule} plan fits")
    best = candidates[0]
    assert isinstance(best.plan, StagePlan)
    return replace(
        best.plan,
        schedule=best.schedule,
        in_flight=best.in_flight,
        candidates=candidates if schedule == "auto" else (),
    )


def _faster_of_comm_options(
    table: StageCostTable, num_micro_batches: int, schedule: str, epsilon: float, remat: bool
) -> StagePlan:
    """:func:`plan_stages` without and with the transfers in the DP; the plan
    whose simulated step is shorter (one that fits before one that does not)."""
    found: list[tuple[tuple[bool, float], StagePlan]] = []
    errors: list[PlanError] = []
    for comm in (False, True):
        try:
            plan = plan_stages(
                table, num_micro_batches, schedule, epsilon=epsilon, cross_stage_comm=comm,
                remat=remat,
            )  # fmt: skip
        except PlanError as error:
            errors.append(error)
            continue
        # a schedule chosen with the stages comes timed (its candidates, the chosen first)
        timed = (
            plan.candidates[0]
            if plan.candidates
            else _simulated(table, plan, num_micro_batches, plan.schedule, remat)
        )
        found.append(((not timed.fits, timed.iteration_time), plan))
    if not found:
        raise errors[0]
    return min(found, key=lambda item: item[0])[1]


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
    schedule: str | None = None,
    remat: bool = False,
) -> None:
    """``mesh.logical_mesh @meshK`` per stage, then the outlined pipeline IR with
    the plan's schedule (or ``schedule``), its in-flight caps and, when the
    schedule was chosen, each candidate's simulated time
    (``construct_stages.schedules``)."""
    main = main_function(module)
    mesh_of = plan.mesh_of or tuple(range(len(plan.stages)))
    count = len(set(mesh_of))
    names = fresh_mesh_names(module, count)
    for k, name in enumerate(names):
        stage = plan.stages[mesh_of.index(k)]
        module.body.block.insert_op_before(stage.mesh.to_op(name), main)
    slices = [
        StageSlice(s.first, s.last, names[m]) for s, m in zip(plan.stages, mesh_of, strict=True)
    ]
    outline_stages(module, slices, num_micro_batches, schedule or plan.schedule, remat)
    for op in top_level_ops(module, PlanOp):
        op.attributes[LATENCY_ATTR] = FloatAttr(plan.latency, f64)
        if plan.in_flight is not None:
            op.properties["in_flight"] = DenseArrayBase.from_list(i64, list(plan.in_flight))
        if plan.phase_times is not None:
            flat = [t for times in plan.phase_times for t in times]
            op.properties["phase_times"] = DenseArrayBase.from_list(f64, flat)
        if plan.candidates:
            op.attributes[SCHEDULES_ATTR] = DictionaryAttr(
                {c.schedule: FloatAttr(c.iteration_time, f64) for c in plan.candidates if c.fits}
            )


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
    physical_space: str = "all",
    submeshes: Sequence[tuple[int, int]] = (),
    epsilon: float = 0.0,
    cost_mode: str = "range",
    cross_stage_comm: CrossStageComm = False,
    model: StageCostModel | None = None,
    progress: bool = True,
    timings: Timings | None = None,
    workers: int = 1,
    remat: bool = False,
    devices: Sequence[int] = (),
    started_workers: StartedWorkers | None = None,
) -> StagePlan:
    """The pass as a function: plan, write the plan into ``module``, return it
    (``remat``: the stages' backward functions recompute their forward values;
    ``devices``: the ids the cluster's devices stand for, default ``0..n-1``;
    ``started_workers``: costing workers started ahead, used first;
    ``physical_space``, ``submeshes``: the submeshes searched,
    :func:`~alpa_ir.costs.stage_table.physical_submeshes`)."""
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
        physical=physical_space,
        manual=submeshes,
        cost_mode=cost_mode,
        progress=progress,
        workers=workers,
        phase_flops=layer_phase_flops(ranges),
        started=started_workers,
    )
    t2 = time.perf_counter()
    plan = plan_stages(
        table,
        num_micro_batches,
        schedule,
        epsilon=epsilon,
        cross_stage_comm=cross_stage_comm,
        remat=remat,
    )
    t3 = time.perf_counter()
    if devices:
        plan = _on_devices(plan, tuple(devices))
    write_plan(module, plan, num_micro_batches, remat=remat)
    t4 = time.perf_counter()
    timings.costing += t2 - t1
    timings.dp += t3 - t2
    timings.other += (t1 - t0) + (t4 - t3)
    return plan


__all__ = [
    "LATENCY_ATTR",
    "PLANNED_SCHEDULES",
    "SCHEDULES_ATTR",
    "StageChoice",
    "StagePlan",
    "Timings",
    "busy_bound",
    "choose_schedule",
    "construct_stages",
    "evaluate_schedule",
    "module_cluster",
    "plan_stages",
    "schedule_plans",
    "solve_stages",
    "step_floor",
    "virtual_plans",
    "write_plan",
]
