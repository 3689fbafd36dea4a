"""The import every method's planning starts with (``plan_step`` for one mesh,
``plan_pipeshard`` for a pipeline): the arguments checked and traced, the step
imported; and the compiled signature of the planned step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import jax
import numpy as np

from alpa_ir.frontend.arguments import (
    CompiledSignature,
    StaticArgnums,
    StepArguments,
    compiled_signature,
    trace_arguments,
)
from alpa_ir.frontend.jaxpr_import import ImportedStep, import_step


def import_for_plan(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    num_micro_batches: int,
    *,
    static_argnums: StaticArgnums,
    batch_argnums: Sequence[int],
    donate_argnums: Sequence[int] = (),
    unroll_differentiated_loops: bool = False,
    concatenated_outputs: bool = False,
) -> tuple[StepArguments, ImportedStep]:
    """``fn``'s arguments checked and traced (the batch as one micro-batch of
    ``num_micro_batches``), then the step imported. ``concatenated_outputs``:
    with several micro-batches, mark the results that are batch-shaped
    (:data:`~alpa_ir.dialects.attrs.CONCATENATED_ATTR`, found as Alpa does: the
    step's output shapes at the whole batch against one micro-batch's)."""
    arguments, traced = trace_arguments(fn, args, static_argnums, batch_argnums, num_micro_batches)
    imported = import_step(
        fn,
        *traced,
        static_argnums=arguments.static_argnums,
        donate_argnums=donate_argnums,
        batch_argnums=batch_argnums,
        unroll_differentiated_loops=unroll_differentiated_loops,
    )
    if concatenated_outputs and num_micro_batches > 1:
        _mark_concatenated(fn, arguments, imported, num_micro_batches)
    return arguments, imported


def _mark_concatenated(
    fn: Callable[..., Any], arguments: StepArguments, imported: ImportedStep, b: int
) -> None:
    """Write :data:`~alpa_ir.dialects.attrs.CONCATENATED_ATTR` on ``@main``: the
    results whose shape at the whole batch is ``b`` micro-batches' along axis 0."""
    from xdsl.dialects.builtin import DenseArrayBase, i64

    from alpa_ir.dialects.attrs import CONCATENATED_ATTR
    from alpa_ir.dialects.types import shape_of
    from alpa_ir.errors import AlpaError
    from alpa_ir.frontend.arguments import OutputStatics, step_arguments
    from alpa_ir.ir.module_utils import main_function

    whole = step_arguments(fn, arguments.abstracted(), arguments.static_argnums)
    shapes = jax.eval_shape(whole.bind(fn, OutputStatics()), *whole.abstract())
    leaves = jax.tree.leaves(shapes)
    main = main_function(imported.module)
    results = main.function_type.outputs.data
    if len(leaves) != len(results):  # the step's structure depends on the batch size
        return
    concatenated = []
    for k, (leaf, type_) in enumerate(zip(leaves, results, strict=True)):
        part, full = tuple(shape_of(type_)), tuple(leaf.shape)
        if part == full:
            continue
        if not part or full != (part[0] * b, *part[1:]):
            raise AlpaError(
                f"result {k} of the step has shape {list(full)} for the whole batch but "
                f"{list(part)} for one of {b} micro-batches: neither the same (averaged over "
                "the micro-batches) nor their concatenation along axis 0"
            )
        concatenated.append(k)
    if concatenated:
        main.attributes[CONCATENATED_ATTR] = DenseArrayBase.from_list(i64, concatenated)


def planned_signature(
    arguments: StepArguments,
    imported: ImportedStep,
    batch_argnums: Sequence[int],
    draws_rows: bool,
) -> CompiledSignature:
    """What the planned step is called with; when its program draws random
    numbers by batch rows (``draw-micro-batch-rows`` added an input), the
    whole batch's size, whose ``arange`` is that input."""
    signature = compiled_signature(arguments, imported.in_tree, imported.out_tree, imported.outputs)
    if not draws_rows:
        return signature
    batch = arguments.dynamic_positions(batch_argnums)
    first = jax.tree.leaves(arguments.arrays[batch[0]])[0]
    return replace(signature, micro_batch_rows=int(np.shape(first)[0]))


__all__ = ["import_for_plan", "planned_signature"]
