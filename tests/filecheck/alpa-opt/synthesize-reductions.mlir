// RUN: alpa-opt %s -p 'synthesize-reductions{system=custom-2x4}' | filecheck %s
// RUN: alpa-opt %s -p 'synthesize-reductions{system=custom-2x4 max-size=1}' | filecheck %s --check-prefix=ONE
// RUN: not alpa-opt %s -p 'synthesize-reductions{system=custom-2x4 max-size=11}' 2>&1 | filecheck %s --check-prefix=LIMIT
// RUN: not alpa-opt %s -p 'synthesize-reductions{system=custom-2x2}' 2>&1 | filecheck %s --check-prefix=SIZE

// An all-reduce of 1 MB per device over all 8 devices of 2 nodes of 4, the network 10x
// slower than the links inside a node: the fastest synthesized program reduce-scatters
// inside the nodes, all-reduces the quarters across them and all-gathers inside again.
// With programs of size 1 only, the plain all-reduce over all devices is left.
builtin.module {
  mesh.logical_mesh @mesh {shape = array<i64: 2, 4>, devices = array<i64: 0, 1, 2, 3, 4, 5, 6, 7>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}
  func.func @main(%x: tensor<2048x1024xf32> {sharding.spec = #sharding.spec<[S01, R]>}) -> (tensor<2048x1024xf32> {sharding.spec = #sharding.spec<[S01, R]>}) attributes {mesh.mesh = @mesh} {
    %0 = sharding.all_reduce %x {axes = array<i64: 0, 1>, sharding.specs = [#sharding.spec<[S01, R]>]} : tensor<2048x1024xf32>
    %1 = sharding.all_reduce %0 {axes = array<i64: 1>, reduce = "max", sharding.specs = [#sharding.spec<[S01, R]>]} : tensor<2048x1024xf32>
    func.return %1 : tensor<2048x1024xf32>
  }
}

// CHECK:      %0 = sharding.all_reduce_program %x {axes = array<i64: 0, 1>,
// CHECK-SAME:   program = "ReduceScatter(l0, InsideGroup) ; AllReduce(l0, Parallel(root)) ; AllGather(l0, InsideGroup)",
// CHECK-SAME:   steps = [#sharding.step<ReduceScatter [[0, 1, 2, 3], [4, 5, 6, 7]]>, #sharding.step<AllReduce [[0, 4], [1, 5], [2, 6], [3, 7]]>, #sharding.step<AllGather [[0, 1, 2, 3], [4, 5, 6, 7]]>],
// CHECK-SAME:   sharding.specs = [#sharding.spec<[S01, R]>], p2.predicted_time = {{[0-9.e+-]+}}}
// CHECK-NEXT: %1 = sharding.all_reduce %0 {axes = array<i64: 1>, reduce = "max"

// ONE: program = "AllReduce(root, InsideGroup)", steps = [#sharding.step<AllReduce [[0, 1, 2, 3, 4, 5, 6, 7]]>]

// LIMIT: alpa-opt: error: synthesize-reductions: max-size 11 must be between 1 and 10
// SIZE: alpa-opt: error: synthesize-reductions: mesh @mesh of shape [2, 4] has 8 devices but system 'custom-2x2' has 4
