// RUN: alpa-opt %s | alpa-opt | filecheck %s

// The sharding dialect round-trips: specs (split, S01, partial) on arguments,
// results and ops, every collective with its properties, a reshard, and a
// synthesized all-reduce with its steps. Printing the parsed module and
// parsing it again prints the same text.
builtin.module {
  mesh.logical_mesh @mesh {shape = array<i64: 2, 4>, devices = array<i64: 0, 1, 2, 3, 4, 5, 6, 7>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}
  func.func @main(%x: tensor<16x8xf32> {sharding.spec = #sharding.spec<[S0, R]>}, %p: tensor<16x8xf32> {sharding.spec = #sharding.spec<[R, R], partial = [1]>}) -> (tensor<16x8xf32> {sharding.spec = #sharding.spec<[S01, R]>}) attributes {mesh.mesh = @mesh} {
    %0 = sharding.all_reduce %p {axes = array<i64: 1>, sharding.specs = [#sharding.spec<[R, R]>]} : tensor<16x8xf32>
    %1 = sharding.all_reduce %0 {axes = array<i64: 0>, reduce = "max"} : tensor<16x8xf32>
    %2 = sharding.all_gather %x {axes = array<i64: 0>, dim = 0} : tensor<16x8xf32>
    %3 = sharding.reduce_scatter %p {axes = array<i64: 1>, dim = 1} : tensor<16x8xf32>
    %4 = sharding.all_to_all %x {axes = array<i64: 0>, src_dim = 0, dst_dim = 1} : tensor<16x8xf32>
    %5 = sharding.reshard %x {src = #sharding.spec<[S0, R]>, dst = #sharding.spec<[S01, R]>} : tensor<16x8xf32>
    %6 = sharding.all_reduce_program %p {axes = array<i64: 0, 1>, program = "ReduceScatter(l0, InsideGroup) ; AllReduce(l0, Parallel(root)) ; AllGather(l0, InsideGroup)", steps = [#sharding.step<ReduceScatter [[0, 1, 2, 3], [4, 5, 6, 7]]>, #sharding.step<AllReduce [[0, 4], [1, 5], [2, 6], [3, 7]]>, #sharding.step<AllGather [[0, 1, 2, 3], [4, 5, 6, 7]]>]} : tensor<16x8xf32>
    func.return %5 : tensor<16x8xf32>
  }
}

// CHECK:      builtin.module {
// CHECK-NEXT: mesh.logical_mesh @mesh {shape = array<i64: 2, 4>, devices = array<i64: 0, 1, 2, 3, 4, 5, 6, 7>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}
// CHECK-NEXT: func.func @main(%x: tensor<16x8xf32> {sharding.spec = #sharding.spec<[S0, R]>}, %p: tensor<16x8xf32> {sharding.spec = #sharding.spec<[R, R], partial = [1]>}) -> (tensor<16x8xf32> {sharding.spec = #sharding.spec<[S01, R]>}) attributes {mesh.mesh = @mesh} {
// CHECK-NEXT: %0 = sharding.all_reduce %p {axes = array<i64: 1>, sharding.specs = [#sharding.spec<[R, R]>]} : tensor<16x8xf32>
// CHECK-NEXT: %1 = sharding.all_reduce %0 {axes = array<i64: 0>, reduce = "max"} : tensor<16x8xf32>
// CHECK-NEXT: %2 = sharding.all_gather %x {axes = array<i64: 0>, dim = 0} : tensor<16x8xf32>
// CHECK-NEXT: %3 = sharding.reduce_scatter %p {axes = array<i64: 1>, dim = 1} : tensor<16x8xf32>
// CHECK-NEXT: %4 = sharding.all_to_all %x {axes = array<i64: 0>, src_dim = 0, dst_dim = 1} : tensor<16x8xf32>
// CHECK-NEXT: %5 = sharding.reshard %x {src = #sharding.spec<[S0, R]>, dst = #sharding.spec<[S01, R]>} : tensor<16x8xf32>
// CHECK-NEXT: %6 = sharding.all_reduce_program %p {axes = array<i64: 0, 1>, program = "ReduceScatter(l0, InsideGroup) ; AllReduce(l0, Parallel(root)) ; AllGather(l0, InsideGroup)", steps = [#sharding.step<ReduceScatter {{\[\[}}0, 1, 2, 3], [4, 5, 6, 7]]>, #sharding.step<AllReduce {{\[\[}}0, 4], [1, 5], [2, 6], [3, 7]]>, #sharding.step<AllGather {{\[\[}}0, 1, 2, 3], [4, 5, 6, 7]]>]} : tensor<16x8xf32>
// CHECK-NEXT: func.return %5 : tensor<16x8xf32>
// CHECK-NEXT: }
// CHECK-NEXT: }
