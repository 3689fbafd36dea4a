"""``synthesize-reductions`` (P² §3): run each all-reduce as the best synthesized program.

For every ``sharding.all_reduce`` (a sum) over mesh axes of @main, the pass synthesizes the
reduction programs of those axes on the mesh's system and placement (see
:mod:`alpa_ir.p2.ir_system`; ``synthesize-placement`` writes both), lowers them to device
groups, and lets the simulator pick the fastest for the operand's bytes per device. The op
becomes a ``sharding.all_reduce_program`` with the chosen steps (collectives over explicit
device groups), the program in P²'s DSL and ``p2.predicted_time``; the xla backend runs the
steps as collectives over those replica groups.

Left alone: max / min all-reduces (a reduce-scatter has no max form on XLA), reductions over
axes of size 1 (nothing to do), and reduce-scatters (P² synthesizes all-reduce programs; a
reduce-scatter's final state is another one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, FloatAttr, ModuleOp, StringAttr, f64
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from alpa_ir.dialects.attrs import TIME_ATTR
from alpa_ir.dialects.lax_attrs import ints_attr
from alpa_ir.dialects.sharding import AllReduceOp, AllReduceProgramOp, StepAttr
from alpa_ir.ir.module_utils import main_function
from alpa_ir.p2.choice import ChoiceOptions, ReductionPricer
from alpa_ir.p2.ir_collectives import check_axes, local_bytes
from alpa_ir.p2.ir_system import logical_mesh, mesh_matrix, mesh_system
from alpa_ir.p2.lowering import LoweredProgram, check_lowered


def program_op(ar: AllReduceOp, lowered: LoweredProgram, num_devices: int) -> AllReduceProgramOp:
    """The ``sharding.all_reduce_program`` running ``lowered`` in place of ``ar``."""
    props = {
        "axes": ar.axes,
        "program": StringAttr(" ; ".join(lowered.instructions)),
        "steps": ArrayAttr([StepAttr.make(name, groups) for name, groups in lowered.to_steps()]),
    }
    orders = lowered.device_chunk_order()
    if orders is not None:
        props["chunk_order"] = ArrayAttr([ints_attr(orders[d]) for d in range(num_devices)])
    return AllReduceProgramOp.create(
        operands=[ar.input],
        result_types=[ar.output.type],
        properties=props,
        attributes=dict(ar.attributes),
    )


@dataclass(frozen=True)
class SynthesizeReductions(ModulePass):
    """Rewrite every sum all-reduce into the fastest synthesized P² program."""

    name = "synthesize-reductions"

    system: str = field(
        default="",
        metadata={
            "help": "preset (gcp-a100-16x4, custom-2x4, ..); empty: mesh's p2.system or cluster"
        },
    )
    max_size: int = field(default=5, metadata={"help": "largest synthesized program size"})
    algorithm: Literal["ring", "tree"] = field(
        default="ring", metadata={"help": "NCCL algorithm the simulator assumes for AllReduce"}
    )

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        options = ChoiceOptions(self.max_size, self.algorithm)
        options.check(self.name)
        function = main_function(op)
        mesh = logical_mesh(op, function, self.name)
        system = mesh_system(op, mesh, self.system, self.name)
        matrix = mesh_matrix(mesh, system, self.name)
        shape = mesh.mesh_shape
        pricer = ReductionPricer(system, options.algorithm, options.max_size)
        for ar in [o for o in function.body.walk() if isinstance(o, AllReduceOp)]:
            check_axes(ar, shape, self.name)
            if ar.reduction != "sum" or all(shape[a] == 1 for a in ar.mesh_axes):
                continue
            nbytes = local_bytes(ar, function, shape)
            lowered, time = pricer.best(matrix, ar.mesh_axes, nbytes)
            check_lowered(lowered, system.num_devices)
            new = program_op(ar, lowered, system.num_devices)
            new.attributes[TIME_ATTR] = FloatAttr(time, f64)
            Rewriter.replace_op(ar, new)
