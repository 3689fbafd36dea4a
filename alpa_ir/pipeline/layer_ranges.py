"""Any layer range of a marked step as one forward+backward function, without
outlining (the stage candidates ``construct-stages`` costs)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, StringAttr, i64
from xdsl.ir import Attribute, Operation, SSAValue

from alpa_ir.dialects.attrs import ACCUMULATED_ATTR, PER_MICRO_BATCH_ATTR
from alpa_ir.dialects.mesh import MESH_ATTR
from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.stage_assignment import (
    Assignment,
    StageSlice,
    batch_args,
    count_layers,
    is_layer_marker,
)
from alpa_ir.pipeline.stage_functions import Group, build_function, group_fingerprint
from alpa_ir.pipeline.step_partition import is_grad_marker


@dataclass(frozen=True)
class LayerRangeFunction:
    """The forward+backward ops of layers ``first..last`` as one function (a
    stage candidate for ``construct-stages``). ``param_args``: its arguments
    that are non-batch arguments of ``@main`` (parameters); ``cross_bytes``:
    bytes of the other arguments computed by other layers (activations in,
    gradients back), i.e. what crosses into the stage per micro-batch."""

    function: func.FuncOp
    param_args: tuple[int, ...]
    cross_bytes: float
    backward_bytes: float = 0.0
    """The part of ``cross_bytes`` that later layers send back (gradients);
    the rest comes from earlier layers (activations)."""


class LayerRanges:
    """Extract the forward+backward computation of any layer range of a marked
    step (``@main`` with ``L`` layers, see :func:`count_layers`) without
    outlining: the ops are grouped per layer once, each range is then cut out
    and cloned into a new function, one for all ranges of the same structure
    (fingerprinted before they are built: the repeated blocks of a model are
    built once)."""

    def __init__(self, function: func.FuncOp) -> None:
        from alpa_ir.dialects.types import nbytes_of

        self.num_layers = count_layers(function)
        slices = [StageSlice(k, k, "") for k in range(self.num_layers)]
        self._assignment = Assignment(function, slices)
        self._block = function.body.block
        batch = set(batch_args(function))
        self._params = {a for k, a in enumerate(self._block.args) if k not in batch}
        self._batch = {a for k, a in enumerate(self._block.args) if k in batch}
        self._nbytes = nbytes_of
        a = self._assignment
        self._layer = {
            op: key[0] for op, key in a.group.items() if key[1] in ("forward", "backward")
        }
        # each layer's ops in program order, and every op's position: a range's
        # ops without a walk over the whole step per range
        self._position = {op: k for k, op in enumerate(a.ops)}
        self._built: dict[tuple[object, ...], list[_Built]] = {}
        self._printed: dict[Attribute, str] = {}  # the fingerprints' texts of attributes
        self._ops_of_layer: list[list[Operation]] = [[] for _ in range(self.num_layers)]
        for op in a.ops:
            layer = self._layer.get(op, -1)
            if layer >= 0:
                self._ops_of_layer[layer].append(op)
        # For every produced value: the layers that use it (through markers);
        # -1 stands for a use outside any layer (apply-grad or the return).
        outside = -1
        self._user_layers: dict[SSAValue, set[int]] = {}
        for op in a.ops:
            if op in a.floating or is_layer_marker(op) or is_grad_marker(op):
                continue
            for operand in op.operands:
                value = a.resolve(operand)
                self._user_layers.setdefault(value, set()).add(self._layer.get(op, outside))
        for operand in self._block.last_op.operands:  # type: ignore[union-attr]
            self._user_layers.setdefault(a.resolve(operand), set()).add(outside)
        # Bytes of the values layer l receives from layer k (k != l), each value once per l.
        self._edges = [[0.0] * self.num_layers for _ in range(self.num_layers)]
        received: set[tuple[int, SSAValue]] = set()
        for op, layer in self._layer.items():
            for operand in op.operands:
                value = a.resolve(operand)
                producer = (
                    self._layer.get(value.owner) if isinstance(value.owner, Operation) else None
                )
                if producer is None or producer == layer or (layer, value) in received:
                    continue
                received.add((layer, value))
                self._edges[layer][producer] += float(nbytes_of(value.type))

    def layer_ops(self) -> list[tuple[list[Operation], list[Operation]]]:
        """Per layer: its forward ops and its backward ops, in program order."""
        out: list[tuple[list[Operation], list[Operation]]] = [
            ([], []) for _ in range(self.num_layers)
        ]
        for op in self._assignment.ops:
            layer = self._layer.get(op)
            if layer is not None:
                out[layer][self._assignment.group[op][1] == "backward"].append(op)
        return out

    def user_layers(self, value: SSAValue) -> frozenset[int]:
        """The layers whose ops read ``value`` (``-1``: a read outside every layer,
        by apply-grad or the return)."""
        return frozenset(self._user_layers.get(self._assignment.resolve(value), ()))

    def resolve(self, value: SSAValue) -> SSAValue:
        """``value`` seen through the layer and gradient markers."""
        return self._assignment.resolve(value)

    def returned(self) -> set[SSAValue]:
        """The values the step returns, seen through the markers."""
        ret = self._block.last_op
        return {self._assignment.resolve(v) for v in ret.operands} if ret is not None else set()

    def internal_bytes(self, first: int, last: int, *, backward: bool = False) -> float:
        """Bytes that layers ``first..last`` pass to each other (the sum over the
        layers of what each receives from another layer of the range); with
        ``backward``, only what later layers send to earlier ones (gradients)."""
        return float(self.internal_bytes_table(backward=backward)[first, last])

    def internal_bytes_table(self, *, backward: bool = False) -> np.ndarray:
        """:meth:`internal_bytes` of every range at once: ``[first, last]``
        (``0`` below the diagonal), from 2-D prefix sums of the layer-to-layer
        bytes."""
        return internal_bytes_of(self.edge_bytes(), backward=backward)

    def edge_bytes(self) -> np.ndarray:
        """``[receiver, sender]``: bytes of the values layer ``receiver``
        takes from layer ``sender`` (each value once per receiver)."""
        return np.asarray(self._edges, dtype=np.float64)

    def group(self, first: int, last: int) -> Group:
        """Layers ``first..last`` (inclusive): their forward and backward ops in
        program order, the values they receive and those they pass on."""
        if not 0 <= first <= last < self.num_layers:
            raise AlpaError(
                f"layer range {first}..{last} is outside the step's layers 0..{self.num_layers - 1}"
            )
        a = self._assignment
        ops = [op for layer in range(first, last + 1) for op in self._ops_of_layer[layer]]
        if first < last:  # forward and backward ops of the layers interleave
            ops.sort(key=self._position.__getitem__)
        inside = set(ops)
        inputs: list[SSAValue] = []
        seen: set[SSAValue] = set()
        for op in ops:
            for operand in op.operands:
                value = a.resolve(operand)
                owner = value.owner
                if isinstance(owner, Operation) and (owner in a.floating or owner in inside):
                    continue
                if value not in seen:
                    seen.add(value)
                    inputs.append(value)
        outputs = [
            r
            for op in ops
            for r in op.results
            if any(not first <= u <= last for u in self._user_layers.get(r, ()))
        ]
        return Group((0, "forward"), ops, inputs, outputs)

    def fingerprint(self, first: int, last: int) -> str:
        """The :func:`~alpa_ir.costs.function_fingerprint.function_fingerprint`
        of the function of layers ``first..last``, without building it."""
        return group_fingerprint(self.group(first, last), self._assignment, self._printed)

    def function(self, first: int, last: int, name: str = "main") -> LayerRangeFunction:
        """Layers ``first..last`` (inclusive) as one function, forward and
        backward ops in program order; ranges of the same structure share it."""
        g = self.group(first, last)
        inputs = g.inputs
        params = tuple(k for k, v in enumerate(inputs) if v in self._params)
        built = self._built_once(g, name, params)
        crossing = [v for v in inputs if v not in self._params and v not in self._batch]
        cross = float(sum(self._nbytes(v.type) for v in crossing))
        back = float(
            sum(
                self._nbytes(v.type)
                for v in crossing
                if isinstance(v.owner, Operation) and self._layer.get(v.owner, -1) > last
            )
        )
        return LayerRangeFunction(built, params, cross, back)

    def _built_once(self, g: Group, name: str, params: tuple[int, ...]) -> func.FuncOp:
        """``g``'s function, built once for all ranges of the same structure
        (the same :func:`group_fingerprint`, parameters and batch arguments:
        GPT-3 39B's 47 identical blocks are one function). Ranges of the same
        size are fingerprinted only when a second one comes."""
        batch = tuple(k for k, v in enumerate(g.inputs) if v in self._batch)
        size = (name, len(g.ops), len(g.inputs), len(g.outputs), params, batch)
        same_size = self._built.setdefault(size, [])
        fingerprint = group_fingerprint(g, self._assignment, self._printed) if same_size else None
        for entry in same_size:
            if entry.fingerprint is None:
                entry.fingerprint = group_fingerprint(entry.group, self._assignment, self._printed)
            if entry.fingerprint == fingerprint:
                return entry.function
        built = build_function(g, self._assignment, "", self._batch)
        built.sym_name = StringAttr(name)
        # results read only outside every layer (apply-grad, the return) are
        # accumulated over the micro-batches: their reductions run once per step
        accumulated = [
            k
            for k, r in enumerate(g.outputs)
            if self._user_layers.get(r, ()) and all(u == -1 for u in self._user_layers[r])
        ]
        if accumulated:
            built.attributes[ACCUMULATED_ATTR] = DenseArrayBase.from_list(i64, accumulated)
        built.attributes.pop(MESH_ATTR, None)
        built.attributes.pop(PER_MICRO_BATCH_ATTR, None)
        same_size.append(_Built(g, built, fingerprint))
        return built


def internal_bytes_of(edges: np.ndarray, *, backward: bool = False) -> np.ndarray:
    """:meth:`LayerRanges.internal_bytes_table` of the layer-to-layer bytes
    ``edges`` (``[receiver, sender]``): ``[first, last]`` bytes the range's
    layers pass each other (with ``backward``, those later layers send back),
    from 2-D prefix sums."""
    num = edges.shape[0]
    if backward:
        edges = np.triu(edges, 1)  # senders after their receivers
    prefix = np.zeros((num + 1, num + 1))
    prefix[1:, 1:] = edges.cumsum(0).cumsum(1)
    lo = np.arange(num)[:, None]
    hi = np.arange(num)[None, :] + 1
    table = prefix[hi, hi] - prefix[lo, hi] - prefix[hi, lo] + prefix[lo, lo]
    return np.where(lo < hi, table, 0.0)


@dataclass
class _Built:
    """A range's function as built, the group it was built from, and the
    group's fingerprint once asked for."""

    group: Group
    function: func.FuncOp
    fingerprint: str | None
