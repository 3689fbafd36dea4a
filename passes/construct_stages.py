"""``construct-stages``: Alpa's stage construction (OSDI'22 §5.2, AutoStageOption).

Input: a module whose ``@main`` is a marked training step with ``L`` layers
(:func:`alpa_ir.pipeline.stage_outline.count_layers`), traced at the micro-batch shape.

1. **Costing.** For every layer range ``i..j`` the forward+backward ops of the
   range become one function (:class:`alpa_ir.pipeline.stage_outline.LayerRanges`); the
   stage cost model (:mod:`alpa_ir.costs.stage_cost`, cached by structural
   fingerprint, so identical ranges such as GPT's repeated layers are planned
   once) prices it on every logical mesh view ``(dp, mp)`` of every submesh of
   Alpa's space; the best view per submesh (the fastest that fits in memory)
   gives ``costs[i, j, m]`` and Eq. 5's ``max_stages_after[i, j, m]``.
   ``cost-mode=layer-sum`` prices single layers only and adds them up per view
   (latency, parameters, activations): ``L`` functions instead of ``L(L+1)/2``,
   exact up to the resharding between layers of one stage, which the
   per-layer plans cannot see (each layer's boundary shardings are chosen
   independently). It is what makes paper-size planning take seconds.
2. **DP.** :func:`alpa_ir.algorithms.stage_dp` (Eq. 2–5, exact; ``epsilon`` as
   there, in seconds).
3. **Placement.** Submeshes are laid out on the device ids largest first (so
   every ``(1, 2^k)`` block and every whole-node block stays aligned), stages
   of one size in pipeline order (neighbouring stages on neighbouring
   devices). Each stage gets a ``mesh.logical_mesh @meshK`` of its chosen view
   with α/β re-derived on its real devices, then :func:`outline_stages`
   writes the pipeline IR.

Beyond Alpa: ``cross-stage-comm`` puts the transfers between stages into the
DP's objective. A stage receives per micro-batch the activations of the stage
before it and the gradients of the stage after it, each ``α + β·bytes /
links`` (:meth:`StageCostTable.transfer_times`), priced on the link that joins
nodes (the slowest link neighbouring stages may cross; a one-node cluster:
its device link); ``links`` is the number of parallel links the submesh has
on that level (one per node if the level is a shared NIC, one per device
otherwise). Each link is treated as a pipeline stage of its own: one
micro-batch's trip through the pipeline crosses every link once each way, so
the transfers add to the stage's latency in Eq. 2's sum, and a link carries
one micro-batch at a time, so in the ``(B − 1)·max`` term a stage counts as
the slowest of its compute and its two incoming links (``stage_dp``'s
``bottleneck``): a transfer shorter than the compute is hidden behind it, a
slower link paces the pipeline. The ``simulate`` backend models links the
same way. The number of micro-batches cannot be searched inside a pass (the
step is traced at one micro-batch shape); ``alpa-bench --micro-batches auto``
does it by re-tracing per candidate (:func:`alpa_ir.tools.alpa_bench.auto_micro_batches`).

Progress (stage-mesh pairs costed) goes to stderr; ``pipeline.plan`` gets the
DP's latency (``construct_stages.latency``, seconds per iteration by Eq. 2).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import FloatAttr, ModuleOp, f64
from xdsl.passes import ModulePass

from alpa_ir.algorithms.stage_dp import StageDPResult, stage_dp
from alpa_ir.costs.costing_workers import CostJob, CostJobError, cost_in_workers
from alpa_ir.costs.stage_cost import (
    AnalyticalStageCostModel,
    ParallelStageCostModel,
    StageCost,
    StageCostModel,
    StageCostOptions,
    max_stages_after,
)
from alpa_ir.dialects.mesh import ClusterOp
from alpa_ir.dialects.pipeline import PlanOp
from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.hardware.memory_budget import format_gib
from alpa_ir.ir.module_utils import main_function, top_level_ops
from alpa_ir.passmanager.progress import ProgressBar
from alpa_ir.pipeline.stage_outline import LayerRanges, StageSlice, fresh_mesh_names, outline_stages

SUBMESH_SPACES = ("all", "single-node-model-parallel", "one-dimensional")
COST_MODES = ("range", "layer-sum")
WORKERS_FROM_OPS = 4000
"""Worker processes cost a table only when its distinct pairs on meshes of
several devices hold at least this many ops in all: a worker takes a second
or two to start (a fresh interpreter importing the compiler), which a tiny
model's whole costing does not."""
LATENCY_ATTR = "construct_stages.latency"


