"""Why this plan: for each stage the stage DP chose, its logical mesh and
latency beside the runner-up for the same layers: the fastest logical mesh
of another shape (a transposed mesh is the same choice), on as many devices
if there is one, else on any submesh (faster there, the DP still preferred
to give those devices to other stages)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alpa_ir.costs.stage_table import StageCostTable
    from alpa_ir.pipeline.stage_construction import StagePlan


@dataclass(frozen=True)
class MeshOption:
    submesh: tuple[int, int]
    view: tuple[int, ...]
    latency: float
    """Seconds per micro-batch (the faster of the plan and its memory-saving plan)."""


@dataclass(frozen=True)
class StageReason:
    stage: int
    first: int
    last: int
    chosen: MeshOption
    runner_up: MeshOption | None

    def text(self) -> str:
        c = self.chosen
        line = (
            f"stage {self.stage}, layers {self.first}-{self.last}: submesh "
            f"{c.submesh[0]}x{c.submesh[1]} as logical mesh {list(c.view)}, "
            f"{c.latency * 1e3:.4g} ms per micro-batch"
        )
        r = self.runner_up
        if r is None:
            return line + "; no other logical mesh was costed for these layers"
        gap = (r.latency / c.latency - 1) * 100 if c.latency > 0 else math.inf
        return line + (
            f"; runner-up: {math.prod(r.submesh)} devices {r.submesh[0]}x{r.submesh[1]} as "
            f"{list(r.view)}, "
            f"{r.latency * 1e3:.4g} ms ({gap:+.1f} %)"
        )


def stage_reasons(table: StageCostTable, plan: StagePlan) -> list[StageReason]:
    reasons = []
    for k, stage in enumerate(plan.stages):
        devices = stage.submesh[0] * stage.submesh[1]
        options: dict[tuple[int, ...], MeshOption] = {}
        for submesh in table.submeshes:
            for view in table.views[submesh]:
                try:
                    cost = table.cost(stage.first, stage.last, view.shape)
                except KeyError:
                    continue
                latency = min(c.latency for c in cost.choices())
                if math.isfinite(latency):
                    options.setdefault(
                        tuple(view.shape), MeshOption(submesh, tuple(view.shape), latency)
                    )
        chosen_view = tuple(stage.mesh.shape)
        chosen = options.get(chosen_view) or MeshOption(stage.submesh, chosen_view, stage.latency)
        others = [o for v, o in options.items() if sorted(v) != sorted(chosen_view)]
        same = [o for o in others if math.prod(o.submesh) == devices]
        pool = same or others
        runner_up = min(pool, key=lambda o: o.latency) if pool else None
        reasons.append(StageReason(k, stage.first, stage.last, chosen, runner_up))
    return reasons


def hint_cost_lines(function: object) -> list[str]:
    """What the user's sharding hints cost the plan (``auto-sharding`` solves once
    without them): one line, none for a function without hints."""
    from xdsl.dialects import func
    from xdsl.dialects.builtin import FloatAttr

    from alpa_ir.autosharding.hints import HINT_COST_ATTR, hint_of

    assert isinstance(function, func.FuncOp)
    cost = function.attributes.get(HINT_COST_ATTR)
    objective = function.attributes.get("sharding.objective")
    if not isinstance(cost, FloatAttr) or not isinstance(objective, FloatAttr):
        return []
    count = sum(1 for op in function.body.block.ops if hint_of(op) is not None)
    with_hints = float(objective.value.data)
    added = float(cost.value.data)
    return [
        f"the user's {count} sharding hints add {added:,.6g} to the objective: "
        f"{with_hints:,.6g} with them, {with_hints - added:,.6g} without them"
    ]


def schedule_lines(module: object) -> list[str]:
    """The plan's pipeline schedule and, when ``construct-stages`` chose it, each
    other candidate's simulated time beside it (fastest first)."""
    from xdsl.dialects.builtin import DictionaryAttr, FloatAttr

    from alpa_ir.dialects.pipeline import PlanOp
    from alpa_ir.ir.module_utils import top_level_ops
    from alpa_ir.pipeline.stage_construction import SCHEDULES_ATTR

    plans = [op for op in top_level_ops(module, PlanOp) if isinstance(op, PlanOp)]  # type: ignore[arg-type]
    if not plans:
        return []
    plan = plans[0]
    chosen = plan.schedule.data
    times = plan.attributes.get(SCHEDULES_ATTR)
    if not isinstance(times, DictionaryAttr):
        return [f"pipeline schedule {chosen}"]
    seconds = {k: float(v.value.data) for k, v in times.data.items() if isinstance(v, FloatAttr)}
    best = seconds.get(chosen)
    head = f"pipeline schedule {chosen}" + (
        f": {best:.4g} s per iteration (simulated)" if best else ""
    )
    others = sorted((t, k) for k, t in seconds.items() if k != chosen)
    if not others or not best:
        return [head]
    rest = ", ".join(f"{k} {t:.4g} s ({(t / best - 1) * 100:+.1f} %)" for t, k in others)
    return [head, f"  runner-up: {rest}"]
