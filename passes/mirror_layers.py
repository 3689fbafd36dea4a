"""``mirror-layers``: the backward pass gets the step's layer boundaries.

Differentiation mirrors a ``mark_pipeline_boundary`` that carries values
(its transpose), but not one without arguments, nor one outside the
function JAX differentiates: the backward pass then has fewer boundaries
than the forward pass. The pass mirrors the missing ones
(:func:`alpa_ir.pipeline.layer_mirroring.mirror_layers`), so that layer ``k``'s
backward ops land with its forward ops when stages are outlined. A step
whose boundaries are all mirrored is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_mirroring import mirror_layers, needs_mirroring


@dataclass(frozen=True)
class MirrorLayers(ModulePass):
    """Mirror ``@main``'s forward layer boundaries into its backward pass."""

    name = "mirror-layers"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx
        main = main_function(op)
        if needs_mirroring(main):
            mirror_layers(main)