@dataclass(frozen=True)
class ViewCost:
    """A layer range on one logical mesh view: seconds per micro-batch and bytes per device."""

    latency: float
    persistent: float
    activations: float
    cross_bytes: float
    transient: float = 0.0
    """Held once, not per micro-batch (remat: the largest layer's recomputed stash)."""
    backward_bytes: float = 0.0
    """The part of ``cross_bytes`` the next stage sends back (gradients)."""
    memory_saving: ViewCost | None = None
    """A second plan of the same range on the same view that keeps no parameter
    replicated (``StageCost.memory_saving``); :meth:`StageCostTable.picks`
    considers both."""

    def choices(self) -> tuple[ViewCost, ...]:
        return (self,) if self.memory_saving is None else (self, self.memory_saving)

    def fitting(self, device_memory: float) -> ViewCost:
        """The fastest of :meth:`choices` that fits with one micro-batch in
        flight, else the fastest."""
        return min(self.choices(), key=lambda c: (c.peak(1) > device_memory, c.latency))

    def max_stages_after(self, device_memory: float) -> float:
        return float(
            max_stages_after(device_memory, self.persistent + self.transient, self.activations)
        )

    def peak(self, in_flight: int) -> float:
        return self.persistent + self.transient + in_flight * self.activations


def _view_cost(cost: StageCost, cross_bytes: float, backward_bytes: float = 0.0) -> ViewCost:
    m = cost.memory
    saving = cost.memory_saving
    return ViewCost(
        cost.latency,
        m.persistent,
        m.activations,
        cross_bytes,
        m.transient,
        backward_bytes,
        None if saving is None else _view_cost(saving, cross_bytes, backward_bytes),
    )


def _add(a: ViewCost, b: ViewCost) -> ViewCost:
    """Two ranges in one stage; the memory-saving plan of the sum uses each
    part's memory-saving plan where it has one."""
    saving = None
    if a.memory_saving is not None or b.memory_saving is not None:
        saving = _add(a.memory_saving or a, b.memory_saving or b)
    return ViewCost(
        a.latency + b.latency,
        a.persistent + b.persistent,
        a.activations + b.activations,
        a.cross_bytes + b.cross_bytes,
        max(a.transient, b.transient),
        a.backward_bytes + b.backward_bytes,
        saving,
    )


def _without_bytes(cost: ViewCost, inner: float, inner_backward: float) -> ViewCost:
    """``cost`` with ``inner`` bytes less crossing into the stage, of which
    ``inner_backward`` sent back."""
    saving = (
        None
        if cost.memory_saving is None
        else _without_bytes(cost.memory_saving, inner, inner_backward)
    )
    return replace(
        cost,
        cross_bytes=cost.cross_bytes - inner,
        backward_bytes=cost.backward_bytes - inner_backward,
        memory_saving=saving,
    )


@dataclass
class Timings:
    """Seconds spent per part (the paper's Table 5 columns, minus clustering)."""

    costing: float = 0.0
    dp: float = 0.0
    other: float = 0.0


