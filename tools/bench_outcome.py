"""One plan's outcome under the simulator (``alpa-bench``'s rows): its
iteration time, PFLOPS and stages, from the stage cost table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from alpa_ir.errors import PlanError

if TYPE_CHECKING:  # imported where used: a bad option is rejected before jax loads
    from alpa_ir.costs.stage_table import StageCostTable
    from alpa_ir.pipeline.stage_construction import StageChoice


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
