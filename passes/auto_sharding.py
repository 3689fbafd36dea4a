"""``auto-sharding`` (Alpa §4): choose the communication-minimal intra-operator
plan of ``@main`` on its logical mesh with an ILP, and write it into the IR.

The planner is :mod:`alpa_ir.autosharding.planner` (its options,
:class:`~alpa_ir.autosharding.planner.ShardingOptions`, are this pass's). With
``prefer-reduce-scatter`` the pass then runs ``reduce-scatter-rewrite{mode=zero2}``
through a nested pass manager.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from alpa_ir.autosharding.planner import ShardingOptions, ShardingPlanner
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.pipeline.step_partition import gradient_ops, partition_step
from alpa_ir.plugins.registry import registry_of


@dataclass(frozen=True)
class AutoSharding(ShardingOptions, ModulePass):
    """Choose the intra-operator plan of @main with Alpa's ILP."""

    name = "auto-sharding"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        options = ShardingOptions(
            **{f.name: getattr(self, f.name) for f in fields(ShardingOptions)}
        )
        ShardingPlanner(options, scaled_ops=_per_micro_batch_ops).plan(ctx, op)
        if self.prefer_reduce_scatter:
            rewrite = "builtin.module(reduce-scatter-rewrite{mode=zero2})"
            PassManager(registry_of(ctx), rewrite).run(op, ctx)


def _per_micro_batch_ops(function: func.FuncOp, batch: Sequence[int]) -> set[Operation]:
    """The step's compute ops that run per micro-batch: its forward and backward,
    less the gradients' producers, whose reduction over the mesh runs once per
    step (``deferred_reductions``)."""
    part = partition_step(function, list(batch))
    return set(part.compute) - gradient_ops(part)
