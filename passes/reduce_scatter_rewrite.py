"""``reduce-scatter-rewrite`` (Alpa §4.2, ZeRO): after ``auto-sharding``, turn
the all-reduce of a gradient into a reduce-scatter wherever that shards the
weight update (the optimizer state it alone reads is kept sharded: ZeRO-2;
``mode=zero3`` keeps the parameters sharded too). The library is
:mod:`alpa_ir.autosharding.reduce_scatter`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from alpa_ir.autosharding.reduce_scatter import rewrite_all_reduces


@dataclass(frozen=True)
class ReduceScatterRewrite(ModulePass):
    """All-reduce of gradients -> reduce-scatter, sharded update, all-gather (ZeRO)."""

    name = "reduce-scatter-rewrite"

    mode: Literal["zero2", "zero3"] = "zero2"
    """``zero2``: the update and the optimizer state it alone reads are sharded;
    ``zero3``: the parameters stay sharded too, all-gathered where read."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx
        rewrite_all_reduces(op, self.mode)
