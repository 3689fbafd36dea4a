"""Context parallelism forced by hints (Llama 3's: the sequence split over the
context axis, the attention's scores kept by their queries' rows): every
``[.., S, S]`` value of a layer gets a hint the ILP keeps."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from alpa_ir.autosharding.context_hints import context_hint, with_context_hints
from alpa_ir.autosharding.megatron_specs import batch_specs, megatron_specs
from alpa_ir.costs.function_plan import plan_function, with_argument_specs
from alpa_ir.costs.stage_cost import StageCostOptions
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.dialects.sharding import spec_of_value
from alpa_ir.dialects.types import shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_ranges import LayerRanges

SEQ = 16  # llama-tiny's sequence
MESH = (1, 2, 2)  # data, context, tensor: planned in under a second of CPU ((2, 2, 2): 11 s)


@cache
def _llama_block() -> Any:
    """The tiny Llama's first block as a layer function (forward and backward),
    2 rows per micro-batch, its weights Megatron's and its activations split
    over data and context."""
    from alpa_ir.tools.bench_suite import trace

    ranges = LayerRanges(main_function(trace("llama-tiny", 4, 4)))
    layer = ranges.function(0, 0)
    specs = megatron_specs(layer.function, layer.param_args, MESH, 2)
    specs.update(batch_specs(layer.function, layer.param_args, 2, MESH, [(0, 0), (1, 1)]))
    return with_argument_specs(layer.function, specs)


def _scores(function: Any) -> list[Any]:
    return [
        r
        for op in function.body.block.ops
        for r in op.results
        if tuple(shape_of(r.type)[-2:]) == (SEQ, SEQ)
    ]


def test_the_hint_of_scores_masks_and_other_values() -> None:
    hint = context_hint((2, 4, SEQ, SEQ), (2, 2, 2), SEQ)
    assert hint is not None and hint.dims == (("data",), ("tensor",), ("context",), ())
    mask = context_hint((SEQ, SEQ), (2, 2, 2), SEQ)
    assert mask is not None and mask.dims == (("context",), ())
    one = context_hint((1, 1, SEQ, SEQ), (2, 2, 2), SEQ)  # a broadcast mask: 1 row, 1 head
    assert one is not None and one.dims == ((), (), ("context",), ())
    assert context_hint((2, SEQ, 32), (2, 2, 2), SEQ) is None  # activations: batch_specs'
    with pytest.raises(AlpaError, match=r"must be \(data, context, tensor\)"):
        with_context_hints(_llama_block(), (2, 4), SEQ)


def test_the_ilp_keeps_the_scores_split_by_their_queries() -> None:
    """Every score-shaped value of the block (forward and backward) is hinted,
    and the plan keeps the hints: each device holds its queries' rows of the
    scores (dim -2 over the context axis), the keys whole."""
    block = _llama_block()
    hinted, count = with_context_hints(block, MESH, SEQ)
    assert count > 0 and count == len(_scores(block)) - _unused(block)
    planned = plan_function(
        hinted, LogicalDeviceMesh(MESH), StageCostOptions(keep_argument_specs=True)
    )
    hints = [
        op
        for op in planned.body.block.ops
        if isinstance(op, LaxOp) and op.primitive_name == "sharding_constraint"
    ]
    assert len(hints) == count
    for op in hints:
        spec = spec_of_value(op.results[0], planned)
        assert spec.dims[-2] == (1,) and spec.dims[-1] == ()


def _unused(function: Any) -> int:
    return sum(1 for r in _scores(function) if not r.uses)
