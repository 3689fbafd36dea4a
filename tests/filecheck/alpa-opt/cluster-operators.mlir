// RUN: alpa-opt %s -p 'cluster-operators{layers=2}' | filecheck %s

// A differentiated step as imported (backward and grad markers): the forward
// pass is cut into two layers after the matmul (it holds most of the FLOPs),
// and the cut is mirrored into the backward pass before the gradient.
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

// CHECK:      func.func @main({{.*}}pipeline.layer_flops = [2.048000e+03 : f64, 1.920000e+02 : f64], pipeline.layer_bytes = [0.000000e+00 : f64, 2.560000e+02 : f64]
// CHECK-NEXT:   lax.dot_general %x, %state.0
// CHECK-NEXT:   lax.pipeline_marker {kind = "layer"} : () -> ()
// CHECK-NEXT:   lax.tanh
// CHECK:        lax.pipeline_marker {kind = "backward"}
// CHECK:        lax.transpose
// CHECK-NEXT:   lax.pipeline_marker {kind = "layer"} : () -> ()
// CHECK-NEXT:   lax.pipeline_marker %{{.*}} {kind = "grad"}
