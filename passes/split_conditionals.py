"""``split-conditionals``: one ``lax.cond`` per independent group of results.

An optimizer step under a condition (``optax.MultiSteps``, skipping the
update unless all gradients are finite) is one ``cond`` over the whole
model's state; a pipeline updates each stage's state on its own mesh. The
pass splits every top-level ``cond`` of ``@main`` into conds that share the
predicate and compute disjoint groups of results (see
:mod:`alpa_ir.pipeline.cond_splitting`), so that outlining can place each group with
the parameters it updates. Semantics do not change.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.cond_splitting import split_conds


@dataclass(frozen=True)
class SplitConditionals(ModulePass):
    """Split each top-level ``lax.cond`` of ``@main`` by independent results."""

    name = "split-conditionals"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx
        split_conds(main_function(op).body.block)
