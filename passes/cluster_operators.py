"""``cluster-operators``: slice a forward computation into layers (Alpa §5.2, Eq. 6).

Runs on a module whose ``@main`` is either a forward computation (a loss
function before differentiation; the markers then carry the values that
later layers use, so that differentiating the marked function mirrors them)
or a whole differentiated step as imported (``backward`` and ``grad``
markers, see :mod:`alpa_ir.frontend.differentiation`): then its forward pass
is cut by operand-free markers and :mod:`alpa_ir.pipeline.layer_mirroring` draws the
mirrored cuts into the backward pass. The operators in program order get their FLOPs
(:func:`alpa_ir.costs.flops.op_flops`) and the tensors between them their bytes;
the clustering DP (:func:`alpa_ir.algorithms.cluster_operators`) groups them
into ``layers`` consecutive layers whose FLOPs stay within ``(1 + delta)`` of
the average while minimising the largest bytes any layer receives. The pass
then inserts a layer marker (``pipeline_marker`` of kind ``layer``) at every
boundary, carrying the values that later layers use, so that differentiating
the marked function mirrors the boundaries into the backward pass.

Operand-free ops (constants, iota) are free to copy and never cross a
boundary; arguments of ``@main`` are available to every layer. The pass
writes ``pipeline.layer_flops`` and ``pipeline.layer_bytes`` (the bytes each
layer receives) on ``@main``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, FloatAttr, ModuleOp, StringAttr, f64
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass

from alpa_ir.algorithms import cluster_operators
from alpa_ir.algorithms.operator_clustering import ClusteringResult, Edge, clustering_objective
from alpa_ir.costs.flops import op_flops
from alpa_ir.dialects.lax import PRIMITIVE_OPS
from alpa_ir.dialects.types import nbytes_of
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.differentiation import make_marker
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_mirroring import mirror_layers, step_regions
from alpa_ir.pipeline.stage_assignment import is_layer_marker


def _floats(values: object) -> ArrayAttr:
    return ArrayAttr([FloatAttr(float(v), f64) for v in values])  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ClusterOperators(ModulePass):
    """Insert layer markers that slice ``@main`` into ``layers`` layers."""

    name = "cluster-operators"

    layers: int = 2
    """Number of layers to cut the forward pass into."""
    delta: float = 0.5
    """Alpa's δ: each layer's FLOPs stay within (1 + δ) of the average."""
    relax_delta: bool = True
    """Use the smallest feasible δ when ``delta`` admits no clustering."""
    fit_delta: bool = False
    """Raise δ (doubling, up to FIT_DELTA_MAX) to the least value that lets the
    layers receive as few bytes as any δ up to there allows. A model whose
    head has several blocks' FLOPs (GPT-3 350M's logits: 4 blocks) cannot keep
    it in one layer within δ = 0.5: the clustering then cuts through the
    logits, and every layer may receive as much."""

    replace_markers: bool = False
    """Drop the step's own layer markers (``mark_pipeline_boundary``) and cut
    anew, as Alpa's automatic layers do; otherwise they are an error."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx
        function = main_function(op)
        block = function.body.block
        markers = [o for o in block.ops if is_layer_marker(o)]
        if markers and not self.replace_markers:
            raise AlpaError(
                "cluster-operators: @main already has layer markers (mark_pipeline_boundary); "
                "keep them (ManualLayerOption, no cluster-operators) or drop them with "
                "cluster-operators{replace-markers=true}"
            )
        for marker in markers:  # identities: their results are their operands
            for result, operand in zip(marker.results, marker.operands, strict=True):
                result.replace_by(operand)
            block.erase_op(marker)
        regions = step_regions(function)
        if regions is None:
            candidates = list(block.ops)
        else:  # a differentiated step: cut its forward pass, then mirror the cuts
            candidates = list(regions.forward)
        ops = [o for o in candidates if o is not block.last_op and (o.operands or o.regions)]
        if self.layers < 1:
            raise AlpaError(f"cluster-operators: layers must be at least 1, got {self.layers}")
        if self.layers > max(len(ops), 1):
            raise AlpaError(
                f"cluster-operators: {self.layers} layers requested but @main has only "
                f"{len(ops)} operators"
            )
        index = {o: k for k, o in enumerate(ops)}
        edges = []
        for k, o in enumerate(ops):
            for result in o.results:
                users = sorted({index[u.operation] for u in result.uses if u.operation in index})
                if users:
                    edges.append((k, users, float(nbytes_of(result.type))))
        flops = [op_flops(o) for o in ops]
        if sum(flops) == 0:
            flops = [1.0] * len(ops)
        result = cluster_operators(
            flops, edges, self.layers, self.delta, relax_delta=self.relax_delta
        )
        if self.fit_delta:
            result = _fitted(result, flops, edges, self.layers)
        layer_of = {o: layer for layer, (a, b) in enumerate(result.layers) for o in ops[a : b + 1]}
        if regions is None:
            first = block.first_op
            for layer, (_, last) in enumerate(result.layers[:-1]):
                _insert_marker(first, ops[last], layer, layer_of)
                first = ops[last].next_op  # the marker, if one was inserted
        else:
            for _, last in result.layers[:-1]:
                block.insert_op_after(make_marker("layer"), ops[last])
            mirror_layers(function)
        function.attributes["pipeline.layer_flops"] = _floats(result.layer_flops)
        function.attributes["pipeline.layer_bytes"] = _floats(result.bytes_received)


