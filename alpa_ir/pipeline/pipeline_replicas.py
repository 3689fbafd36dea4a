"""The search that scales (issue #42): data-parallel replicas of one pipeline,
planned outside the stage DP.

Alpa's space grows with every node: ``(n, M)`` for every ``n`` and every
``(dp, mp)`` view of each, all priced for every layer; at 1,024 GPUs that is
1,746 views and the DP's device axis has 1,025 entries per row. Real
pre-training runs (Megatron-LM, Llama 3) are a pipeline of at most a few
hundred GPUs replicated data-parallel over the rest. This module searches
that space:

* ``r`` **replicas** of one pipeline of ``N / r`` nodes (``r`` divides the node
  count and the micro-batches: each replica runs ``B / r`` of the step's
  micro-batches, at the shape the step was traced at). One replica's stages
  come from the stage DP of :mod:`alpa_ir.pipeline.stage_construction`,
  unchanged, on the pipeline's nodes (:func:`pipeline_cluster`, the first
  ``N / r`` nodes of the cluster with their levels).
* After the last micro-batch, each device all-reduces its gradients with the
  devices at the same place in the other replicas
  (:func:`replica_sync_seconds`): priced on the network level the replicas'
  group crosses, by the cost model the stages are priced with (a mesh of the
  replicas by the stage's devices on the whole cluster, so a shared NIC or an
  oversubscribed tier counts). The all-reduces of distinct meshes run at once
  (the slowest counts); none overlaps the pipeline (an upper bound).
* **ZeRO across replicas** (``replica_zero``, ZeRO-1 or -2 over the ``r``
  replicas, as Megatron's distributed optimizer and Llama 3's FSDP run it):
  each device keeps ``1 / r`` of its stage's optimizer state (ZeRO-1) and
  gradients too (ZeRO-2) (:func:`replica_zero_table`: the stage DP sees the
  smaller persistent bytes, so narrower pipelines fit), and the all-reduce
  becomes a reduce-scatter of the gradients and an all-gather of the updated
  parameters (as many bytes as the gradients: ``gradient_factor`` 1),
  priced the same way. Each ``r > 1`` is planned once per ZeRO stage asked
  for; ``r = 1`` has nothing to partition.
* **One cost table** serves every ``r``: it is built once on the largest
  pipeline, over the submeshes whose node count is a power of two
  (``power-of-two`` space: ``(1, 2^k)`` and ``(2^k, M)``, each with every
  view), and each ``r``'s DP reads the part that fits its pipeline
  (:func:`sub_table`). Views that no plan can tell apart (an axis that divides
  no dimension) are priced once by the cost model's cache.

Exactness: with ``replicas=(1,)`` and the table of the whole cluster this is
the stage DP itself (same plan, same latency); for several ``r`` it is the
best of the DPs run one by one on tables built for each pipeline (tests).
:func:`search_kind` keeps the full search wherever its space is small enough
(:data:`FULL_SEARCH_VIEWS`), so plans there are today's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from alpa_ir.autosharding.cost_model import collective_bytes_on_wire
from alpa_ir.costs.costing_workers import StartedWorkers
from alpa_ir.costs.stage_cost import StageCostModel
from alpa_ir.costs.stage_table import LayerRanges, StageCostTable, ViewCost, cost_table
from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.pipeline.stage_construction import StagePlan, plan_stages

FULL_SEARCH_VIEWS = 256
"""The most logical mesh views (Alpa's ``all`` space) for which ``search=auto``
keeps the full search (64 GPUs of 8-GPU nodes: 62 views; 128: 146)."""
DEFAULT_MAX_PIPELINE_DEVICES = 512
"""The largest pipeline the scaled search prices (power-of-two submeshes up
to 64 nodes of 8: 55 views). The calibrated cost model simulates an
all-to-all over an axis of ``m`` devices pair by pair (``m²`` routes), so the
largest views set the costing time: one ``(512, 1)`` view costs about 14 s of
CPU, a ``(1024, 1)`` one 55 s."""
SEARCHES = ("full", "scaled", "auto")


def count_views(cluster: Cluster, space: str = "all", limit: int = 1 << 62) -> int:
    """Logical mesh views of ``space`` (``all`` or ``power-of-two``) on
    ``cluster``, counted up to just past ``limit`` (without building them)."""
    m, nodes = cluster.devices_per_node, cluster.num_nodes
    if m & (m - 1):
        cluster.submesh_shapes()  # raises: not a power of two per node
    views = sum(_divisor_count(1 << k) for k in range(m.bit_length()))
    for n in range(2, nodes + 1):
        if views > limit:
            break
        if space == "power-of-two" and n & (n - 1):
            continue
        views += _divisor_count(n * m)
    return views


def _divisor_count(n: int) -> int:
    count, k = 0, 1
    while k * k <= n:
        if n % k == 0:
            count += 1 if k * k == n else 2
        k += 1
    return count


def search_kind(cluster: Cluster, search: str = "auto") -> str:
    """``full`` or ``scaled``: ``auto`` is the full search where Alpa's space
    has at most :data:`FULL_SEARCH_VIEWS` views."""
    if search not in SEARCHES:
        raise AlpaError(
            f"construct-stages: search must be one of {', '.join(SEARCHES)}, got {search!r}"
        )
    if search != "auto":
        return search
    return (
        "full" if count_views(cluster, "all", FULL_SEARCH_VIEWS) <= FULL_SEARCH_VIEWS else "scaled"
    )


def pipeline_cluster(cluster: Cluster, nodes: int) -> Cluster:
    """The first ``nodes`` nodes of ``cluster`` as a cluster: its levels from the
    inside out, each as many units as the nodes fill (a level of one unit is
    dropped). Raise if the nodes are not a whole block of every level they
    span (e.g. 24 nodes of 16-node units)."""
    if not 1 <= nodes <= cluster.num_nodes:
        raise AlpaError(
            f"cluster '{cluster.name}': a pipeline of {nodes} nodes does not fit its "
            f"{cluster.num_nodes} nodes"
        )
    levels = []
    remaining = nodes
    for level in reversed(cluster.levels[:-1]):
        if remaining == 1:
            break
        units = min(level.cardinality, remaining)
        if remaining % units:
            raise AlpaError(
                f"cluster '{cluster.name}': {nodes} nodes are not a whole number of its "
                f"'{level.name}' units of {level.cardinality}"
            )
        levels.append(replace(level, cardinality=units))
        remaining //= units
    return replace(cluster, levels=(*reversed(levels), cluster.levels[-1]))


def replica_counts(
    num_nodes: int, num_micro_batches: int, max_pipeline_nodes: int
) -> tuple[int, ...]:
    """Replica counts ``r`` that divide the nodes and the micro-batches, with
    pipelines of at most ``max_pipeline_nodes`` nodes, fewest replicas first."""
    return tuple(
        r
        for r in range(1, num_nodes + 1)
        if num_nodes % r == 0
        and num_micro_batches % r == 0
        and num_nodes // r <= max_pipeline_nodes
    )


def sub_table(table: StageCostTable, cluster: Cluster) -> StageCostTable:
    """``table`` (built on a pipeline of at least ``cluster``'s nodes) read for a
    pipeline on ``cluster``: the submeshes that fit it, the same costs."""
    if cluster.devices_per_node != table.cluster.devices_per_node or (
        cluster.num_nodes > table.cluster.num_nodes
    ):
        raise AlpaError(
            f"construct-stages: a table of {table.cluster.num_nodes} nodes of "
            f"{table.cluster.devices_per_node} cannot plan {cluster.num_nodes} nodes of "
            f"{cluster.devices_per_node}"
        )
    fits = tuple(s for s in table.submeshes if s[0] * s[1] <= cluster.num_devices)
    return replace(table, cluster=cluster, submeshes=fits, views={s: table.views[s] for s in fits})


ZERO_STAGES = (0, 1, 2)
"""ZeRO across replicas: 0 none (gradients all-reduced, state whole on every
replica), 1 the optimizer state partitioned, 2 the gradients too."""


def _zero_view(cost: ViewCost, replicas: int, stage: int) -> ViewCost:
    """``cost`` with its optimizer state (and with ``stage`` 2 its gradients)
    partitioned over ``replicas``; ``gradients`` keeps what the reduction moves."""
    kept = cost.optimizer_state + (cost.gradients if stage >= 2 else 0.0)
    saving = cost.memory_saving
    return replace(
        cost,
        persistent=cost.persistent - kept * (1.0 - 1.0 / replicas),
        memory_saving=None if saving is None else _zero_view(saving, replicas, stage),
    )


def replica_zero_table(table: StageCostTable, replicas: int, stage: int) -> StageCostTable:
    """``table`` as the stage DP sees it under ZeRO-``stage`` across
    ``replicas`` replicas (module docstring): every cost's persistent bytes
    less the partitioned share; latencies, views and the rest unchanged.
    ``stage`` 0 or one replica: ``table`` itself."""
    if stage not in ZERO_STAGES:
        raise AlpaError(
            f"construct-stages: ZeRO across replicas must be one of {ZERO_STAGES}, got {stage!r}"
        )
    if stage == 0 or replicas == 1:
        return table
    zeroed: dict[int, ViewCost] = {}  # by identity: an expanded table's layers share costs

    def zero(cost: ViewCost) -> ViewCost:
        found = zeroed.get(id(cost))  # every cost is alive in ``table``: ids are unique
        if found is None:
            found = zeroed[id(cost)] = _zero_view(cost, replicas, stage)
        return found

    return replace(table, costs={key: zero(cost) for key, cost in table.costs.items()})


def replica_sync_seconds(
    cluster: Cluster, plan: StagePlan, replicas: int, pricer: object = None, zero: int = 0
) -> float:
    """Seconds of the gradient all-reduce across ``replicas`` replicas of
    ``plan`` (one replica's pipeline on devices ``0..P-1`` of ``cluster``,
    replica ``k`` on ``k·P ..``): per mesh, its devices' gradients over a mesh
    ``(replicas, mesh devices)`` of ``cluster``, axis 0; the slowest mesh.
    With ``zero`` (ZeRO-1 or -2 across the replicas): a reduce-scatter of the
    gradients and an all-gather of as many bytes of updated parameters instead.
    ``pricer``: a bound cost model with ``seconds(kind, mesh, bytes, axes)``;
    else ``α + β·bytes on the wire`` of axis 0."""
    if replicas == 1:
        return 0.0
    kinds = ("reduce_scatter", "all_gather") if zero else ("all_reduce",)
    mesh_of = plan.mesh_of or tuple(range(len(plan.stages)))
    gradients: dict[int, float] = {}
    devices: dict[int, tuple[int, ...]] = {}
    for stage, k in zip(plan.stages, mesh_of, strict=True):
        gradients[k] = gradients.get(k, 0.0) + stage.cost.gradients
        devices[k] = tuple(stage.mesh.devices or range(math.prod(stage.mesh.shape)))
    width = sum(len(ids) for ids in devices.values())
    if width * replicas != cluster.num_devices:
        raise AlpaError(
            f"construct-stages: {replicas} replicas of a pipeline of {width} devices are not "
            f"the {cluster.num_devices} devices of cluster '{cluster.name}'"
        )
    seconds = getattr(pricer, "seconds", None)
    slowest = 0.0
    for k, ids in devices.items():
        if gradients[k] <= 0:
            continue
        grid = [r * width + d for r in range(replicas) for d in ids]
        mesh = cluster.logical_mesh((replicas, len(ids)), grid)
        assert mesh.alpha is not None and mesh.beta is not None
        t = 0.0
        for kind in kinds:
            if seconds is not None:
                t += float(seconds(kind, mesh, gradients[k], (0,)))
            else:
                wire = collective_bytes_on_wire(kind.replace("_", "-"), gradients[k], replicas)
                t += mesh.alpha[0] + mesh.beta[0] * wire
        slowest = max(slowest, t)
    return slowest


@dataclass(frozen=True)
class ReplicaCandidate:
    """One replica count's best plan (``plan`` None: none fits, ``note`` why)."""

    replicas: int
    plan: StagePlan | None
    pipeline_seconds: float = math.inf
    """One replica's step: the plan's latency (simulated, where the schedule was chosen)."""
    sync_seconds: float = 0.0
    note: str = ""
    zero: int = 0
    """ZeRO stage across the replicas (:data:`ZERO_STAGES`)."""

    @property
    def iteration_time(self) -> float:
        return self.pipeline_seconds + self.sync_seconds


@dataclass(frozen=True)
class ReplicatedPlan:
    """The scaled search's plan: ``replicas`` copies of ``plan`` (on
    ``pipeline``, the first nodes of the cluster), each running
    ``num_micro_batches`` micro-batches, then the gradient all-reduce."""

    plan: StagePlan
    replicas: int
    num_micro_batches: int
    pipeline: Cluster
    pipeline_seconds: float
    sync_seconds: float
    candidates: tuple[ReplicaCandidate, ...] = ()
    """Every replica count tried (per ZeRO stage), fewest replicas first."""
    zero: int = 0
    """ZeRO stage across the replicas (:data:`ZERO_STAGES`): the stages' memory
    is :func:`replica_zero_table`'s."""

    def table(self, table: StageCostTable) -> StageCostTable:
        """The scaled search's ``table`` as this plan's stages were priced:
        ZeRO across the replicas applied, read for the pipeline (simulate with it)."""
        return sub_table(replica_zero_table(table, self.replicas, self.zero), self.pipeline)

    @property
    def iteration_time(self) -> float:
        return self.pipeline_seconds + self.sync_seconds


def plan_replicated(
    table: StageCostTable,
    cluster: Cluster,
    num_micro_batches: int,
    schedule: str = "1f1b",
    *,
    replicas: Sequence[int] | None = None,
    pricer: object = None,
    epsilon: float = 0.0,
    cross_stage_comm: bool = False,
    remat: bool = False,
    replica_zero: Sequence[int] = (0,),
    prune: bool = True,
) -> ReplicatedPlan:
    """The best of ``replicas`` (default: every count whose pipeline ``table``
    covers, :func:`replica_counts`) and of the ZeRO stages across replicas
    ``replica_zero`` (:data:`ZERO_STAGES`; one replica: 0 only) by one
    replica's step plus the gradients' synchronization; ``table`` is built on
    the largest pipeline's cluster. Ties: fewer replicas, then less ZeRO.

    ``prune`` (with ``schedule="auto"``): each replica count's schedule choice
    is bounded by the best step found so far (:func:`~alpa_ir.pipeline.
    stage_construction.choose_schedule`'s branch and bound): a plan whose
    busiest mesh alone exceeds it is not simulated. The plan found is the
    unpruned one (tests); a losing count's candidate may then be a slower
    plan of its own, or none (noted), where its best could not win."""
    for stage in replica_zero:
        replica_zero_table(table, 1, stage)  # checks the stage
    if replicas is None:
        replicas = replica_counts(cluster.num_nodes, num_micro_batches, table.cluster.num_nodes)
    if not replicas:
        raise PlanError(
            f"construct-stages: no replica count divides both the {cluster.num_nodes} nodes "
            f"and the {num_micro_batches} micro-batches with pipelines of at most "
            f"{table.cluster.num_nodes} nodes"
        )
    tried: list[ReplicaCandidate] = []
    # most replicas first: their pipelines run the fewest micro-batches, so their
    # schedules simulate fastest and bound the rest (any order finds the same plan)
    for r in sorted(replicas, reverse=True) if prune and schedule == "auto" else replicas:
        if r < 1 or cluster.num_nodes % r or num_micro_batches % r:
            raise AlpaError(
                f"construct-stages: {r} replicas do not divide the {cluster.num_nodes} nodes "
                f"and the {num_micro_batches} micro-batches"
            )
        stages = (0,) if r == 1 else tuple(dict.fromkeys(replica_zero))
        for zero in stages:
            try:
                pipeline = pipeline_cluster(cluster, cluster.num_nodes // r)
                zeroed = replica_zero_table(table, r, zero)
                sub = (
                    zeroed if r == 1 and pipeline == table.cluster else sub_table(zeroed, pipeline)
                )
                plan = plan_stages(
                    sub,
                    num_micro_batches // r,
                    schedule,
                    epsilon=epsilon,
                    cross_stage_comm=cross_stage_comm,
                    remat=remat,
                    # the best step so far: a schedule's plan that cannot beat it is not simulated
                    bound=(
                        min((c.iteration_time for c in tried if c.plan), default=math.inf)
                        if prune
                        else None
                    ),
                )
            except (AlpaError, PlanError) as error:
                tried.append(ReplicaCandidate(r, None, note=str(error), zero=zero))
                continue
            step = plan.candidates[0].iteration_time if plan.candidates else plan.latency
            sync = replica_sync_seconds(cluster, plan, r, pricer, zero)
            tried.append(ReplicaCandidate(r, plan, step, sync, zero=zero))
    tried.sort(key=lambda c: replicas.index(c.replicas))  # stable: ZeRO stages in order
    found = [c for c in tried if c.plan is not None]
    if not found:
        raise PlanError(
            "construct-stages: no replicated pipeline fits: "
            + "; ".join(
                f"{c.replicas} replicas{f' (ZeRO-{c.zero})' if c.zero else ''}: {c.note}"
                for c in tried
            )
        )
    best = min(found, key=lambda c: (c.iteration_time, c.replicas, c.zero))
    assert best.plan is not None
    return ReplicatedPlan(
        best.plan,
        best.replicas,
        num_micro_batches // best.replicas,
        pipeline_cluster(cluster, cluster.num_nodes // best.replicas),
        best.pipeline_seconds,
        best.sync_seconds,
        tuple(tried),
        best.zero,
    )


def planned_replica_counts(
    cluster: Cluster, num_micro_batches: int, max_devices: int = DEFAULT_MAX_PIPELINE_DEVICES
) -> tuple[int, ...]:
    """The replica counts the scaled search plans on ``cluster``: those of
    :func:`replica_counts` with pipelines of at most ``max_devices`` devices
    whose nodes are a block of the cluster's levels (:func:`pipeline_cluster`)."""
    most = max(1, max_devices // cluster.devices_per_node)
    counts = []
    for r in replica_counts(cluster.num_nodes, num_micro_batches, most):
        try:
            pipeline_cluster(cluster, cluster.num_nodes // r)
        except AlpaError:
            continue
        counts.append(r)
    if not counts:
        raise PlanError(
            f"construct-stages: no replica count divides both the {cluster.num_nodes} nodes "
            f"and the {num_micro_batches} micro-batches with pipelines of at most "
            f"{max_devices} devices that are whole blocks of cluster '{cluster.name}'"
        )
    return tuple(counts)


def scaled_cost_table(
    ranges: LayerRanges,
    cluster: Cluster,
    model: StageCostModel,
    counts: Sequence[int],
    *,
    cost_mode: str = "layer-sum",
    workers: int = 1,
    progress: bool = True,
    phase_flops: np.ndarray | None = None,
    started: StartedWorkers | None = None,
) -> StageCostTable:
    """The one cost table of the scaled search: ``power-of-two`` submeshes on
    the largest pipeline of ``counts`` (the fewest replicas)."""
    return cost_table(
        ranges,
        pipeline_cluster(cluster, cluster.num_nodes // min(counts)),
        model,
        space="power-of-two",
        cost_mode=cost_mode,
        workers=workers,
        progress=progress,
        phase_flops=phase_flops,
        started=started,
    )


__all__ = [
    "DEFAULT_MAX_PIPELINE_DEVICES",
    "FULL_SEARCH_VIEWS",
    "SEARCHES",
    "ZERO_STAGES",
    "ReplicaCandidate",
    "ReplicatedPlan",
    "count_views",
    "pipeline_cluster",
    "plan_replicated",
    "planned_replica_counts",
    "replica_counts",
    "replica_sync_seconds",
    "replica_zero_table",
    "scaled_cost_table",
    "search_kind",
    "sub_table",
]
