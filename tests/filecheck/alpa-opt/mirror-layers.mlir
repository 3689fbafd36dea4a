// RUN: alpa-opt %s -p 'mirror-layers' | filecheck %s

// mark_pipeline_boundary() without arguments has no transpose, so JAX leaves
// the backward pass without the boundary: the pass mirrors it there.
builtin.module {
  func.func @main(%w.0: tensor<4x4xf32>, %w.1: tensor<4x2xf32>, %x: tensor<2x4xf32>) -> (tensor<4x4xf32>, tensor<4x2xf32>) attributes {alpa.in_tree = "('tuple', None, (('list', None, ('*', '*')), '*'))", alpa.out_tree = "('list', None, ('*', '*'))", alpa.batch_args = array<i64: 2>} {
    %0 = lax.dot_general %x, %w.0 {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    %1 = lax.tanh %0 : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %2 = lax.constant 1.0 : tensor<f32>
    %3 = lax.sub %2, %1 : (tensor<f32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    lax.pipeline_marker {kind = "layer"} : () -> ()
    %4 = lax.dot_general %1, %w.1 {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<2x4xf32>, tensor<4x2xf32>) -> tensor<2x2xf32>
    %5 = lax.reduce_sum %4 {axes = array<i64: 0, 1>} : (tensor<2x2xf32>) -> tensor<f32>
    lax.pipeline_marker {kind = "backward"} : () -> ()
    %6 = lax.broadcast_in_dim %2 {shape = array<i64: 2, 2>, broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<2x2xf32>
    %7 = lax.dot_general %6, %1 {dimension_numbers = #lax.dot<lhs_contracting = [0], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %8 = lax.transpose %7 {permutation = array<i64: 1, 0>} : (tensor<2x4xf32>) -> tensor<4x2xf32>
    %9 = lax.dot_general %6, %w.1 {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [1], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<2x2xf32>, tensor<4x2xf32>) -> tensor<2x4xf32>
    %10 = lax.mul %9, %3 : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %11 = lax.mul %10, %1 : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %12 = lax.add_any %10, %11 : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %13 = lax.dot_general %12, %x {dimension_numbers = #lax.dot<lhs_contracting = [0], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
    %14 = lax.transpose %13 {permutation = array<i64: 1, 0>} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %15, %16 = lax.pipeline_marker %8, %14 {kind = "grad"} : (tensor<4x2xf32>, tensor<4x4xf32>) -> (tensor<4x2xf32>, tensor<4x4xf32>)
    %17 = lax.constant 0.1 : tensor<f32>
    %18 = lax.mul %17, %16 : (tensor<f32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %19 = lax.sub %w.0, %18 : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %20 = lax.mul %17, %15 : (tensor<f32>, tensor<4x2xf32>) -> tensor<4x2xf32>
    %21 = lax.sub %w.1, %20 : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x2xf32>
    func.return %19, %21 : tensor<4x4xf32>, tensor<4x2xf32>
  }
}


// CHECK:      lax.tanh
// CHECK:      lax.pipeline_marker {kind = "layer"}
// CHECK:      lax.pipeline_marker {kind = "backward"}
// CHECK-NEXT: lax.pipeline_marker {kind = "layer"}
// CHECK:      lax.pipeline_marker %{{.*}} {kind = "grad"}
