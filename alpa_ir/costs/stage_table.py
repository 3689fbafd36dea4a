"""The stage cost table of ``construct-stages`` (Alpa OSDI'22 §5.2, step 1).

For every layer range ``i..j`` the forward+backward ops of the range become one
function (:class:`LayerRanges`, which the step's outliner provides); the stage cost
model (:mod:`alpa_ir.costs.analytical_stage_cost`, cached by structural fingerprint, so
identical ranges such as GPT's repeated layers are planned once) prices it on
every logical mesh view ``(dp, mp)`` of every submesh of Alpa's space; the
best view per submesh (the fastest that fits in memory) gives ``costs[i, j, m]``
and Eq. 5's ``max_stages_after[i, j, m]`` (:meth:`StageCostTable.picks`).
``cost-mode=layer-sum`` prices single layers only and adds them up per view
(latency, parameters, activations): ``L`` functions instead of ``L(L+1)/2``,
exact up to the resharding between layers of one stage, which the per-layer
plans cannot see (each layer's boundary shardings are chosen independently).
It is what makes paper-size planning take seconds.

The table also holds each layer's FLOPs per phase (forward, backward-for-input
B, backward-for-weights W; :func:`alpa_ir.pipeline.layer_phases.layer_phase_flops`):
a range's phase shares split its latency for the schedules that run the phases
apart (:meth:`StageCostTable.phase_shares`).

Transfers between stages (``cross-stage-comm``): a stage receives per
micro-batch the activations of the stage before it and the gradients of the
stage after it, each ``α + β·bytes / links`` (:meth:`StageCostTable.transfer_times`),
priced on the link that joins nodes (the slowest link neighbouring stages may
cross; a one-node cluster: its device link); ``links`` is the number of
parallel links the submesh has on that level (one per node if the level is a
shared NIC, one per device otherwise).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
from xdsl.dialects import func

from alpa_ir.costs.costing_workers import CostJob, CostJobError, StartedWorkers, cost_in_workers
from alpa_ir.costs.stage_cost import (
    FORWARD_SHARE,
    ParallelStageCostModel,
    StageCost,
    StageCostModel,
    max_stages_after,
)
from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.collection import frozen_heap
from alpa_ir.ir.module_utils import num_ops
from alpa_ir.passmanager.progress import ProgressBar

SUBMESH_SPACES = (
    "all",
    "single-node-model-parallel",
    "one-dimensional",
    "power-of-two",
    "same-as-physical",
    "data-parallel-only",
    "model-parallel-only",
)
"""The logical mesh views of each submesh (Alpa's ``submesh_logical_shape_space``):
``all`` of them; ``single-node-model-parallel``: the one with the node's
devices on the model-parallel axis; ``one-dimensional``: ``(1, n)`` and
``(n, 1)``; ``same-as-physical``: the submesh's own shape; ``data-parallel-only``:
``(n, 1)``; ``model-parallel-only``: ``(1, n)``. ``power-of-two`` keeps all
views of the submeshes whose node count is a power of two, ``(1, 2^k)`` and
``(2^k, M)``: ``log N`` submeshes instead of ``N`` (the search that scales,
:mod:`alpa_ir.pipeline.pipeline_replicas`)."""
PHYSICAL_SPACES = ("all", "power-of-two", "small-power-of-two", "manual")
"""The submeshes (Alpa's ``submesh_physical_shape_space``): always ``(1, 2^k)``
within a node, then whole nodes ``(n, M)``: ``all`` n, ``power-of-two`` n,
``small-power-of-two`` n up to 4; ``manual``: the submeshes given."""
COST_MODES = ("range", "layer-sum")
WORKERS_FROM_OPS = 4000
"""Worker processes cost a table only when its distinct pairs on meshes of
several devices hold at least this many ops in all: a worker takes a second
or two to start (a fresh interpreter importing the compiler), which a tiny
model's whole costing does not."""


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
    gradients: float = 0.0
    """Bytes of gradients per device (part of ``persistent``): what an
    all-reduce across data-parallel replicas of the stage moves."""
    optimizer_state: float = 0.0
    """Bytes of optimizer state per device (part of ``persistent``): what ZeRO
    across data-parallel replicas of the stage partitions with the gradients."""

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
        m.gradients,
        m.optimizer_state,
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
        a.gradients + b.gradients,
        a.optimizer_state + b.optimizer_state,
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
    phase_flops: np.ndarray | None = None
    """``[layer, phase]`` FLOPs: forward, B, W
    (:func:`alpa_ir.pipeline.layer_phases.layer_phase_flops`); None: unknown."""

    def phase_shares(self) -> np.ndarray:
        """``[first, last, phase]``: each range's share of its compute per phase
        (forward, B, W); without FLOPs, the forward's usual third
        (:data:`~alpa_ir.costs.stage_cost.FORWARD_SHARE`) and the backward halved."""
        if self.phase_flops is not None:
            return range_phase_shares(self.phase_flops)
        rest = (1.0 - FORWARD_SHARE) / 2
        return np.broadcast_to(
            np.array([FORWARD_SHARE, rest, rest]), (self.num_layers, self.num_layers, 3)
        )

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
        ``cross_bytes``, ``backward_bytes``, ``gradients``): choice 0 is the plan, choice 1
        the memory-saving plan (the plan itself where there is none); ``inf``
        latency where a range was not costed."""
        num, shape = self.num_layers, tuple(view_shape)
        names = ("latency", "persistent", "activations", "transient", "cross_bytes")
        names += ("backward_bytes", "gradients")
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
            compute=take(stacked["latency"]),
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
    compute: np.ndarray
    """The part of ``latency`` the stage computes (without its transfers)."""
    pace: np.ndarray
    """The value in the ``(B − 1)·max`` term (``stage_dp``'s ``bottleneck``)."""
    max_stages_after: np.ndarray
    """Eq. 5."""
    peak: np.ndarray
    """Bytes per device with one micro-batch in flight."""
    option: np.ndarray
    """2 × view index + plan (0: the plan, 1: the memory-saving one)."""


def physical_submeshes(
    cluster: Cluster, physical: str = "all", manual: Sequence[tuple[int, int]] = ()
) -> tuple[tuple[int, int], ...]:
    """The submeshes of Alpa's physical space ``physical`` (:data:`PHYSICAL_SPACES`)."""
    if physical not in PHYSICAL_SPACES:
        raise AlpaError(
            f"construct-stages: unknown physical submesh space '{physical}'; expected "
            f"{PHYSICAL_SPACES}"
        )
    shapes = cluster.submesh_shapes()
    if physical == "manual":
        if not manual:
            raise AlpaError("construct-stages: the manual physical space needs its submeshes")
        for shape in manual:
            if tuple(shape) not in shapes:
                known = " ".join(f"{n}x{m}" for n, m in shapes)
                raise AlpaError(
                    f"construct-stages: submesh {shape[0]}x{shape[1]} is not a submesh of "
                    f"cluster '{cluster.name}' ({known})"
                )
        return tuple(tuple(s) for s in manual)  # type: ignore[misc]
    if manual:
        raise AlpaError(
            f"construct-stages: submeshes are given for the manual physical space, not '{physical}'"
        )
    if physical == "all":
        return shapes
    top = cluster.num_nodes if physical == "power-of-two" else min(cluster.num_nodes, 4)
    return tuple((n, m) for n, m in shapes if n == 1 or (n <= top and not n & (n - 1)))


def submesh_views(
    cluster: Cluster,
    space: str,
    physical: str = "all",
    manual: Sequence[tuple[int, int]] = (),
) -> dict[tuple[int, int], tuple[LogicalDeviceMesh, ...]]:
    """The submeshes of Alpa's physical space (``physical``, ``manual``:
    :func:`physical_submeshes`) and the logical mesh views of ``space``
    (:data:`SUBMESH_SPACES`) kept for each."""
    if space not in SUBMESH_SPACES:
        raise AlpaError(
            f"construct-stages: unknown submesh space '{space}'; expected {SUBMESH_SPACES}"
        )
    out: dict[tuple[int, int], tuple[LogicalDeviceMesh, ...]] = {}
    for submesh in physical_submeshes(cluster, physical, manual):
        if space == "power-of-two" and submesh[0] & (submesh[0] - 1):
            continue
        views = cluster.submesh_logical_meshes(submesh)
        size = submesh[0] * submesh[1]
        if space == "single-node-model-parallel":
            mp = min(size, cluster.devices_per_node)
            views = tuple(v for v in views if v.shape == (size // mp, mp))
        elif space == "one-dimensional":
            views = tuple(v for v in views if 1 in v.shape)
        elif space in ("same-as-physical", "data-parallel-only", "model-parallel-only"):
            shape = {
                "same-as-physical": submesh,
                "data-parallel-only": (size, 1),
                "model-parallel-only": (1, size),
            }[space]
            views = tuple(v for v in views if v.shape == shape)
        out[submesh] = views
    return out


class LayerRanges(Protocol):
    """What the table needs of a step's layers
    (:class:`alpa_ir.pipeline.layer_ranges.LayerRanges` is one)."""

    @property
    def num_layers(self) -> int: ...

    def function(self, first: int, last: int) -> func.FuncOp:
        """Layers ``first..last``' forward and backward ops as one function."""
        ...

    def internal_bytes_table(self, backward: bool = False) -> np.ndarray:
        """``[first, last]``: bytes the range's layers pass each other (those
        sent back, with ``backward``)."""
        ...


def range_phase_shares(flops: np.ndarray) -> np.ndarray:
    """``[first, last, phase]``: each layer range's share of its FLOPs per phase
    (``flops``: ``[layer, phase]``; equal thirds where a range has none)."""
    num = flops.shape[0]
    prefix = np.concatenate([np.zeros((1, 3)), flops.cumsum(axis=0)])
    ranged = prefix[None, 1:, :] - prefix[:num, None, :]  # [first, last, phase]
    total = ranged.sum(axis=-1, keepdims=True)
    shares = np.where(total > 0, ranged / np.where(total > 0, total, 1.0), 1.0 / 3.0)
    upper = np.triu(np.ones((num, num), dtype=bool))[..., None]
    return np.where(upper, shares, 0.0)


def cost_table(
    ranges: LayerRanges,
    cluster: Cluster,
    model: StageCostModel,
    *,
    space: str = "all",
    physical: str = "all",
    manual: Sequence[tuple[int, int]] = (),
    cost_mode: str = "range",
    progress: bool = True,
    workers: int = 1,
    workers_from_ops: int = WORKERS_FROM_OPS,
    phase_flops: np.ndarray | None = None,
    started: StartedWorkers | None = None,
    views: dict[tuple[int, int], tuple[LogicalDeviceMesh, ...]] | None = None,
) -> StageCostTable:
    """Price every layer range on every view (module docstring, step 1), in
    ``workers`` processes if the model allows it (:mod:`alpa_ir.costs.costing_workers`;
    ``started``: workers started ahead, taken first) and the work is worth
    starting them (``workers_from_ops``, :data:`WORKERS_FROM_OPS`);
    ``phase_flops``: the layers' FLOPs per phase, for the schedules
    (:func:`alpa_ir.pipeline.layer_phases.layer_phase_flops`); ``views``: only
    these submeshes and views (default: every view of ``space`` of the
    submeshes of ``physical`` and ``manual``, :func:`submesh_views`; a
    baseline that runs on one view prices only that one)."""
    if cost_mode not in COST_MODES:
        raise AlpaError(f"construct-stages: unknown cost mode '{cost_mode}'; expected {COST_MODES}")
    if workers < 1:
        raise AlpaError(f"construct-stages: workers must be >= 1, got {workers}")
    if views is None:
        views = submesh_views(cluster, space, physical, manual)
    num = ranges.num_layers
    table = StageCostTable(cluster, tuple(views), views, num)
    table.phase_flops = phase_flops
    all_views = [v for vs in views.values() for v in vs]
    spans = (
        [(i, i) for i in range(num)]
        if cost_mode == "layer-sum"
        else [(i, j) for i in range(num) for j in range(i, num)]
    )
    total = len(spans) * len(all_views)
    report = _Progress(progress, total)
    with report.bar, frozen_heap():  # the step and the layers outlive the costing
        if workers > 1 and isinstance(model, ParallelStageCostModel):
            _cost_in_workers(
                table, ranges, spans, all_views, model, workers, report, workers_from_ops, started
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
    started: StartedWorkers | None = None,
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
    work = sum(num_ops(functions[j.function]) for j in jobs.values() if j.mesh.size > 1)
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
            started,
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


__all__ = [
    "COST_MODES",
    "PHYSICAL_SPACES",
    "SUBMESH_SPACES",
    "WORKERS_FROM_OPS",
    "StageCostTable",
    "SubmeshPicks",
    "ViewCost",
    "cost_table",
    "physical_submeshes",
    "submesh_views",
]
