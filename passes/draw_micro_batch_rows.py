"""``draw-micro-batch-rows``: micro-batches draw the one-device random numbers.

A step traced at the micro-batch shape would draw the same dropout rows in
every micro-batch. The pass gives ``@main`` a ``micro_batch_rows`` batch
argument and rewrites each per-example draw to take the micro-batch's rows of
the whole batch's draw (:mod:`alpa_ir.pipeline.micro_batch_random`). With one
micro-batch, or no such draw, the module is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.micro_batch_random import draw_micro_batch_rows


@dataclass(frozen=True)
class DrawMicroBatchRows(ModulePass):
    """Give ``@main`` the rows of its micro-batch for its random draws."""

    name = "draw-micro-batch-rows"

    num_micro_batches: int = 1
    """Micro-batches per step (the step is traced at the micro-batch shape)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx
        draw_micro_batch_rows(main_function(op), self.num_micro_batches)
