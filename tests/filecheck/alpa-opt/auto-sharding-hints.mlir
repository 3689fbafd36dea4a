// RUN: alpa-opt %s -p 'auto-sharding{mesh-shape=1,4}' | filecheck %s
// RUN: not alpa-opt %s -p 'auto-sharding{mesh-shape=8}' 2>&1 | filecheck %s --check-prefix=ONE-D
// RUN: not alpa-opt %s -p 'auto-sharding{mesh-shape=2,4,1}' 2>&1 | filecheck %s --check-prefix=ERR

// A user's hint (jax.lax.with_sharding_constraint) pins the hidden activations'
// columns to "model": by position, axis 1 of the (1, 4) mesh ("data" is axis 0,
// of size 1: it splits nothing). The plan records what the hint costs (here
// nothing: the same split is also the cheapest).
builtin.module {
  func.func @main(%x: tensor<8x256xf32>, %w1: tensor<256x1024xf32>) -> tensor<8x1024xf32> {
    %0 = lax.dot_general %x, %w1 {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<8x256xf32>, tensor<256x1024xf32>) -> tensor<8x1024xf32>
    %1 = lax.sharding_constraint %0 {sharding = [["data", "model"], array<i64: 2, 4>, [[], ["model"]]]} : (tensor<8x1024xf32>) -> tensor<8x1024xf32> loc("user_step.py":12:8)
    %2 = lax.tanh %1 : (tensor<8x1024xf32>) -> tensor<8x1024xf32>
    func.return %2 : tensor<8x1024xf32>
  }
}

// CHECK:      func.func @main(
// CHECK-SAME:   sharding.hint_cost = {{[0-9.e+-]+}} : f64
// CHECK:      lax.sharding_constraint {{.*}}sharding.strategy = "hint [R, S1]", sharding.specs = [#sharding.spec<[R, S1]>]

// A 1-d mesh of 8: the hint's two axes do not match its one axis by name or by position.
// ONE-D: user_step.py:12:8: sharding hint P(None, 'model') names mesh axes model that the plan's mesh does not have (its axes: m0 (8); the hint's mesh: data (2), model (4))

// ERR: user_step.py:12:8: sharding hint P(None, 'model') names mesh axes model that the plan's mesh does not have (its axes: m0 (2), m1 (4), m2 (1); the hint's mesh: data (2), model (4))
