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
) -> tuple[StepArguments, ImportedStep]:
    """``fn``'s arguments checked and traced (the batch as one micro-batch of
    ``num_micro_batches``), then the step imported."""
    arguments, traced = trace_arguments(fn, args, static_argnums, batch_argnums, num_micro_batches)
    imported = import_step(
        fn,
        *traced,
        static_argnums=arguments.static_argnums,
        donate_argnums=donate_argnums,
        batch_argnums=batch_argnums,
        unroll_differentiated_loops=unroll_differentiated_loops,
    )
    return arguments, imported


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
