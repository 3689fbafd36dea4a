"""``split-backward``: each stage's backward as two functions, B and W.

B computes what another stage or a later task of the micro-batch needs (the
gradient the previous stage reads); W (``stageK_backward_weight``) computes the
gradients only apply-grad reads, from the stage's arguments and values B
passes on. Zero-bubble schedules (``zb-h1``, ``zb-v``) run W late to fill the
pipeline's bubbles; the other schedules run W right after B, so the split
changes no result. Runs after ``shard-stages`` (the ops keep their shardings)
and before ``cross-mesh-resharding``. The library is
:mod:`alpa_ir.pipeline.backward_split`.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from alpa_ir.dialects.pipeline import PlanOp
from alpa_ir.ir.module_utils import top_level_ops
from alpa_ir.pipeline.backward_split import split_backward
from alpa_ir.pipeline.schedule_kinds import SPLIT_SCHEDULES


@dataclass(frozen=True)
class SplitBackward(ModulePass):
    """Split every stage's backward into B and W (``backward_weight``)."""

    name = "split-backward"

    zero_bubble_only: bool = False
    """Split only when the plan's schedule runs B and W apart (``zb-h1``,
    ``zb-v``): for a pipeline whose schedule is chosen by ``construct-stages``."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx
        if self.zero_bubble_only:
            plans = [p for p in top_level_ops(op, PlanOp) if isinstance(p, PlanOp)]
            if not any(p.schedule.data in SPLIT_SCHEDULES for p in plans):
                return
        split_backward(op)
