// RUN: alpa-opt %s -p reduce-scatter-rewrite | filecheck %s

// A data-parallel SGD-with-momentum update after auto-sharding: the gradient's
// all-reduce becomes a reduce-scatter along its first dimension, and the
// update, and the donated state it alone reads, run on a quarter each.
builtin.module {
  mesh.logical_mesh @mesh {shape = array<i64: 4>, devices = array<i64: 0, 1, 2, 3>, alpha = array<f64: 1.0>, beta = array<f64: 1.0>, axis_names = ["m0"]}
  func.func @main(%w: tensor<16x8xf32> {sharding.spec = #sharding.spec<[R, R]>}, %m: tensor<16x8xf32> {sharding.spec = #sharding.spec<[R, R]>}, %x: tensor<8x16xf32> {sharding.spec = #sharding.spec<[S0, R]>}, %dy: tensor<8x8xf32> {sharding.spec = #sharding.spec<[S0, R]>}) -> (tensor<16x8xf32> {sharding.spec = #sharding.spec<[R, R]>}, tensor<16x8xf32> {sharding.spec = #sharding.spec<[R, R]>}) attributes {alpa.donated = array<i64: 0, 1>, alpa.aliases = [array<i64: 0, 0>, array<i64: 1, 1>], alpa.batch_args = array<i64: 2, 3>, mesh.mesh = @mesh} {
    %0 = lax.dot_general %x, %dy {dimension_numbers = #lax.dot<lhs_contracting = [0], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32, sharding.specs = [#sharding.spec<[R, R], partial = [0]>]} : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<16x8xf32>
    %1 = sharding.all_reduce %0 {axes = array<i64: 0>, sharding.specs = [#sharding.spec<[R, R]>]} : tensor<16x8xf32>
    %2 = lax.constant 0.9 {sharding.specs = [#sharding.spec<[]>]} : tensor<f32>
    %3 = lax.mul %2, %m {sharding.specs = [#sharding.spec<[R, R]>]} : (tensor<f32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    %4 = lax.add %3, %1 {sharding.specs = [#sharding.spec<[R, R]>]} : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    %5 = lax.constant 0.1 {sharding.specs = [#sharding.spec<[]>]} : tensor<f32>
    %6 = lax.mul %5, %4 {sharding.specs = [#sharding.spec<[R, R]>]} : (tensor<f32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    %7 = lax.sub %w, %6 {sharding.specs = [#sharding.spec<[R, R]>]} : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    func.return %7, %4 : tensor<16x8xf32>, tensor<16x8xf32>
  }
}

// CHECK:      func.func @main(%w: tensor<16x8xf32> {sharding.spec = #sharding.spec<[S0, R]>}, %m: tensor<16x8xf32> {sharding.spec = #sharding.spec<[S0, R]>}
// CHECK:        lax.dot_general %x, %dy
// CHECK-NEXT:   %[[G:.*]] = sharding.reduce_scatter %{{.*}} {axes = array<i64: 0>, dim = 0, sharding.specs = [#sharding.spec<[S0, R]>]}
// CHECK-NOT:    sharding.all_reduce
// CHECK:        lax.mul %{{.*}}, %m {sharding.specs = [#sharding.spec<[S0, R]>], sharding.strategy = "zero2-update"}
// CHECK-NEXT:   lax.add %{{.*}}, %[[G]] {sharding.specs = [#sharding.spec<[S0, R]>], sharding.strategy = "zero2-update"}
// CHECK:        func.return