@dataclass
class StageCostTable:
    """Costs of every layer range on every view of every submesh of a cluster."""

    cluster: Cluster
    submeshes: tuple[tuple[int, int], ...]
    views: dict[tuple[int, int], tuple[LogicalDeviceMesh, ...]]
    num_layers: int
    costs: dict[tuple[int, int, tuple[int, ...]], ViewCost] = field(default_factory=dict)
    pairs_costed: int = 0
    internal: tuple[np.ndarray, np.ndarray] | None = None
    """``layer-sum`` mode: only single layers are in ``costs``; a range is their
    sum less the bytes its layers pass each other (all, and those sent back),
    ``[first, last]`` arrays (:meth:`LayerRanges.internal_bytes_table`)."""

    def cost(self, first: int, last: int, view_shape: tuple[int, ...]) -> ViewCost:
        key = (first, last, tuple(view_shape))
        cost = self.costs.get(key)
        if cost is None and self.internal is not None and first < last:
            cost = self.cost(first, first, view_shape)
            for layer in range(first + 1, last + 1):
                cost = _add(cost, self.cost(layer, layer, view_shape))
            inner, back = (float(a[first, last]) for a in self.internal)
            cost = self.costs[key] = _without_bytes(cost, inner, back)
        if cost is None:
            raise KeyError(key)
        return cost

    def arrays(self, view_shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        """Every range's costs on one view as ``[choice, first, last]`` arrays
        (``latency``, ``persistent``, ``activations``, ``transient``,
        ``cross_bytes``, ``backward_bytes``): choice 0 is the plan, choice 1
        the memory-saving plan (the plan itself where there is none); ``inf``
        latency where a range was not costed."""
        num, shape = self.num_layers, tuple(view_shape)
        names = ("latency", "persistent", "activations", "transient", "cross_bytes")
        names += ("backward_bytes",)
        if self.internal is None:
            out = {n: np.zeros((2, num, num)) for n in names}
            out["latency"][:] = np.inf
            for (i, j, viewed), cost in self.costs.items():
                if viewed == shape:
                    for c, choice in enumerate((cost, cost.memory_saving or cost)):
                        for n in names:
                            out[n][c, i, j] = getattr(choice, n)
            return out
        layers = [self.cost(k, k, shape) for k in range(num)]
        per_layer = {
            n: np.array(
                [
                    [getattr(c, n) for c in layers],
                    [getattr(c.memory_saving or c, n) for c in layers],
                ]
            )
            for n in names
        }  # [choice, layer]
        upper = np.triu(np.ones((num, num), dtype=bool))
        out = {}
        for n in names:
            if n == "transient":  # held once: the largest layer's
                ranged = np.zeros((2, num, num))
                for i in range(num):
                    ranged[:, i, i:] = np.maximum.accumulate(per_layer[n][:, i:], axis=1)
            else:
                prefix = np.concatenate([np.zeros((2, 1)), per_layer[n].cumsum(axis=1)], axis=1)
                ranged = prefix[:, None, 1:] - prefix[:, :-1, None]
            out[n] = np.where(upper, ranged, np.inf if n == "latency" else 0.0)
        inner, back = self.internal
        out["cross_bytes"] = out["cross_bytes"] - inner
        out["backward_bytes"] = out["backward_bytes"] - back
        return out

    def transfer_times(self, cost: ViewCost, submesh: tuple[int, int]) -> tuple[float, float]:
        """Seconds for the stage on ``submesh`` to receive one micro-batch's
        activations from the stage before it and its gradients from the stage
        after it (module docstring: ``α + β·bytes / links`` each)."""
        forward = self.transfer_seconds(np.array(cost.cross_bytes - cost.backward_bytes), submesh)
        backward = self.transfer_seconds(np.array(cost.backward_bytes), submesh)
        return float(forward), float(backward)

    def transfer_seconds(self, nbytes: np.ndarray, submesh: tuple[int, int]) -> np.ndarray:
        """``α + β·bytes / links`` of each entry of ``nbytes`` (0 where nothing
        crosses) into a stage on ``submesh``: on the link that joins nodes, with
        as many parallel links as the submesh has there."""
        c = self.cluster
        if c.num_nodes > 1:
            link = c.logical_mesh((2,), (0, c.devices_per_node))
            shared = c.levels[0].shared
            links = max(1, submesh[0]) if shared else submesh[0] * submesh[1]
        elif c.num_devices > 1:
            link = c.logical_mesh((2,), (0, 1))
            links = submesh[0] * submesh[1]
        else:
            return np.zeros_like(nbytes, dtype=np.float64)
        assert link.alpha is not None and link.beta is not None
        seconds = link.alpha[0] + link.beta[0] * nbytes / links
        return np.where(nbytes >= 1, seconds, 0.0)  # less than a byte: rounding of sums

    def picks(self, submesh: tuple[int, int], cross_stage_comm: bool = False) -> SubmeshPicks:
        """Every layer range's best option on ``submesh``: of its views and
        plans, the fastest that fits with one micro-batch in flight, else the
        fastest (with ``cross_stage_comm``, latencies include the transfers
        into the stage, module docstring)."""
        options = [self.arrays(view.shape) for view in self.views[submesh]]
        # option 2v + c: view v, plan c (0: the plan, 1: the memory-saving one)
        stacked = {n: np.concatenate([o[n] for o in options]) for n in options[0]}
        total = stacked["latency"]
        forward = backward = np.zeros_like(total)
        if cross_stage_comm:
            forward = self.transfer_seconds(
                stacked["cross_bytes"] - stacked["backward_bytes"], submesh
            )
            backward = self.transfer_seconds(stacked["backward_bytes"], submesh)
            total = total + forward + backward
        held = stacked["persistent"] + stacked["transient"]
        activations = stacked["activations"]
        fits = held + activations <= self.cluster.device_memory
        index = np.where(
            fits.any(axis=0),
            np.where(fits, total, np.inf).argmin(axis=0),
            total.argmin(axis=0),
        )

        def take(values: np.ndarray) -> np.ndarray:
            return np.take_along_axis(values, index[None], axis=0)[0]

        held, activations = take(held), take(activations)
        return SubmeshPicks(
            latency=take(total),
            pace=take(np.maximum(np.maximum(stacked["latency"], forward), backward)),
            max_stages_after=max_stages_after(self.cluster.device_memory, held, activations),
            peak=held + activations,
            option=index,
        )

    def picked(
        self, submesh: tuple[int, int], picks: SubmeshPicks, first: int, last: int
    ) -> tuple[LogicalDeviceMesh, ViewCost]:
        """The view and plan :meth:`picks` chose for layers ``first..last``."""
        view_index, plan = divmod(int(picks.option[first, last]), 2)
        view = self.views[submesh][view_index]
        cost = self.cost(first, last, view.shape)
        if plan and cost.memory_saving is not None:
            cost = cost.memory_saving
        return view, cost


@dataclass(frozen=True)
class SubmeshPicks:
    """:meth:`StageCostTable.picks`: per layer range (``[first, last]`` arrays)
    on one submesh, the chosen option and what the DP needs of it."""

    latency: np.ndarray
    """Eq. 2's stage latency (``inf`` where no range)."""
    pace: np.ndarray
    """The value in the ``(B − 1)·max`` term (``stage_dp``'s ``bottleneck``)."""
    max_stages_after: np.ndarray
    """Eq. 5."""
    peak: np.ndarray
    """Bytes per device with one micro-batch in flight."""
    option: np.ndarray
    """2 × view index + plan (0: the plan, 1: the memory-saving one)."""


def submesh_views(
    cluster: Cluster, space: str
) -> dict[tuple[int, int], tuple[LogicalDeviceMesh, ...]]:
    """The submeshes of Alpa's space and the logical mesh views kept for each."""
    if space not in SUBMESH_SPACES:
        raise AlpaError(
            f"construct-stages: unknown submesh space '{space}'; expected {SUBMESH_SPACES}"
        )
    out: dict[tuple[int, int], tuple[LogicalDeviceMesh, ...]] = {}
    for submesh in cluster.submesh_shapes():
        views = cluster.submesh_logical_meshes(submesh)
        size = submesh[0] * submesh[1]
        if space == "single-node-model-parallel":
            mp = min(size, cluster.devices_per_node)
            views = tuple(v for v in views if v.shape == (size // mp, mp))
        elif space == "one-dimensional":
            views = tuple(v for v in views if 1 in v.shape)
        out[submesh] = views
    return out


def cost_table(
    ranges: LayerRanges,
    cluster: Cluster,
    model: StageCostModel,
    *,
    space: str = "all",
    cost_mode: str = "range",
    progress: bool = True,
    workers: int = 1,
    workers_from_ops: int = WORKERS_FROM_OPS,
) -> StageCostTable:
    """Price every layer range on every view (module docstring, step 1), in
    ``workers`` processes if the model allows it (:mod:`alpa_ir.costs.costing_workers`)
    and the work is worth starting them (``workers_from_ops``, :data:`WORKERS_FROM_OPS`)."""
    if cost_mode not in COST_MODES:
        raise AlpaError(f"construct-stages: unknown cost mode '{cost_mode}'; expected {COST_MODES}")
    if workers < 1:
        raise AlpaError(f"construct-stages: workers must be >= 1, got {workers}")
    views = submesh_views(cluster, space)
    num = ranges.num_layers
    table = StageCostTable(cluster, tuple(views), views, num)
    all_views = [v for vs in views.values() for v in vs]
    spans = (
        [(i, i) for i in range(num)]
        if cost_mode == "layer-sum"
        else [(i, j) for i in range(num) for j in range(i, num)]
    )
    total = len(spans) * len(all_views)
    report = _Progress(progress, total)
    with report.bar:
        if workers > 1 and isinstance(model, ParallelStageCostModel):
            _cost_in_workers(
                table, ranges, spans, all_views, model, workers, report, workers_from_ops
            )
        else:
            for first, last in spans:
                extracted = ranges.function(first, last)
                for view in all_views:
                    try:
                        cost = model.stage_cost(
                            extracted.function, view, cluster, extracted.param_args
                        )
                    except AlpaError as error:
                        raise _pair_error(error, first, last, view.shape) from error
                    table.costs[(first, last, view.shape)] = _view_cost(
                        cost, extracted.cross_bytes, extracted.backward_bytes
                    )
                    table.pairs_costed += 1
                    report("costing stage-mesh pairs", done=table.pairs_costed)
    if cost_mode == "layer-sum":
        # ranges are summed from their layers when asked for; the layers inside
        # one stage do not cross stages
        table.internal = (
            ranges.internal_bytes_table(),
            ranges.internal_bytes_table(backward=True),
        )
    return table


class _Progress:
    """The costing's progress bar (``alpa_ir.passmanager.progress``: on a terminal only)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.bar = ProgressBar("costing stage-mesh pairs", total, enabled=enabled)

    def __call__(self, message: str, *, done: int, total: int | None = None) -> None:
        self.bar.update(done, f"construct-stages: {message}", total)


def _cost_in_workers(
    table: StageCostTable,
    ranges: LayerRanges,
    spans: Sequence[tuple[int, int]],
    views: Sequence[LogicalDeviceMesh],
    model: ParallelStageCostModel,
    workers: int,
    report: _Progress,
    workers_from_ops: int = 0,
) -> None:
    """The pairs of ``spans`` x ``views``, each distinct one (by the model's
    cache key) costed once in a worker, one task per view; in this process
    when the distinct pairs on meshes of several devices hold fewer than
    ``workers_from_ops`` ops."""
    cluster = table.cluster
    functions: list[func.FuncOp] = []  # the functions the workers need
    crossing: dict[tuple[int, int], tuple[float, float]] = {}
    # per pair: its key and the model's adjustment from the key's cost to its own
    pairs: dict[tuple[int, int, tuple[int, ...]], tuple[Hashable, Hashable]] = {}
    jobs: dict[Hashable, CostJob] = {}
    for first, last in spans:
        stage = ranges.function(first, last)
        crossing[(first, last)] = (stage.cross_bytes, stage.backward_bytes)
        for view in views:
            key = model.cache_key(stage.function, view, cluster, stage.param_args)
            pairs[(first, last, view.shape)] = (key, model.adjustment(stage.function, view))
            if key not in jobs:
                if not functions or functions[-1] is not stage.function:
                    functions.append(stage.function)
                jobs[key] = CostJob(len(functions) - 1, view, stage.param_args)
    work = sum(_num_ops(functions[j.function]) for j in jobs.values() if j.mesh.size > 1)
    if work < workers_from_ops:
        workers = 1  # the same jobs, in this process (cost_in_workers with one worker)
    by_view: dict[tuple[int, ...], list[tuple[Hashable, CostJob]]] = {}
    for key, job in jobs.items():
        by_view.setdefault(job.mesh.shape, []).append((key, job))
    order = sorted(
        by_view.values(),
        key=lambda t: (-sum(n > 1 for n in t[0][1].mesh.shape), -t[0][1].mesh.size),
    )
    report(
        f"costing {len(jobs)} distinct of {len(pairs)} stage-mesh pairs in {workers} workers",
        done=0,
        total=len(jobs),
    )
    try:
        costs = cost_in_workers(
            functions,
            [[job for _, job in task] for task in order],
            cluster,
            model,
            workers,
            lambda n: report(f"costing distinct stage-mesh pairs in {workers} workers", done=n),
        )
    except CostJobError as error:
        if error.job is None:
            raise
        first, last, shape = next(
            (i, j, v) for (i, j, v), (key, _) in pairs.items() if jobs[key] is error.job
        )
        raise _pair_error(error, first, last, shape) from error
    by_key: dict[Hashable, StageCost] = {}
    for task, task_costs in zip(order, costs, strict=True):
        for (key, _), cost in zip(task, task_costs, strict=True):
            by_key[key] = cost
            model.remember(key, cost)
    for (first, last, shape), (key, adjustment) in pairs.items():
        cost = model.adjust(by_key[key], adjustment)
        table.costs[(first, last, shape)] = _view_cost(cost, *crossing[(first, last)])
        table.pairs_costed += 1
    model_stats = getattr(model, "stats", None)
    if model_stats is not None:
        model_stats.hits += len(pairs) - len(jobs)


def _pair_error(error: AlpaError, first: int, last: int, shape: Sequence[int]) -> AlpaError:
    """``error`` of the stage cost model, naming the layer range and the mesh."""
    layers = f"layer {first}" if first == last else f"layers {first}-{last}"
    kind = PlanError if isinstance(error, PlanError) else AlpaError
    return kind(f"construct-stages: costing {layers} on the logical mesh {list(shape)}: {error}")


def _num_ops(function: func.FuncOp) -> int:
    return sum(1 for _ in function.body.block.ops)


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


@dataclass(frozen=True)
class ConstructStages(ModulePass):
    """Slice the layers into stages on submeshes (module docstring)."""

    name = "construct-stages"

    cluster: str = ""
    """Cluster preset; empty: the module's ``mesh.cluster``."""
    num_micro_batches: int = 1
    """Micro-batches per step (B of the pipeline latency (B - 1) max t + sum t)."""
    schedule: str = "1f1b"
    """Pipeline schedule recorded in the plan (it sets the memory each stage holds)."""
    submesh_space: Literal["all", "single-node-model-parallel", "one-dimensional"] = "all"
    """Logical meshes costed per submesh: ``all`` 2-d shapes, only the one with the
    node's devices on the model-parallel axis, or only (1, n)."""
    epsilon: float = 0.0
    """Alpa's ε: skip stage-mesh pairs whose cost exceeds (1 + ε) times the best
    pair's for the same layers; 0 keeps all."""
    cost_mode: Literal["range", "layer-sum"] = "range"
    """Cost a stage as its whole layer range planned at once, or as the sum of its
    layers' costs (faster, less exact)."""
    cross_stage_comm: bool = False
    """Add the transfers between consecutive stages to the DP's objective."""
    progress: bool = True
    """Report the costing of stage-mesh pairs on stderr."""
    stage_cost_model: str = "analytical"
    """A registered stage cost model (``analytical``, ``profile``: measured on
    the local devices, for the ``local-cpu`` cluster)."""
    workers: int = 1
    """Processes that cost the stage-mesh pairs (``alpa_ir.costs.costing_workers``;
    a model that measures on the local devices always costs in this one)."""
    remat: bool = False
    """Each stage's backward recomputes its forward values (Alpa's
    ``remat_layer``); the stage cost model prices the recomputation."""
    zero: bool = False
    """Cost stages with ZeRO-2: gradients and optimizer state partitioned where
    parameters are replicated."""
    fusion: bool = False
    """Model XLA's fusion in the stages' activation memory and memory traffic."""
    repeated_layers: Literal["auto", "share", "separate"] = "auto"
    """The stage-mesh pairs' auto-sharding of repeated blocks (``auto-sharding``'s
    option): ``share`` prices each block's copies planned alike, a smaller ILP
    (GPT-2 small's automatic layers of four blocks: 1.7x faster costing, latencies
    within 4 %); the stages chosen are then planned exactly by ``shard-stages``."""
    memory_fallback: bool = False
    """Also cost each stage with every parameter sharded where the first plan
    holds much of the device memory, and keep the fastest plan that fits."""
    optimizer_state_factor: float = 2.0
    """Optimizer state per parameter byte (Adam: 2, SGD: 0)."""
    cost_model: str = "auto"
    """The communication cost model of the stages' inner auto-sharding and their
    communication time (``auto``: ``calibrated`` on GPU clusters, Alpa's
    ``alpha-beta`` elsewhere)."""
    solver: str = "cbc"
    """The registered ILP solver of the stages' inner auto-sharding."""
    time_limit: float = 60.0
    """Seconds per inner auto-sharding solve."""
    num_devices: int = 0
    """With ``cluster``: as many of the preset's nodes as hold this many devices
    (``alpa-bench --gpus``); 0: the preset's default size."""
    devices: tuple[int, ...] = ()
    """The device ids the cluster's devices stand for, in order (the planned
    meshes take these); empty: ``0..n-1``."""

    def cost_options(self) -> StageCostOptions:
        """The stage cost model's options these fields stand for."""
        return StageCostOptions(
            optimizer_state_factor=self.optimizer_state_factor,
            solver=self.solver,
            time_limit=self.time_limit,
            remat=self.remat,
            zero=self.zero,
            fusion=self.fusion,
            memory_fallback=self.memory_fallback,
            repeated_layers=self.repeated_layers,
            cost_model=self.cost_model,
        )

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from alpa_ir.plugins.registry import registry_of

        registry = registry_of(ctx)  # the caller's: presets from --load-plugin are seen
        model = registry.get("stage_cost_models", self.stage_cost_model)(self.cost_options())
        construct_stages(
            op,
            module_cluster(op, self.cluster, registry.cluster_presets, self.num_devices),
            num_micro_batches=self.num_micro_batches,
            schedule=self.schedule,
            submesh_space=self.submesh_space,
            epsilon=self.epsilon,
            cost_mode=self.cost_mode,
            cross_stage_comm=self.cross_stage_comm,
            model=model,
            progress=self.progress,
            workers=self.workers,
            remat=self.remat,
            devices=self.devices,
        )


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
    "ConstructStages",
    "StageChoice",
    "StageCostTable",
    "StagePlan",
    "Timings",
    "ViewCost",
    "construct_stages",
    "cost_table",
    "solve_stages",
    "submesh_views",
    "write_plan",
]
