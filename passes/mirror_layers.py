"""``merge-backward-runs`` and ``mirror-layers``: a step's layers as outlining needs them.

``merge-backward-runs`` makes one backward pass of several (a step that
differentiates more than once, e.g. its own unrolled gradient accumulation)
when no run's forward reads an earlier run's gradients
(:func:`alpa_ir.layer_mirroring.merge_runs`). ``mirror-layers`` gives the
backward pass the layer boundaries JAX did not mirror into it (a boundary
outside ``jax.grad``'s tracing, or one ``cluster-operators`` inserted only in
the forward pass; :func:`alpa_ir.layer_mirroring.mirror_layers`). Both leave
a step that needs nothing unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from alpa_ir.layer_mirroring import merge_runs, mirror_layers, needs_mirroring
from alpa_ir.module_utils import main_function


@dataclass(frozen=True)
class MergeBackwardRuns(ModulePass):
    """Reorder several differentiation runs of ``@main`` into one."""

    name = "merge-backward-runs"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx
        merge_runs(main_function(op))


@dataclass(frozen=True)
class MirrorLayers(ModulePass):
    """Mirror ``@main``'s forward layer boundaries into its backward pass."""

    name = "mirror-layers"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx
        main = main_function(op)
        if needs_mirroring(main):
            mirror_layers(main)
