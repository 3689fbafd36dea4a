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

from alpa_ir.pipeline.backward_split import split_backward


@dataclass(frozen=True)
class SplitBackward(ModulePass):
    """Split every stage's backward into B and W (``backward_weight``)."""

    name = "split-backward"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx
        split_backward(op)
