// RUN: alpa-opt %s -p 'draw-micro-batch-rows{num-micro-batches=2}' | filecheck %s
// RUN: alpa-opt %s -p 'draw-micro-batch-rows{num-micro-batches=1}' | filecheck %s --check-prefix=ONE

// A dropout mask drawn per example of a micro-batch of 2: with 2 micro-batches
// @main gets the batch's row numbers and draws its micro-batch's rows of the
// whole batch's (4-row) draw, starting at its first row number.
builtin.module {
  func.func @main(%w: tensor<4x2xf32>, %x: tensor<2x4xf32>, %key: tensor<!lax.key<fry>>) -> tensor<4x2xf32> attributes {alpa.in_tree = "('tuple', None, ('*', '*', '*'))", alpa.out_tree = "'*'", alpa.batch_args = array<i64: 1>} {
    %0 = lax.dot_general %x, %w {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<2x4xf32>, tensor<4x2xf32>) -> tensor<2x2xf32>
    %1 = lax.constant 0.5 : tensor<f32>
    %2 = lax.constant 0.0 : tensor<f32>
    %3 = lax.constant 1.0 : tensor<f32>
    %4 = lax.convert_element_type %2 {new_dtype = f32, weak_type = false} : (tensor<f32>) -> tensor<f32>
    %5 = lax.convert_element_type %3 {new_dtype = f32, weak_type = false} : (tensor<f32>) -> tensor<f32>
    %6 = lax.broadcast_in_dim %4 {shape = array<i64: 1, 1>, broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<1x1xf32>
    %7 = lax.broadcast_in_dim %5 {shape = array<i64: 1, 1>, broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<1x1xf32>
    %8 = lax.random_bits %key {bit_width = 32, shape = array<i64: 2, 2>} : (tensor<!lax.key<fry>>) -> tensor<2x2xui32>
    %9 = lax.constant 9 : tensor<ui32>
    %10 = lax.shift_right_logical %8, %9 : (tensor<2x2xui32>, tensor<ui32>) -> tensor<2x2xui32>
    %11 = lax.constant 1065353216 : tensor<ui32>
    %12 = lax.or %10, %11 : (tensor<2x2xui32>, tensor<ui32>) -> tensor<2x2xui32>
    %13 = lax.bitcast_convert_type %12 {new_dtype = f32} : (tensor<2x2xui32>) -> tensor<2x2xf32>
    %14 = lax.sub %13, %3 : (tensor<2x2xf32>, tensor<f32>) -> tensor<2x2xf32>
    %15 = lax.sub %7, %6 : (tensor<1x1xf32>, tensor<1x1xf32>) -> tensor<1x1xf32>
    %16 = lax.mul %14, %15 : (tensor<2x2xf32>, tensor<1x1xf32>) -> tensor<2x2xf32>
    %17 = lax.add %16, %6 : (tensor<2x2xf32>, tensor<1x1xf32>) -> tensor<2x2xf32>
    %18 = lax.max %6, %17 : (tensor<1x1xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %19 = lax.lt %18, %1 : (tensor<2x2xf32>, tensor<f32>) -> tensor<2x2xi1>
    %20 = lax.convert_element_type %2 {new_dtype = f32, weak_type = false} : (tensor<f32>) -> tensor<f32>
    %21 = lax.broadcast_in_dim %20 {shape = array<i64: 2, 2>, broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<2x2xf32>
    %22 = lax.select_n %19, %21, %0 : (tensor<2x2xi1>, tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %23 = lax.broadcast_in_dim %2 {shape = array<i64: 2, 2>, broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<2x2xf32>
    %24 = lax.reduce_sum %22 {axes = array<i64: 0, 1>} : (tensor<2x2xf32>) -> tensor<f32>
    lax.pipeline_marker {kind = "backward"} : () -> ()
    %25 = lax.broadcast_in_dim %3 {shape = array<i64: 2, 2>, broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<2x2xf32>
    %26 = lax.broadcast_in_dim %2 {shape = array<i64: 2, 2>, broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<2x2xf32>
    %27 = lax.select_n %19, %26, %25 : (tensor<2x2xi1>, tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %28 = lax.dot_general %27, %x {dimension_numbers = #lax.dot<lhs_contracting = [0], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %29 = lax.transpose %28 {permutation = array<i64: 1, 0>} : (tensor<2x4xf32>) -> tensor<4x2xf32>
    %30 = lax.pipeline_marker %29 {kind = "grad"} : (tensor<4x2xf32>) -> tensor<4x2xf32>
    %31 = lax.constant 0.1 : tensor<f32>
    %32 = lax.mul %31, %30 : (tensor<f32>, tensor<4x2xf32>) -> tensor<4x2xf32>
    %33 = lax.sub %w, %32 : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x2xf32>
    func.return %33 : tensor<4x2xf32>
  }
}


// CHECK:      func.func @main(%w: tensor<4x2xf32>, %x: tensor<2x4xf32>, %key: tensor<!lax.key<fry>>, %micro_batch_rows: tensor<2xi32>)
// CHECK-SAME: alpa.batch_args = array<i64: 1, 3>
// CHECK:      lax.reduce_min %micro_batch_rows {axes = array<i64: 0>}
// CHECK:      lax.random_bits_rows %key, %{{.*}} {bit_width = 32, shape = array<i64: 2, 2>, global_shape = array<i64: 4, 2>}
// CHECK-NOT:  lax.random_bits %key

// ONE:        func.func @main(%w: tensor<4x2xf32>, %x: tensor<2x4xf32>, %key: tensor<!lax.key<fry>>) -> tensor<4x2xf32>
// ONE:        lax.random_bits %key
