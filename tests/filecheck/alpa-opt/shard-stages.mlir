// RUN: alpa-opt %s -p 'cluster-operators{layers=2},outline-stages{layers=0-0,1-1 meshes=1x2,2x1 num-micro-batches=2},shard-stages' | filecheck %s

// Each stage function is auto-sharded on its own mesh, in call order: the
// batch is split over mesh0's 2-device axis (S1); the last stage's forward
// reads no @main batch argument, so nothing forces its batch: its dead loss
// erased (nothing returned reads it), the ties (inputs and fresh outputs kept
// on fewer bytes per device) split its rows over mesh1's 2-device axis (S0);
// its backward receives the value its forward returned in the layout the
// forward gave it, and the apply-grad function keeps the layout the backward
// gave the gradient.
builtin.module {
  func.func @main(%state.0: tensor<16x8xf32>, %state.1: tensor<16x8xf32>, %x: tensor<8x16xf32>) -> (tensor<16x8xf32>, tensor<16x8xf32>) attributes {alpa.in_tree = "('tuple', None, (('tuple', None, ('*', '*')), '*'))", alpa.out_tree = "('tuple', None, ('*', '*'))", alpa.donated = array<i64: 0, 1>, alpa.batch_args = array<i64: 2>} {
    %0 = lax.dot_general %x, %state.0 {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %1 = lax.tanh %0 : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %2 = lax.constant 1.0 : tensor<f32>
    %3 = lax.sub %2, %1 : (tensor<f32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %4 = lax.reduce_sum %1 {axes = array<i64: 0, 1>} : (tensor<8x8xf32>) -> tensor<f32>
    lax.pipeline_marker {kind = "backward"} : () -> ()
    %5 = lax.broadcast_in_dim %2 {shape = array<i64: 8, 8>, broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<8x8xf32>
    %6 = lax.mul %5, %3 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %7 = lax.mul %6, %1 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %8 = lax.add_any %6, %7 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %9 = lax.dot_general %8, %x {dimension_numbers = #lax.dot<lhs_contracting = [0], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<8x8xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    %10 = lax.transpose %9 {permutation = array<i64: 1, 0>} : (tensor<8x16xf32>) -> tensor<16x8xf32>
    %11 = lax.pipeline_marker %10 {kind = "grad"} : (tensor<16x8xf32>) -> tensor<16x8xf32>
    %12 = lax.constant 0.9 : tensor<f32>
    %13 = lax.mul %12, %state.1 : (tensor<f32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    %14 = lax.add %13, %11 : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    %15 = lax.constant 0.1 : tensor<f32>
    %16 = lax.mul %15, %14 : (tensor<f32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    %17 = lax.sub %state.0, %16 : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    func.return %17, %14 : tensor<16x8xf32>, tensor<16x8xf32>
  }
}

// CHECK:      func.func @stage0_forward(%0: tensor<8x16xf32> {sharding.spec = #sharding.spec<[S1, R]>}
// CHECK-SAME: mesh.mesh = @mesh0
// CHECK-SAME: sharding.objective
// CHECK:      func.func @stage1_forward(%0: tensor<8x8xf32> {sharding.spec = #sharding.spec<[S0, R]>})
// CHECK-SAME: -> (tensor<8x8xf32> {sharding.spec = #sharding.spec<[S0, R]>}
// CHECK-SAME: mesh.mesh = @mesh1
// CHECK:      func.func @stage1_backward(%0: tensor<8x8xf32> {sharding.spec = #sharding.spec<[S0, R]>}
// CHECK-SAME: -> (tensor<16x8xf32> {sharding.spec = #sharding.spec<[R, S0]>})
// CHECK-SAME: mesh.mesh = @mesh1
// CHECK:      func.func @stage1_apply_grad(%0: tensor<16x8xf32> {sharding.spec = #sharding.spec<[R, S0]>}
// CHECK-SAME: mesh.mesh = @mesh1
