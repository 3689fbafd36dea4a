// RUN: alpa-opt %s -p 'merge-trivial-ops,auto-sharding{mesh-shape=1,4}' | filecheck %s
// RUN: alpa-opt %s -p 'merge-trivial-ops,auto-sharding{mesh-shape=1,4 solver=highs}' | filecheck %s
// RUN: not alpa-opt %s -p 'merge-trivial-ops,auto-sharding{mesh-shape=1,4 solver=gurobi}' 2>&1 | filecheck %s --check-prefix=ERR

// An inference step has a plan without communication: split the batch.
builtin.module {
  func.func @main(%x: tensor<8x256xf32>, %w1: tensor<256x1024xf32>, %w2: tensor<1024x256xf32>) -> tensor<8x256xf32> {
    %0 = lax.dot_general %x, %w1 {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<8x256xf32>, tensor<256x1024xf32>) -> tensor<8x1024xf32>
    %1 = lax.tanh %0 : (tensor<8x1024xf32>) -> tensor<8x1024xf32>
    %2 = lax.dot_general %1, %w2 {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<8x1024xf32>, tensor<1024x256xf32>) -> tensor<8x256xf32>
    func.return %2 : tensor<8x256xf32>
  }
}

// CHECK:      mesh.logical_mesh @mesh {shape = array<i64: 1, 4>
// CHECK:      func.func @main(%x: tensor<8x256xf32> {sharding.spec = #sharding.spec<[S1, R]>}
// CHECK-SAME:   sharding.objective = {{[0-9.e+-]+}} : f64
// CHECK:      lax.dot_general %x, %w1 {{.*}}sharding.strategy = "i0->1", sharding.specs = [#sharding.spec<[S1, R]>]
// CHECK-NEXT: lax.tanh {{.*}}sharding.specs = [#sharding.spec<[S1, R]>]
// CHECK-NEXT: lax.dot_general {{.*}}sharding.specs = [#sharding.spec<[S1, R]>]
// CHECK-NOT:  sharding.all_reduce
// CHECK-NEXT: func.return

// ERR: alpa-opt: error: unknown solver 'gurobi'; known: cbc, highs
