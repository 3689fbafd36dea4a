// RUN: alpa-opt %s -p merge-trivial-ops | filecheck %s

// The bias broadcast has only an argument as operand: it starts a group. The
// add and the tanh join the dot's group (their deepest operand); the exp of an
// argument starts its own.
builtin.module {
  func.func @main(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>, %b: tensor<32xf32>) -> tensor<8x32xf32> {
    %0 = lax.dot_general %x, %w {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
    %1 = lax.broadcast_in_dim %b {shape = array<i64: 8, 32>, broadcast_dimensions = array<i64: 1>, sharding = none} : (tensor<32xf32>) -> tensor<8x32xf32>
    %2 = lax.add %0, %1 : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32>
    %3 = lax.tanh %2 : (tensor<8x32xf32>) -> tensor<8x32xf32>
    %4 = lax.exp %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
    func.return %3 : tensor<8x32xf32>
  }
}

// CHECK:      func.func @main({{.*}} attributes {sharding.num_groups = 3 : i64}
// CHECK-NEXT:   lax.dot_general {{.*}}sharding.group = 0}
// CHECK-NEXT:   lax.broadcast_in_dim {{.*}}sharding.group = 1}
// CHECK-NEXT:   lax.add {{.*}}{sharding.group = 0}
// CHECK-NEXT:   lax.tanh {{.*}}{sharding.group = 0}
// CHECK-NEXT:   lax.exp {{.*}}{sharding.group = 2}
// CHECK-NEXT:   func.return
