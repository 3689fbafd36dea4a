"""``merge-backward-runs``: one backward pass of several.

A step that differentiates more than once (a user's own gradient
accumulation, unrolled) has a ``backward`` and a ``grad`` marker per run.
When no run's forward reads an earlier run's gradients, the pass reorders
the ops into one run: every run's forward ops, one ``backward`` marker,
every run's backward ops, the ``grad`` markers, then what combines the
gradients (:func:`alpa_ir.pipeline.layer_mirroring.merge_runs`). Otherwise, and for a
step with one run, the module is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_mirroring import merge_runs


@dataclass(frozen=True)
class MergeBackwardRuns(ModulePass):
    """Reorder several differentiation runs of ``@main`` into one."""

    name = "merge-backward-runs"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx
        merge_runs(main_function(op))
