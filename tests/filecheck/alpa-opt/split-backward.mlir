// RUN: alpa-opt %s -p 'split-backward' | filecheck %s
// RUN: alpa-opt %s -p 'split-backward,split-backward' | filecheck %s
// RUN: alpa-opt %s -p 'split-backward,cross-mesh-resharding,emit-instructions{schedule=zb-h1}' | filecheck %s --check-prefix=ZB
// RUN: alpa-opt %s -p 'split-backward,cross-mesh-resharding,emit-instructions' | filecheck %s --check-prefix=ONE
// RUN: not alpa-opt %s -p 'cross-mesh-resharding,emit-instructions{schedule=zb-h1}' 2>&1 | filecheck %s --check-prefix=UNSPLIT
// RUN: not alpa-opt %s -p 'cross-mesh-resharding,split-backward' 2>&1 | filecheck %s --check-prefix=LATE

// Two stages of y = tanh(x @ w0) @ w1. stage1's backward computes the gradient
// stage0 needs (%gh = g @ w1^T, B) and w1's gradient (%gw1 = h^T @ g, W, read only
// by apply-grad); the two share %g. stage0's backward only computes w0's gradient:
// its B is empty.

// CHECK:      pipeline.stage @stage0 {{.*}}backward = @stage0_backward, backward_weight = @stage0_backward_weight, apply_grad = @stage0_apply_grad}
// CHECK:      pipeline.stage @stage1 {{.*}}backward = @stage1_backward, backward_weight = @stage1_backward_weight, apply_grad = @stage1_apply_grad}
// CHECK:      func.func @stage1_backward(%h: tensor<4x8xf32>, %unused: tensor<4x8xf32>, %w1: tensor<8x2xf32>, %y: tensor<4x2xf32>) -> (tensor<4x8xf32>, tensor<4x2xf32> {sharding.spec = #sharding.spec<[S0, R]>})
// CHECK-NEXT:   %g = lax.sub %y, %y
// CHECK-NEXT:   %gh = lax.dot_general %g, %w1
// CHECK-NEXT:   func.return %gh, %g
// CHECK:      func.func @stage1_backward_weight(%h: tensor<4x8xf32>, %g: tensor<4x2xf32> {sharding.spec = #sharding.spec<[S0, R]>}) -> (tensor<8x2xf32>)
// CHECK-NEXT:   %gw1 = lax.dot_general %h, %g
// CHECK-NEXT:   func.return %gw1
// CHECK:      func.func @stage0_backward(%gh: tensor<4x8xf32>, %x: tensor<4x4xf32>) attributes
// CHECK-NEXT:   func.return
// CHECK:      func.func @stage0_backward_weight(%x: tensor<4x4xf32>, %gh: tensor<4x8xf32>) -> (tensor<4x8xf32>)
// CHECK-NEXT:   %gw0 = lax.dot_general %x, %gh
// CHECK:      func.func @main
// CHECK:        %[[GH:.*]], %[[G:.*]] = func.call @stage1_backward(%h, %h, %w1, %y)
// CHECK-NEXT:   %[[W1:.*]] = func.call @stage1_backward_weight(%h, %[[G]])
// CHECK-NEXT:   func.call @stage0_backward(%[[GH]], %x)
// CHECK-NEXT:   %[[W0:.*]] = func.call @stage0_backward_weight(%x, %[[GH]])
// CHECK-NEXT:   func.call @stage0_apply_grad(%w0, %[[W0]])
// CHECK-NEXT:   func.call @stage1_apply_grad(%w1, %[[W1]])

// ZB-H1 on the last stage: the W of micro-batch 0 waits until after the forward of
// micro-batch 1 (its next forward was ready); 1F1B runs W right after its B.
// ZB:       pipeline.program {mesh = @mesh1}
// ZB:         pipeline.run {function = @stage1_backward, micro_batch = 0}
// ZB-NOT:     pipeline.run {function = @stage1_backward_weight, micro_batch = 0}
// ZB:         pipeline.run {function = @stage1_forward, micro_batch = 1}
// ZB:         pipeline.run {function = @stage1_backward_weight, micro_batch = 0}
// ONE:      pipeline.program {mesh = @mesh1}
// ONE:        pipeline.run {function = @stage1_backward, micro_batch = 0}
// ONE-NOT:    pipeline.run {function = @stage1_forward
// ONE:        pipeline.run {function = @stage1_backward_weight, micro_batch = 0}

