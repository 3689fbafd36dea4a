// RUN: alpa-opt %s -p 'cluster-operators{layers=2},construct-stages{cluster=local-cpu progress=false num-micro-batches=2}' | filecheck %s
// RUN: alpa-opt %s -p 'cluster-operators{layers=2},construct-stages{cluster=local-cpu progress=false num-micro-batches=2 physical-space=manual submeshes=1x4}' | filecheck %s --check-prefix=FOUR

// The stage DP on the 8 local devices (lit gives JAX 8 CPU devices). The
// step's loss (%4) is dead (the step returns only the new state), so the
// planner erases it before each ILP, as XLA does before Alpa's pass: no plan
// of this tiny step then moves anything, and one stage on all 8 devices (no
// pipeline bubble) is the cheapest (latency 2.53e-7; 2.93e-7 for the best
// plan on 4-device submeshes below). While the dead loss was priced, every
// multi-device plan of both layers paid its all-reduce (1e-5), and the DP
// split the layers into 2 stages (6.1e-7).
//
// With 4-device submeshes only (prefix FOUR), each layer becomes a stage on a submesh
// of 4 devices; the stages are outlined into per-micro-batch forward
// functions and an apply-grad function per mesh that updates a parameter,
// called from @main.
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

// CHECK:      mesh.cluster @"local-cpu" {levels = [#mesh.level<"device" x 8
// CHECK-NEXT: mesh.logical_mesh @mesh0 {shape = array<i64: 1, 8>, devices = array<i64: 0, 1, 2, 3, 4, 5, 6, 7>
// CHECK-NEXT: pipeline.plan @plan {stages = [@stage0], num_micro_batches = 2, schedule = "1f1b", construct_stages.latency = {{[0-9.e+-]+}}}
// CHECK-NEXT: pipeline.stage @stage0 {layers = array<i64: 0, 1>, mesh = @mesh0, forward = @stage0_forward, backward = @stage0_backward, apply_grad = @stage0_apply_grad}
// CHECK:      func.func @stage0_forward({{.*}}mesh.mesh = @mesh0, alpa.batch_args = array<i64: 0>, pipeline.per_micro_batch
// CHECK:      func.func @stage0_backward({{.*}}mesh.mesh = @mesh0
// CHECK:      func.func @stage0_apply_grad({{.*}}mesh.mesh = @mesh0
// CHECK:      func.func @main(
// CHECK:        func.call @stage0_forward
// CHECK:        func.call @stage0_backward
// CHECK:        func.call @stage0_apply_grad

// FOUR:      mesh.cluster @"local-cpu" {levels = [#mesh.level<"device" x 8
// FOUR-NEXT: mesh.logical_mesh @mesh0 {shape = array<i64: 2, 2>, devices = array<i64: 0, 1, 2, 3>
// FOUR-NEXT: mesh.logical_mesh @mesh1 {shape = array<i64: 1, 4>, devices = array<i64: 4, 5, 6, 7>
// FOUR-NEXT: pipeline.plan @plan {stages = [@stage0, @stage1], num_micro_batches = 2, schedule = "1f1b", construct_stages.latency = {{[0-9.e+-]+}}}
// FOUR-NEXT: pipeline.stage @stage0 {layers = array<i64: 0, 0>, mesh = @mesh0, forward = @stage0_forward}
// FOUR-NEXT: pipeline.stage @stage1 {layers = array<i64: 1, 1>, mesh = @mesh1, forward = @stage1_forward, backward = @stage1_backward, apply_grad = @stage1_apply_grad}
// FOUR:      func.func @stage0_forward({{.*}}mesh.mesh = @mesh0, alpa.batch_args = array<i64: 0>, pipeline.per_micro_batch
// FOUR:      func.func @stage1_forward({{.*}}mesh.mesh = @mesh1
// FOUR:      func.func @stage1_backward({{.*}}mesh.mesh = @mesh1
// FOUR:      func.func @stage1_apply_grad({{.*}}mesh.mesh = @mesh1
// FOUR:      func.func @main(
// FOUR:        func.call @stage0_forward
// FOUR:        func.call @stage1_forward
// FOUR:        func.call @stage1_backward
// FOUR:        func.call @stage1_apply_grad
