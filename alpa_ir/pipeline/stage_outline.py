"""Outline a training step into per-stage forward, backward and apply-grad functions.

Input: an imported step whose ``@main`` carries layer markers
(``mark_pipeline_boundary``, or those ``cluster-operators`` inserted) and the
gradient marker (``alpa_ir.grad`` / ``value_and_grad``), and a slicing of its
layers into stages, each on a named logical mesh.

Layers come from the markers' positions. Differentiation mirrors every
forward marker into the backward computation (the marker's transpose), so a
step with ``L`` layers has ``2(L − 1)`` layer markers in program order:
segment ``s`` (the ops after ``s`` markers) is the forward of layer ``s`` for
``s < L − 1``, the last layer's forward *and* backward for ``s = L − 1`` (the
``backward`` marker between them), and the backward of layer ``2(L − 1) − s``
after that. The backward ops of a layer thus land on its forward's stage
(Alpa §5.1, constraint 1), in a backward function of their own: the last
stage too has a forward and a backward function, as in Alpa, so that every
stage's programs are forward, backward and apply-grad.

Ops after the gradient marker that depend on the gradients, or that depend on
neither the batch nor the gradients and are used only by such ops or the
return (the optimizer, ``apply``), run once per step in apply-grad functions:

- an apply op that depends on no forward/backward result, only on ``@main``
  arguments, constants and other such ops (Adam's step counter ``count + 1``,
  the bias corrections ``1 - b**count``, the decay ``b1 * mu`` of optimizer
  state), is *duplicated*: every apply-grad function that uses it, directly
  or through its own ops, computes its own copy, so no value crosses from one
  apply-grad function to another (``emit-instructions`` runs each stage's
  apply-grad on its own mesh once all gradients are there). A step result
  that is such a value (the new count) is returned by the lowest stage whose
  apply-grad function uses it (stage 0 when none does);
- any other apply op goes to the stage of the gradient or parameter it
  updates: that of its first operand computed by a forward/backward
  function, else of one computed by an earlier apply op.

Markers are identities and disappear; operand-free ops (constants, iota) are
copied into every function that uses them.

Output, written into the module (the pipeline IR contract):
``pipeline.plan``, one ``pipeline.stage`` per stage, functions
``stage<i>_forward`` / ``stage<i>_backward`` / ``stage<i>_apply_grad`` (each
with ``mesh.mesh``), and ``@main`` rewritten as the driver: only ``func.call``
ops in dependency order and the return. Forward and backward functions run
once per micro-batch; results of theirs that apply-grad functions use or
``@main`` returns are accumulated (mean over micro-batches).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    FlatSymbolRefAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    i64,
)
from xdsl.ir import Attribute, Block, Region, SSAValue

from alpa_ir.dialects.pipeline import SCHEDULES, PlanOp, StageOp
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.stage_assignment import (
    PHASES,
    Assignment,
    StageSlice,
    apply_round,
    batch_args,
    function_name,
    is_apply_phase,
    is_forward_only,
)
from alpa_ir.pipeline.stage_functions import build_function, collect_groups, order_groups


def outline_stages(
    module: ModuleOp,
    slices: Sequence[StageSlice],
    num_micro_batches: int = 1,
    schedule: str = "1f1b",
    remat: bool = False,
    schedules: Collection[str] = SCHEDULES,
) -> None:
    """Rewrite ``module``'s ``@main`` into the outlined pipeline form (see module
    doc). With ``remat`` (Alpa's ``remat_layer``) the backward function of every
    stage but the last recomputes its stage's forward values from the forward
    function's inputs instead of receiving them: a stage keeps only its inputs
    per micro-batch in flight, not its activations. ``schedules``: the schedule
    names known (the built-in ones, and a plugin's where the caller has them)."""
    if schedule not in schedules:
        raise AlpaError(
            f"unknown pipeline schedule '{schedule}'; expected one of {', '.join(schedules)}"
        )
    if num_micro_batches < 1:
        raise AlpaError(f"num_micro_batches must be at least 1, got {num_micro_batches}")
    main = main_function(module)
    if schedule == "inference" and not is_forward_only(main):
        raise AlpaError(
            "schedule 'inference' runs a forward-only step, but @main computes gradients; "
            "use a training schedule (1f1b, gpipe, ...)"
        )
    returned = list(main.body.block.last_op.operands)  # type: ignore[union-attr]
    assignment = Assignment(main, slices)
    groups = order_groups(collect_groups(assignment, returned, remat), len(slices))
    batch_values = {main.body.block.args[k] for k in batch_args(main)}
    functions = {
        g.key: build_function(g, assignment, slices[g.key[0]].mesh, batch_values) for g in groups
    }

    new_block = Block(arg_types=[a.type for a in main.body.block.args])
    values: dict[SSAValue, SSAValue] = dict(zip(main.body.block.args, new_block.args, strict=True))
    for g in groups:
        call = func.CallOp(
            function_name(*g.key), [values[v] for v in g.inputs], [v.type for v in g.outputs]
        )
        new_block.add_op(call)
        values.update(zip(g.outputs, call.results, strict=True))
    new_block.add_op(func.ReturnOp(*[values[assignment.resolve(v)] for v in returned]))
    new_main = func.FuncOp(
        "main",
        main.function_type,
        Region(new_block),
        arg_attrs=main.arg_attrs,
        res_attrs=main.res_attrs,
    )
    for name, attr in main.attributes.items():
        if name not in new_main.attributes:
            new_main.attributes[name] = attr

    top = module.body.block
    stage_ops = []
    for k, s in enumerate(slices):
        refs: dict[str, Attribute] = {
            phase: FlatSymbolRefAttr(function_name(k, phase))
            for phase in PHASES
            if (k, phase) in functions
        }
        rounds = sorted((apply_round(p), p) for (i, p) in functions if i == k and is_apply_phase(p))
        if len(rounds) > 1 or (rounds and rounds[0][0] > 0):
            if rounds[0][0] > 0:  # a stage whose apply-grad starts in a later round
                refs["apply_grad"] = FlatSymbolRefAttr(function_name(k, rounds[0][1]))
                rounds = rounds[1:]
            else:
                rounds = rounds[1:]
            if rounds:
                refs["apply_grad_rounds"] = ArrayAttr(
                    [FlatSymbolRefAttr(function_name(k, p)) for _, p in rounds]
                )
        stage_ops.append(
            StageOp.create(
                properties={
                    "sym_name": StringAttr(f"stage{k}"),
                    "layers": DenseArrayBase.from_list(i64, [s.first, s.last]),
                    "mesh": FlatSymbolRefAttr(s.mesh),
                    **refs,
                }
            )
        )
    plan = PlanOp.create(
        properties={
            "sym_name": StringAttr("plan"),
            "stages": ArrayAttr([FlatSymbolRefAttr(f"stage{k}") for k in range(len(slices))]),
            "num_micro_batches": IntegerAttr(num_micro_batches, i64),
            "schedule": StringAttr(schedule),
        }
    )
    top.insert_ops_before([plan, *stage_ops, *functions.values(), new_main], main)
    top.erase_op(main)