// UNSPLIT: emit-instructions: schedule 'zb-h1' runs the backward as two tasks (B and W), but no stage's backward is split; run split-backward first (a step without weight gradients has nothing to split: use 1f1b)
// LATE: split-backward: the module already has pipeline.transfer ops; run it before cross-mesh-resharding

builtin.module {
  mesh.logical_mesh @mesh0 {shape = array<i64: 1, 1>, devices = array<i64: 0>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 1.0>}
  mesh.logical_mesh @mesh1 {shape = array<i64: 1, 1>, devices = array<i64: 1>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 1.0>}
  pipeline.plan @plan {stages = [@stage0, @stage1], num_micro_batches = 2, schedule = "1f1b"}
  pipeline.stage @stage0 {layers = array<i64: 0, 0>, mesh = @mesh0, forward = @stage0_forward, backward = @stage0_backward, apply_grad = @stage0_apply_grad}
  pipeline.stage @stage1 {layers = array<i64: 1, 1>, mesh = @mesh1, forward = @stage1_forward, backward = @stage1_backward, apply_grad = @stage1_apply_grad}
  func.func @stage0_forward(%x: tensor<4x4xf32>, %w0: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {mesh.mesh = @mesh0} {
    %h = lax.dot_general %x, %w0 {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    func.return %h : tensor<4x8xf32>
  }
  func.func @stage1_forward(%h: tensor<4x8xf32>, %w1: tensor<8x2xf32>) -> tensor<4x2xf32> attributes {mesh.mesh = @mesh1} {
    %y = lax.dot_general %h, %w1 {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
    func.return %y : tensor<4x2xf32>
  }
  func.func @stage1_backward(%h: tensor<4x8xf32>, %unused: tensor<4x8xf32>, %w1: tensor<8x2xf32>, %y: tensor<4x2xf32>) -> (tensor<4x8xf32>, tensor<8x2xf32>) attributes {mesh.mesh = @mesh1} {
    %g = lax.sub %y, %y {sharding.specs = [#sharding.spec<[S0, R]>]} : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x2xf32>
    %gh = lax.dot_general %g, %w1 {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [1], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<4x2xf32>, tensor<8x2xf32>) -> tensor<4x8xf32>
    %gw1 = lax.dot_general %h, %g {dimension_numbers = #lax.dot<lhs_contracting = [0], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<4x8xf32>, tensor<4x2xf32>) -> tensor<8x2xf32>
    func.return %gh, %gw1 : tensor<4x8xf32>, tensor<8x2xf32>
  }
  func.func @stage0_backward(%gh: tensor<4x8xf32>, %x: tensor<4x4xf32>) -> tensor<4x8xf32> attributes {mesh.mesh = @mesh0} {
    %gw0 = lax.dot_general %x, %gh {dimension_numbers = #lax.dot<lhs_contracting = [0], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    func.return %gw0 : tensor<4x8xf32>
  }
  func.func @stage0_apply_grad(%w0: tensor<4x8xf32>, %g: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {mesh.mesh = @mesh0} {
    %n = lax.sub %w0, %g : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    func.return %n : tensor<4x8xf32>
  }
  func.func @stage1_apply_grad(%w1: tensor<8x2xf32>, %g: tensor<8x2xf32>) -> tensor<8x2xf32> attributes {mesh.mesh = @mesh1} {
    %n = lax.sub %w1, %g : (tensor<8x2xf32>, tensor<8x2xf32>) -> tensor<8x2xf32>
    func.return %n : tensor<8x2xf32>
  }
  func.func @main(%w0: tensor<4x8xf32>, %w1: tensor<8x2xf32>, %x: tensor<4x4xf32>) -> (tensor<4x8xf32>, tensor<8x2xf32>) {
    %h = func.call @stage0_forward(%x, %w0) : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %y = func.call @stage1_forward(%h, %w1) : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
    %b1:2 = func.call @stage1_backward(%h, %h, %w1, %y) : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8x2xf32>, tensor<4x2xf32>) -> (tensor<4x8xf32>, tensor<8x2xf32>)
    %g0 = func.call @stage0_backward(%b1#0, %x) : (tensor<4x8xf32>, tensor<4x4xf32>) -> tensor<4x8xf32>
    %n0 = func.call @stage0_apply_grad(%w0, %g0) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %n1 = func.call @stage1_apply_grad(%w1, %b1#1) : (tensor<8x2xf32>, tensor<8x2xf32>) -> tensor<8x2xf32>
    func.return %n0, %n1 : tensor<4x8xf32>, tensor<8x2xf32>
  }
}
