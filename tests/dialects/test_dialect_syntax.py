"""Readable syntax of the mesh, sharding and pipeline dialects: exact print ->
parse -> print round trips, and verifier errors for inconsistent IR."""

from __future__ import annotations

import pytest

import alpa_ir
from alpa_ir.dialects.sharding import ShardingSpec, ShardingSpecAttr
from alpa_ir.errors import AlpaError

MESH_IR = """builtin.module {
  mesh.cluster @aws {levels = [#mesh.level<"node" x 8, bandwidth = 3125000000.0, latency = 5.0e-05, shared>, #mesh.level<"gpu" x 8, bandwidth = 150000000000.0, latency = 5.0e-06>], device_memory = 16000000000.0, peak_flops = 125000000000000.0, device_name = "V100"}
  mesh.logical_mesh @m {shape = array<i64: 2, 4>, devices = array<i64: 0, 1, 2, 3, 4, 5, 6, 7>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>, axis_names = ["dp", "mp"], cluster = @aws, placement = [array<i64: 2, 1>, array<i64: 1, 4>]}
}"""

SHARDING_IR = """builtin.module {
  mesh.logical_mesh @m {shape = array<i64: 2, 4>, devices = array<i64: 0, 1, 2, 3, 4, 5, 6, 7>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}
  func.func @main(%x: tensor<8x16xf32> {sharding.spec = #sharding.spec<[S0, R]>}, %w: tensor<16x32xf32> {sharding.spec = #sharding.spec<[R, S1]>}) -> tensor<8x32xf32> attributes {mesh.mesh = @m} {
    %0 = lax.dot_general %x, %w {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, sharding.specs = [#sharding.spec<[S0, S1]>], sharding.strategy = "i->0,j->1"} : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
    %1 = sharding.all_gather %0 {axes = array<i64: 1>, dim = 1, sharding.specs = [#sharding.spec<[S0, R]>]} : tensor<8x32xf32>
    %2 = sharding.reshard %1 {src = #sharding.spec<[S0, R]>, dst = #sharding.spec<[S01, R]>} : tensor<8x32xf32>
    %3 = sharding.all_to_all %2 {axes = array<i64: 0, 1>, src_dim = 0, dst_dim = 1} : tensor<8x32xf32>
    %4 = sharding.reduce_scatter %3 {axes = array<i64: 0>, dim = 0} : tensor<8x32xf32>
    %5 = sharding.all_reduce %4 {axes = array<i64: 1>, sharding.specs = [#sharding.spec<[R, R]>]} : tensor<8x32xf32>
    func.return %5 : tensor<8x32xf32>
  }
}"""

PIPELINE_IR = """builtin.module {
  pipeline.plan @plan {stages = [@s0, @s1], num_micro_batches = 4, schedule = "1f1b"}
  pipeline.stage @s0 {layers = array<i64: 0, 3>, mesh = @m0, forward = @f0, backward = @b0, apply_grad = @a0}
  pipeline.transfer @t0 {value = "x", src_mesh = @m0, dst_mesh = @m1, src_spec = #sharding.spec<[S0, R]>, dst_spec = #sharding.spec<[R, S1]>, tiles = [{src = 0 : i64, dst = array<i64: 4, 5>}]}
  pipeline.program {mesh = @m0} {
    pipeline.run {function = @f0, micro_batch = 0}
    pipeline.send {transfer = @t0, micro_batch = 0}
    pipeline.recv {transfer = @t0, micro_batch = 1}
    pipeline.broadcast {transfer = @t0, micro_batch = 1}
    pipeline.free {buffers = ["t0"], micro_batch = 0}
    pipeline.run {function = @a0}
  }
}"""


@pytest.mark.parametrize(
    "text", [MESH_IR, SHARDING_IR, PIPELINE_IR], ids=["mesh", "sharding", "pipeline"]
)
def test_roundtrip(text):
    module = alpa_ir.parse_module(text)
    assert str(module) == text
    assert str(alpa_ir.parse_module(str(module))) == text


def test_spec_attribute_values():
    module = alpa_ir.parse_module(SHARDING_IR)
    specs = [
        op.attributes["sharding.specs"].data[0].spec
        for op in module.walk()
        if "sharding.specs" in op.attributes
    ]
    assert specs[0] == ShardingSpec(((0,), (1,)))
    assert str(ShardingSpec(((0, 1), ()), partial=(2,))) == "[S01, R], partial = [2]"
    assert ShardingSpec(((0, 1), ()), (2,)).to_attr() == ShardingSpecAttr(
        *ShardingSpec(((0, 1), ()), (2,)).to_attr().parameters
    )
    assert ShardingSpec(((0,), (1,))).local_shape((8, 32), (2, 4)) == (4, 8)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (MESH_IR.replace("array<i64: 2, 4>", "array<i64: 2, 3>"), "needs 6 devices"),
        (MESH_IR.replace("array<i64: 2, 1>", "array<i64: 3, 1>"), "does not multiply"),
        (MESH_IR.replace("bandwidth = 3125000000.0", "bandwidth = 0.0"), "positive bandwidth"),
        (PIPELINE_IR.replace('"1f1b"', '"Zig Zag"'), "is not a schedule name"),
        (
            SHARDING_IR.replace("#sharding.spec<[S0, S1]>", "#sharding.spec<[S0, S0]>"),
            "mesh axis twice",
        ),
        (
            SHARDING_IR.replace("#sharding.spec<[S0, R]>}", "#sharding.spec<[Q0, R]>}", 1),
            "expected R or S",
        ),
    ],
)
def test_inconsistent_ir_is_rejected(text, message):
    with pytest.raises(AlpaError, match=message):
        alpa_ir.parse_module(text)
