"""The fusion model of the cost model's memory estimates (alpa_ir.costs.fusion):
which values are materialized, how long inputs of fused kernels stay live,
the bytes moved, and its effect on the stage cost model."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from stage_fixtures import _cluster, _stage
from xdsl.dialects import func

import alpa_ir
from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.costs.flops import op_bytes
from alpa_ir.costs.fusion import (
    BlockFusion,
    fused_live_ranges,
    fused_traffic_bytes,
    transposed_reads,
)
from alpa_ir.costs.live_memory import peak_live_bytes
from alpa_ir.costs.stage_cost import StageCostOptions
from alpa_ir.dialects.types import shape_of
from alpa_ir.ir.module_utils import main_function

N = 64


def _function(fn: Any, *args: Any) -> func.FuncOp:
    return main_function(alpa_ir.import_jax(fn, *args))


def _materialized_ops(fn: Any, *args: Any) -> list[str]:
    block = _function(fn, *args).body.block
    fusion = BlockFusion(block)
    return [
        op.name.removeprefix("lax.")
        for op in block.ops
        if any(r in fusion.materialized for r in op.results)
    ]


def _name(owner: Any) -> str:
    return str(getattr(owner, "name", ""))


def _nbytes(value: Any) -> float:
    return float(math.prod(shape_of(value.type)) * 4)


def test_an_elementwise_chain_is_materialized_only_where_a_matmul_reads_it() -> None:
    def fn(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.tanh((jnp.exp(x) * 2.0 + 1.0) @ w)

    x, w = jnp.ones((N, N)), jnp.ones((N, N))
    # exp and mul fuse into the add that feeds the matmul; tanh is returned.
    assert _materialized_ops(fn, x, w) == ["add", "dot_general", "tanh"]


def test_a_softmax_materializes_its_reductions_and_its_output_only() -> None:
    def softmax(x: jax.Array) -> jax.Array:
        e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
        return e / jnp.sum(e, axis=-1, keepdims=True)

    names = _materialized_ops(softmax, jnp.ones((N, N)))
    assert names.count("reduce_max") == 1 and names.count("reduce_sum") == 1
    assert names[-1] == "div"
    assert "exp" not in names and "sub" not in names


def test_inputs_of_fused_kernels_stay_live_until_the_kernel_runs() -> None:
    def fn(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
        y = x @ w
        z = jnp.exp(y)  # fused into the multiply at the end
        v = jnp.sin(x) @ w  # runs between
        return v, z * 3.0

    block = _function(fn, jnp.ones((N, N)), jnp.ones((N, N))).body.block
    ops = list(block.ops)
    ranges = {value: (born, last) for value, born, last in fused_live_ranges(block, set())}
    y = ops[0].results[0]
    exp_op = next(op for op in ops if op.name == "lax.exp")
    mul_op = next(op for op in ops if op.name == "lax.mul")
    assert exp_op.results[0] not in ranges  # never written to memory
    # y is read by the fused exp inside the multiply's kernel, not at exp's position
    assert ranges[y][1] == ops.index(mul_op) > ops.index(exp_op)


def test_fusion_lowers_peak_memory_and_traffic_of_an_elementwise_chain() -> None:
    def fn(x: jax.Array) -> jax.Array:
        return jnp.sin(x) * jnp.cos(x) + jnp.tanh(x)

    block = _function(fn, jnp.ones((N, N))).body.block
    size = N * N * 4
    # Unfused, every op reads and writes a whole tensor.
    unfused = sum(op_bytes(op) for op in block.ops)
    fused = fused_traffic_bytes(block, lambda v: shape_of(v.type))
    assert fused == 2 * size  # read x once, write the result once
    assert unfused >= 4 * size
    assert peak_live_bytes(block, set(), _nbytes, fusion=True) == 2 * size
    # unfused: x, sin, cos and their product when the multiply runs
    assert peak_live_bytes(block, set(), _nbytes) == 4 * size


def test_the_stage_cost_model_counts_less_memory_and_traffic_with_fusion() -> None:
    cluster = _cluster()
    mesh = cluster.logical_mesh((1, 2))
    stage = _stage(0, count=2)
    plain = AnalyticalStageCostModel(StageCostOptions()).stage_cost(stage, mesh, cluster, (0, 1))
    fused = AnalyticalStageCostModel(StageCostOptions(fusion=True)).stage_cost(
        stage, mesh, cluster, (0, 1)
    )
    # the peak of a micro-batch: what it keeps for its backward and the backward's temporaries
    peak = lambda c: c.memory.activations + c.memory.transient  # noqa: E731
    assert peak(fused) < peak(plain)
    assert fused.memory_time < plain.memory_time
    assert fused.flops == plain.flops and fused.memory.parameters == plain.memory.parameters


def test_a_plans_local_slice_fuses_with_the_replicated_broadcast_it_slices() -> None:
    """The ILP may keep a broadcast replicated and slice it (a free reshard);
    XLA fuses both, so the full-size broadcast is never in memory."""
    from alpa_ir.costs.function_plan import plan_function

    def fn(x: jax.Array, mask: jax.Array) -> jax.Array:
        big = jnp.where(mask[None, :, :], x, -1e9)
        return jax.nn.softmax(big, axis=-1) @ jnp.ones((N, N))

    cluster = _cluster()
    mesh = cluster.logical_mesh((1, 2))
    function = _function(fn, jnp.ones((8, N, N)), jnp.ones((N, N), bool))
    planned = plan_function(function, mesh, StageCostOptions())
    block = planned.body.block
    fusion = BlockFusion(block)
    sliced = [
        op.operands[0].owner
        for op in block.ops
        if op.name == "sharding.reshard" and _name(op.operands[0].owner) == "lax.broadcast_in_dim"
    ]
    assert sliced, "the plan no longer slices a replicated broadcast; pick another example"
    assert all(r not in fusion.materialized for op in sliced for r in op.results)
    # nothing of the full [8, N, N] size is materialized before the softmax's output
    big = [
        op.name
        for op in block.ops
        if any(r in fusion.materialized for r in op.results)
        and shape_of(op.results[0].type) == (8, N, N)
    ]
    assert big == ["lax.div", "lax.dot_general"]


@pytest.mark.parametrize("fusion", [False, True])
def test_peak_live_bytes_counts_a_returned_value_to_the_end(fusion: bool) -> None:
    def fn(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
        y = x @ w
        return y, y @ w

    block = _function(fn, jnp.ones((N, N)), jnp.ones((N, N))).body.block
    # w, y and y @ w are live when the second matmul writes its result (x is dead)
    assert peak_live_bytes(block, set(), _nbytes, fusion=fusion) == 3 * N * N * 4


def test_a_sum_read_by_several_kernels_is_written_once_not_recomputed_in_each() -> None:
    """A residual stream: ``h = x + y`` is read by a layer norm's reduction
    and by the next residual add; recomputing it in both would read x and y
    twice, so it is materialized (written once, read twice). A scaled ``x``
    (one array streamed) is still fused into each reader."""

    def fn(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = x + y
        s = x * 2.0
        norm = h - jnp.mean(h, axis=-1, keepdims=True)
        return (norm + s) * 3.0, jnp.sum(s, axis=0)

    block = _function(fn, jnp.ones((N, N)), jnp.ones((N, N))).body.block
    fusion = BlockFusion(block)
    adds = [op for op in block.ops if op.name == "lax.add"]
    muls = [op for op in block.ops if op.name == "lax.mul"]
    assert adds[0].results[0] in fusion.materialized
    assert fusion.kernels_reading(adds[0].results[0]) == 2
    assert muls[0].results[0] not in fusion.materialized  # x * 2: fused into both readers


def test_a_dead_elementwise_value_is_not_written() -> None:
    """A value nobody reads (XLA removes it) moves no bytes."""

    def fn(x: jax.Array) -> jax.Array:
        jnp.broadcast_to(x[None], (8, N, N))  # dead
        return x * 2.0

    block = _function(fn, jnp.ones((N, N))).body.block
    fusion = BlockFusion(block)
    dead = [op for op in block.ops if op.name == "lax.broadcast_in_dim"]
    assert dead and all(r not in fusion.materialized for op in dead for r in op.results)
    assert fused_traffic_bytes(block, lambda v: shape_of(v.type)) == 2 * N * N * 4


def test_a_transpose_fused_into_two_kernels_is_read_across_rows_twice() -> None:
    """An Adam-like update of a gradient the backward produced transposed:
    the transpose fuses into both moment updates, each reading it across
    rows; a transpose keeping the minor dimension reads nothing across rows."""

    def fn(g: jax.Array, m: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        t = g.T
        keep = jnp.transpose(g.reshape(2, N // 2, N), (1, 0, 2)).reshape(N, N)
        return m * 0.9 + t * 0.1, v * 0.99 + t * t * 0.01, keep + 1.0

    block = _function(fn, *(jnp.ones((N, N)),) * 3).body.block
    reads = transposed_reads(block, lambda v: shape_of(v.type))
    assert reads == [N * N * 4.0, N * N * 4.0]


def _attention_step(q: jax.Array, k: jax.Array, v: jax.Array, w: jax.Array) -> Any:
    """Causal attention of (batch, heads, seq, dim) and a square weight, with
    the gradients of q, k, v and the weight."""

    def loss(q: jax.Array, k: jax.Array, v: jax.Array, w: jax.Array) -> jax.Array:
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        seq = s.shape[-1]
        s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s, -1e9)
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhqk,bhkd->bhqd", p, v)
        return jnp.sum((o @ w) ** 2)

    return jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, w)


def test_a_tiled_attention_keeps_its_scores_on_chip() -> None:
    """FlashAttention: the (2, 2, 64, 64) scores, probabilities and their
    gradients are never written; the square (8, 8) weight's gradient is (a
    dot without batch dimensions), as is every other value the plain model
    materializes; the peak and the traffic fall."""
    args = [jnp.ones((2, 2, N, 8))] * 3 + [jnp.ones((8, 8))]
    block = _function(_attention_step, *args).body.block
    plain, tiled = BlockFusion(block), BlockFusion(block, tiled_attention=True)
    scores = {r for r in plain.materialized if tuple(shape_of(r.type)[-2:]) == (N, N)}
    assert len(scores) >= 3  # scores, probabilities, their gradient at least
    assert tiled.tiled >= scores and not tiled.materialized & scores
    assert tiled.materialized == plain.materialized - scores
    weight_grad = [r for r in plain.materialized if tuple(shape_of(r.type)) == (8, 8)]
    assert weight_grad and all(r in tiled.materialized for r in weight_grad)
    shapes = lambda v: shape_of(v.type)  # noqa: E731
    assert fused_traffic_bytes(block, shapes, tiled) < fused_traffic_bytes(block, shapes, plain)
    peak = peak_live_bytes(block, set(), _nbytes, fusion=True, decisions=tiled)
    assert peak < peak_live_bytes(block, set(), _nbytes, fusion=True, decisions=plain)
    assert peak < 2 * 2 * N * N * 4  # less than one (2, 2, 64, 64) f32 array