FIT_DELTA_MAX = 8.0
"""The largest δ ``fit-delta`` tries (a layer of up to 9 average layers' FLOPs)."""
FIT_DELTA_TOLERANCE = 0.05
"""``fit-delta`` takes the least δ whose largest received bytes are within this
share of those at FIT_DELTA_MAX. Exact equality asks too much: on Hugging Face
GPT-2 small in 13 layers, δ = 5.9 cuts twelve equal blocks whose largest layer
input is 787,464 bytes, δ = 8 folds all twelve blocks into one layer for
786,440 (1 KiB, 0.13 %, less). So does 1 %: MoE 380M at 32 micro-batches of
1024 in 9 layers, δ = 0.5 cuts eight blocks whose largest input is 50.3 MB,
δ = 8 puts every FLOP in one layer (and eight layers of a few ops around it)
for 49.3 MB (2 % less). The cases the fit is for gain far more: a head's
logits crossing a cut are tens of times a block's activations."""


FIT_HEAVY_OPS = 3.0
"""``fit-delta`` raises δ at most until a layer may hold this many of the
step's heaviest operator (:func:`fit_delta_ceiling`)."""


def fit_delta_ceiling(flops: Sequence[float], layers: int) -> float:
    """The largest δ ``fit-delta`` tries: a layer of ``FIT_HEAVY_OPS`` times the
    heaviest operator's FLOPs. The fit exists to keep a heavy head whole (GPT-3
    350M's logits: one dot of four blocks' FLOPs, ceiling 12 average layers);
    a step of many light operators gets no licence to fold blocks together:
    Wide-ResNet 250M in 17 layers (heaviest operator 0.59 of a layer) took δ = 8
    for a quarter of the received bytes by folding its first blocks into one
    layer of 8.7 layers' FLOPs, whose rematerialized stash then fit no device."""
    total = float(sum(flops))
    if total <= 0 or layers < 1:
        return 0.0
    return FIT_HEAVY_OPS * max(flops) * layers / total - 1.0


def _fitted(
    result: ClusteringResult, flops: list[float], edges: list[Edge], layers: int
) -> ClusteringResult:
    """``fit-delta``: the clustering at the least δ (doubling from the one
    used) whose largest received bytes are those at FIT_DELTA_MAX (within
    FIT_DELTA_TOLERANCE)."""
    deltas = []
    delta = result.delta
    ceiling = min(FIT_DELTA_MAX, max(fit_delta_ceiling(flops, layers), delta))
    while delta < ceiling:
        delta = min(max(2 * delta, 0.5), ceiling)
        deltas.append(delta)
    if not deltas:
        return result
    # the widest δ's bytes alone: its layers are wanted only if no lower δ reaches them
    widest = clustering_objective(flops, edges, layers, deltas[-1], relax_delta=True)
    # the least δ that reaches the widest one's bytes, trying the least first:
    # each clustering solved costs a DP over the whole step
    enough = widest * (1 + FIT_DELTA_TOLERANCE)
    if result.objective <= enough:
        return result
    for delta in deltas[:-1]:
        tried = cluster_operators(flops, edges, layers, delta, relax_delta=True)
        if tried.objective <= enough:
            return tried
    return cluster_operators(flops, edges, layers, deltas[-1], relax_delta=True)


def _insert_marker(
    first_op: Operation | None, last_op: Operation, layer: int, layer_of: dict[Operation, int]
) -> None:
    """After ``last_op`` (the end of ``layer``), route every value of layers
    ``<= layer`` that a later layer (or the return) uses through one marker.
    Markers are inserted layer by layer, so only the ops from ``first_op``
    (just after the previous layer's end: its marker, which carries every
    earlier value still used) to ``last_op`` are looked at."""
    crossing: list[SSAValue] = []
    block = last_op.parent_block()
    assert block is not None
    o = first_op
    while o is not None:
        if layer_of.get(o, layer + 1) <= layer:
            for result in o.results:
                if any(layer_of.get(u.operation, layer + 1) > layer for u in result.uses):
                    crossing.append(result)
        if o is last_op:
            break
        o = o.next_op
    if not crossing:
        return
    marker = PRIMITIVE_OPS["pipeline_marker"].create(
        operands=crossing,
        result_types=[v.type for v in crossing],
        properties={"kind": StringAttr("layer")},
    )
    block.insert_op_after(marker, last_op)
    layer_of[marker] = layer + 1
    for value, marked in zip(crossing, marker.results, strict=True):
        for use in list(value.uses):
            if use.operation is not marker and layer_of.get(use.operation, layer + 1) > layer:
                use.operation.operands[use.index] = marked
