"""Each layer's FLOPs per pipeline phase: forward (F), backward for the input
gradient (B) and backward for the weight gradients (W).

Zero-bubble schedules run B and W apart (:mod:`alpa_ir.pipeline.backward_split`),
so the planner needs the three times of a stage, not their sum. Of a layer's
backward ops, B holds those that the gradients sent to other layers need (the
backward slice of every backward value another layer reads), W the rest: the
ops only the weight gradients (read by apply-grad) need. The same rule
``split-backward`` applies to a stage's function, here per layer of the marked
step, so a range's shares are sums over its layers; a range without FLOPs
gets equal thirds.
"""

from __future__ import annotations

import numpy as np
from xdsl.ir import Operation

from alpa_ir.costs.flops import op_flops
from alpa_ir.pipeline.layer_ranges import LayerRanges

PHASES = ("forward", "backward", "backward_weight")


def _kept_slice(layer: int, ops: list[Operation], ranges: LayerRanges) -> set[Operation]:
    """The ops of ``ops`` (one layer's) that what leaves the layer needs, other
    than weight gradients: values other layers read, and the step's results."""
    inside = set(ops)
    returned = ranges.returned()
    stack = [
        op
        for op in ops
        if any(
            r in returned or any(u not in (layer, -1) for u in ranges.user_layers(r))
            for r in op.results
        )
    ]
    needed: set[Operation] = set()
    while stack:
        op = stack.pop()
        if op in needed:
            continue
        needed.add(op)
        for v in op.operands:
            owner = ranges.resolve(v).owner
            if isinstance(owner, Operation) and owner in inside:
                stack.append(owner)
    return needed


def layer_phase_flops(ranges: LayerRanges) -> np.ndarray:
    """``[layer, phase]`` FLOPs (phases: forward, B, W) of the marked step. A
    layer without backward ops (a step whose last layer has no ``backward``
    marker before its backward) counts its B as forward, W split off all the
    same."""
    out = np.zeros((ranges.num_layers, 3))
    for layer, (forward, backward) in enumerate(ranges.layer_ops()):
        if backward:
            kept = _kept_slice(layer, backward, ranges)
            out[layer, 0] = sum(op_flops(op) for op in forward)
            out[layer, 1] = sum(op_flops(op) for op in backward if op in kept)
            out[layer, 2] = sum(op_flops(op) for op in backward if op not in kept)
        else:
            kept = _kept_slice(layer, forward, ranges)
            out[layer, 0] = sum(op_flops(op) for op in forward if op in kept)
            out[layer, 2] = sum(op_flops(op) for op in forward if op not in kept)
    return out


__all__ = ["PHASES", "layer_phase_flops"]
