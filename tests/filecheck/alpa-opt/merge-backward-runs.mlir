// RUN: alpa-opt %s -p 'merge-backward-runs' | filecheck %s

// Two gradients of the same loss on two halves of the batch (a user's own
// accumulation, unrolled): two backward runs become one, both forward passes
// first, then one backward marker and both backward passes.
builtin.module {
  func.func @main(%w: tensor<4x2xf32>, %x: tensor<4x4xf32>) -> tensor<4x2xf32> attributes {alpa.in_tree = "('tuple', None, ('*', '*'))", alpa.out_tree = "'*'", alpa.batch_args = array<i64: 1>} {
    %0 = lax.slice %x {start_indices = array<i64: 0, 0>, limit_indices = array<i64: 2, 4>} : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %1 = lax.dot_general %0, %w {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<2x4xf32>, tensor<4x2xf32>) -> tensor<2x2xf32>
    %2 = lax.tanh %1 : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %3 = lax.constant 1.0 : tensor<f32>
    %4 = lax.sub %3, %2 : (tensor<f32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %5 = lax.reduce_sum %2 {axes = array<i64: 0, 1>} : (tensor<2x2xf32>) -> tensor<f32>
    lax.pipeline_marker {kind = "backward"} : () -> ()
    %6 = lax.broadcast_in_dim %3 {shape = array<i64: 2, 2>, broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<2x2xf32>
    %7 = lax.mul %6, %4 : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %8 = lax.mul %7, %2 : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %9 = lax.add_any %7, %8 : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %10 = lax.dot_general %9, %0 {dimension_numbers = #lax.dot<lhs_contracting = [0], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %11 = lax.transpose %10 {permutation = array<i64: 1, 0>} : (tensor<2x4xf32>) -> tensor<4x2xf32>
    %12 = lax.pipeline_marker %11 {kind = "grad"} : (tensor<4x2xf32>) -> tensor<4x2xf32>
    %13 = lax.slice %x {start_indices = array<i64: 2, 0>, limit_indices = array<i64: 4, 4>} : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %14 = lax.dot_general %13, %w {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<2x4xf32>, tensor<4x2xf32>) -> tensor<2x2xf32>
    %15 = lax.tanh %14 : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %16 = lax.sub %3, %15 : (tensor<f32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %17 = lax.reduce_sum %15 {axes = array<i64: 0, 1>} : (tensor<2x2xf32>) -> tensor<f32>
    lax.pipeline_marker {kind = "backward"} : () -> ()
    %18 = lax.broadcast_in_dim %3 {shape = array<i64: 2, 2>, broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<2x2xf32>
    %19 = lax.mul %18, %16 : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %20 = lax.mul %19, %15 : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %21 = lax.add_any %19, %20 : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %22 = lax.dot_general %21, %13 {dimension_numbers = #lax.dot<lhs_contracting = [0], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %23 = lax.transpose %22 {permutation = array<i64: 1, 0>} : (tensor<2x4xf32>) -> tensor<4x2xf32>
    %24 = lax.pipeline_marker %23 {kind = "grad"} : (tensor<4x2xf32>) -> tensor<4x2xf32>
    %25 = lax.add %12, %24 : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x2xf32>
    %26 = lax.constant 0.1 : tensor<f32>
    %27 = lax.mul %26, %25 : (tensor<f32>, tensor<4x2xf32>) -> tensor<4x2xf32>
    %28 = lax.sub %w, %27 : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x2xf32>
    func.return %28 : tensor<4x2xf32>
  }
}


// CHECK:      lax.tanh
// CHECK-NEXT: lax.tanh
// CHECK:      lax.pipeline_marker {kind = "backward"}
// CHECK-NOT:  lax.pipeline_marker {kind = "backward"}
// CHECK:      lax.pipeline_marker %{{.*}} {kind = "grad"}
// CHECK-NEXT: lax.pipeline_marker %{{.*}} {kind = "grad"}
