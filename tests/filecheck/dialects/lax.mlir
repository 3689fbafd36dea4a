// RUN: alpa-opt %s | alpa-opt | filecheck %s

// The lax dialect round-trips: ops with attributes of their own (dot
// dimension numbers, dtypes, axes, permutations), constants, and the region
// ops cond and scan (what the frontend imports for a step with jnp code,
// lax.cond and lax.scan).
builtin.module {
  func.func @main(%w: tensor<4x3xf32>, %x: tensor<2x4xf32>, %i: tensor<i32>) -> (tensor<2xbf16>, tensor<f32>, tensor<2x2xf32>) {
    %0 = lax.dot_general %x, %w {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
    %1 = lax.tanh %0 : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %2 = lax.constant 0 : tensor<i32>
    %3 = lax.gt %i, %2 : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %4 = lax.convert_element_type %3 {new_dtype = i32, weak_type = false} : (tensor<i1>) -> tensor<i32>
    %5 = lax.cond %4, %1 ({
    ^bb0(%6: tensor<2x3xf32>):
      %7 = lax.constant 1.0 : tensor<f32>
      %8 = lax.sub %6, %7 : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
      lax.return %8 : tensor<2x3xf32>
    }, {
    ^bb0(%9: tensor<2x3xf32>):
      %10 = lax.constant 2.0 : tensor<f32>
      %11 = lax.mul %9, %10 : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
      lax.return %11 : tensor<2x3xf32>
    }) : (tensor<i32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %12 = lax.constant 0.0 : tensor<f32>
    %13, %14 = lax.scan %12, %5 ({
    ^bb0(%15: tensor<f32>, %16: tensor<3xf32>):
      %17 = lax.reduce_sum %16 {axes = array<i64: 0>} : (tensor<3xf32>) -> tensor<f32>
      %18 = lax.add %15, %17 : (tensor<f32>, tensor<f32>) -> tensor<f32>
      lax.return %18, %15 : tensor<f32>, tensor<f32>
    }) {reverse = false, length = 2, num_consts = 0, num_carry = 1, unroll = 1} : (tensor<f32>, tensor<2x3xf32>) -> (tensor<f32>, tensor<2xf32>)
    %19 = lax.reduce_max %5 {axes = array<i64: 1>} : (tensor<2x3xf32>) -> tensor<2xf32>
    %20 = lax.convert_element_type %19 {new_dtype = bf16, weak_type = false} : (tensor<2xf32>) -> tensor<2xbf16>
    %21 = lax.reduce_sum %14 {axes = array<i64: 0>} : (tensor<2xf32>) -> tensor<f32>
    %22 = lax.add %13, %21 : (tensor<f32>, tensor<f32>) -> tensor<f32>
    %23 = lax.transpose %5 {permutation = array<i64: 1, 0>} : (tensor<2x3xf32>) -> tensor<3x2xf32>
    %24 = lax.slice %23 {start_indices = array<i64: 0, 0>, limit_indices = array<i64: 2, 2>} : (tensor<3x2xf32>) -> tensor<2x2xf32>
    func.return %20, %22, %24 : tensor<2xbf16>, tensor<f32>, tensor<2x2xf32>
  }
}

// CHECK:      builtin.module {
// CHECK-NEXT: func.func @main(%w: tensor<4x3xf32>, %x: tensor<2x4xf32>, %i: tensor<i32>) -> (tensor<2xbf16>, tensor<f32>, tensor<2x2xf32>) {
// CHECK-NEXT: %0 = lax.dot_general %x, %w {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
// CHECK-NEXT: %1 = lax.tanh %0 : (tensor<2x3xf32>) -> tensor<2x3xf32>
// CHECK-NEXT: %2 = lax.constant 0 : tensor<i32>
// CHECK-NEXT: %3 = lax.gt %i, %2 : (tensor<i32>, tensor<i32>) -> tensor<i1>
// CHECK-NEXT: %4 = lax.convert_element_type %3 {new_dtype = i32, weak_type = false} : (tensor<i1>) -> tensor<i32>
// CHECK-NEXT: %5 = lax.cond %4, %1 ({
// CHECK-NEXT: ^bb0(%6: tensor<2x3xf32>):
// CHECK-NEXT: %7 = lax.constant 1.0 : tensor<f32>
// CHECK-NEXT: %8 = lax.sub %6, %7 : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
// CHECK-NEXT: lax.return %8 : tensor<2x3xf32>
// CHECK-NEXT: }, {
// CHECK-NEXT: ^bb0(%9: tensor<2x3xf32>):
// CHECK-NEXT: %10 = lax.constant 2.0 : tensor<f32>
// CHECK-NEXT: %11 = lax.mul %9, %10 : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
// CHECK-NEXT: lax.return %11 : tensor<2x3xf32>
// CHECK-NEXT: }) : (tensor<i32>, tensor<2x3xf32>) -> tensor<2x3xf32>
// CHECK-NEXT: %12 = lax.constant 0.0 : tensor<f32>
// CHECK-NEXT: %13, %14 = lax.scan %12, %5 ({
// CHECK-NEXT: ^bb0(%15: tensor<f32>, %16: tensor<3xf32>):
// CHECK-NEXT: %17 = lax.reduce_sum %16 {axes = array<i64: 0>} : (tensor<3xf32>) -> tensor<f32>
// CHECK-NEXT: %18 = lax.add %15, %17 : (tensor<f32>, tensor<f32>) -> tensor<f32>
// CHECK-NEXT: lax.return %18, %15 : tensor<f32>, tensor<f32>
// CHECK-NEXT: }) {reverse = false, length = 2, num_consts = 0, num_carry = 1, unroll = 1} : (tensor<f32>, tensor<2x3xf32>) -> (tensor<f32>, tensor<2xf32>)
// CHECK-NEXT: %19 = lax.reduce_max %5 {axes = array<i64: 1>} : (tensor<2x3xf32>) -> tensor<2xf32>
// CHECK-NEXT: %20 = lax.convert_element_type %19 {new_dtype = bf16, weak_type = false} : (tensor<2xf32>) -> tensor<2xbf16>
// CHECK-NEXT: %21 = lax.reduce_sum %14 {axes = array<i64: 0>} : (tensor<2xf32>) -> tensor<f32>
// CHECK-NEXT: %22 = lax.add %13, %21 : (tensor<f32>, tensor<f32>) -> tensor<f32>
// CHECK-NEXT: %23 = lax.transpose %5 {permutation = array<i64: 1, 0>} : (tensor<2x3xf32>) -> tensor<3x2xf32>
// CHECK-NEXT: %24 = lax.slice %23 {start_indices = array<i64: 0, 0>, limit_indices = array<i64: 2, 2>} : (tensor<3x2xf32>) -> tensor<2x2xf32>
// CHECK-NEXT: func.return %20, %22, %24 : tensor<2xbf16>, tensor<f32>, tensor<2x2xf32>
// CHECK-NEXT: }
// CHECK-NEXT: }
