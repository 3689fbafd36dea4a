"""``emit-instructions`` (Alpa §6): the static instruction list of each mesh.

Input: the outlined pipeline form (``pipeline.plan``, one ``pipeline.stage`` per
stage, its functions, ``@main`` as a list of ``func.call`` ops) and the
``pipeline.transfer`` ops of ``cross-mesh-resharding``. Output: one
``pipeline.program {mesh = @meshK}`` per stage's mesh, appended to the module
(programs from an earlier run are replaced; the plan's ``schedule`` is set to
the one used). The schedule is the plan's, or the pass's ``schedule`` option:
any of :mod:`alpa_ir.pipeline.schedule_kinds` or a plugin's. The library
(what each list holds, and why the lists cannot deadlock) is
:mod:`alpa_ir.pipeline.program_emission`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.passes import ModulePass

from alpa_ir.dialects.pipeline import ProgramOp
from alpa_ir.ir.module_utils import top_level_ops
from alpa_ir.pipeline.outlined_pipeline import one_plan
from alpa_ir.pipeline.program_emission import emit_programs, program_op
from alpa_ir.plugins.registry import registry_of


@dataclass(frozen=True)
class EmitInstructions(ModulePass):
    """Write one ``pipeline.program`` per mesh from the plan's schedule."""

    name = "emit-instructions"

    schedule: str | None = field(
        default=None,
        metadata={
            "help": "pipeline schedule (gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v or a "
            "plugin's); none: the plan's"
        },
    )

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        schedules = registry_of(ctx).schedules
        programs = emit_programs(op, self.schedule, schedules=schedules)
        for old in list(top_level_ops(op, ProgramOp)):
            old.detach()
            old.erase()
        plan = one_plan(op)
        if self.schedule is not None:
            plan.properties["schedule"] = StringAttr(self.schedule)
        op.body.block.add_ops(program_op(mesh, ins) for mesh, ins in programs.items())
