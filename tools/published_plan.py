"""A published manual plan (Alpa's artifact: stage layers, submeshes, logical
meshes, micro-batches) and its simulation from a stage cost table: shared by
:mod:`alpa_ir.tools.bench_alpa_plans` (Alpa's own plans) and
:mod:`alpa_ir.tools.bench_own_settings` (the baselines the artifact measured
with manual plans)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from alpa_ir.api.pipeshard import ManualStageOption
from alpa_ir.errors import AlpaError

if TYPE_CHECKING:
    from alpa_ir.costs.stage_table import StageCostTable
    from alpa_ir.tools.bench_outcome import Outcome


@dataclass(frozen=True)
class AlpaPlan:
    """One published plan: ``stage`` (layers and logical meshes), each stage's
    physical submesh, its ``force_batch_dim_to_mesh_dim`` (None: not set) and
    the micro-batches; ``layers``: the automatic layer count it was cut into."""

    layers: int
    micro_batches: int
    stage: ManualStageOption
    physical: tuple[tuple[int, int], ...]
    force_batch_dim: tuple[int | None, ...]
    source: str
    best_view: bool = False
    """Shard-parallel: one stage, the logical mesh Alpa chose not recorded (the
    fastest view is taken)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        ids = [i for stage in self.stage.forward_stage_layer_ids for i in stage]
        if ids != list(range(self.layers)):
            raise AlpaError(
                f"AlpaPlan: the stages' layers {ids} are not 0..{self.layers - 1} in order"
            )
        counts = {
            len(self.stage.forward_stage_layer_ids),
            len(self.stage.submesh_logical_shapes),
            len(self.physical),
            len(self.force_batch_dim),
        }
        if len(counts) != 1:
            raise AlpaError(
                "AlpaPlan: stages, logical meshes, submeshes and options differ in number"
            )
        for physical, logical in zip(self.physical, self.stage.submesh_logical_shapes, strict=True):
            if math.prod(physical) != math.prod(logical):
                raise AlpaError(
                    f"AlpaPlan: logical mesh {logical} does not have the devices of submesh {physical}"
                )

    @property
    def gpus(self) -> int:
        return sum(math.prod(p) for p in self.physical)

    def stage_ranges(self, traced_layers: int) -> list[tuple[int, int]]:
        """Each stage's (first, last) layer among ``traced_layers`` automatic
        layers: the plan's own where it has as many; else its boundaries scaled
        (stage boundary at layer ``a`` of N: ``round(a · traced / N)``), each
        artifact layer being an equal share of the model's blocks."""
        starts = [min(ids) for ids in self.stage.forward_stage_layer_ids]
        bounds = [round(a * traced_layers / self.layers) for a in starts] + [traced_layers]
        if any(b <= a for a, b in itertools.pairwise(bounds)):
            raise AlpaError(
                f"AlpaPlan: {len(starts)} stages do not fit {traced_layers} traced layers"
            )
        return [(a, b - 1) for a, b in itertools.pairwise(bounds)]


def published_outcome(
    plan: AlpaPlan,
    table: StageCostTable,
    model_flops: float,
    remat: bool,
) -> Outcome:
    """``plan``'s stages from the cost table, simulated (method ``published``)."""
    from alpa_ir.pipeline.stage_construction import StageChoice
    from alpa_ir.tools.bench_outcome import Outcome, outcome

    cluster = table.cluster
    try:
        ranges = plan.stage_ranges(table.num_layers)
    except AlpaError as error:
        return Outcome("published", error=str(error))
    stages, offset = [], 0
    for (first, last), physical, logical in zip(
        ranges, plan.physical, plan.stage.submesh_logical_shapes, strict=True
    ):
        if physical not in table.submeshes:
            return Outcome("published", error=f"submesh {physical} is not in the cluster's space")
        views = [v.shape for v in table.views[physical]]
        if plan.best_view:
            shapes = views
        elif tuple(logical) in [tuple(v) for v in views]:
            shapes = [tuple(logical)]
        else:
            return Outcome("published", error=f"no logical mesh {logical} on submesh {physical}")
        costs = [table.cost(first, last, s).fitting(cluster.device_memory) for s in shapes]
        k = min(range(len(costs)), key=lambda i: costs[i].latency)
        size = math.prod(physical)
        mesh = cluster.logical_mesh(tuple(shapes[k]), tuple(range(offset, offset + size)))
        offset += size
        stages.append(StageChoice(first, last, physical, mesh, costs[k], costs[k].latency))
    return outcome("published", table, stages, plan.micro_batches, model_flops, remat)
