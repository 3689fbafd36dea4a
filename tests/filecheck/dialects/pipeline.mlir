// RUN: alpa-opt %s | alpa-opt | filecheck %s

// The pipeline dialect round-trips: a plan, its stages and transfers, and the
// per-mesh programs (run, send, recv, broadcast, free) that emit-instructions
// writes (this is its output for tests/filecheck/alpa-opt/emit-instructions.mlir).
builtin.module {
  mesh.logical_mesh @mesh0 {shape = array<i64: 1, 2>, devices = array<i64: 0, 1>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 1.0>}
  mesh.logical_mesh @mesh1 {shape = array<i64: 2, 1>, devices = array<i64: 2, 3>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 1.0>}
  pipeline.plan @plan {stages = [@stage0, @stage1], num_micro_batches = 2, schedule = "1f1b"}
  pipeline.stage @stage0 {layers = array<i64: 0, 0>, mesh = @mesh0, forward = @stage0_forward, backward = @stage0_backward, apply_grad = @stage0_apply_grad}
  pipeline.stage @stage1 {layers = array<i64: 1, 1>, mesh = @mesh1, forward = @stage1_forward, backward = @stage1_backward, apply_grad = @stage1_apply_grad}
  pipeline.transfer @t0 {value = "stage0_forward:0", src_mesh = @mesh0, dst_mesh = @mesh1, src_spec = #sharding.spec<[S1, R]>, dst_spec = #sharding.spec<[R, R]>}
  pipeline.transfer @t1 {value = "stage1_backward:0", src_mesh = @mesh1, dst_mesh = @mesh0, src_spec = #sharding.spec<[S0, R]>, dst_spec = #sharding.spec<[S1, R]>}
  pipeline.transfer @t2 {value = "stage0_backward:1", src_mesh = @mesh0, dst_mesh = @mesh1, src_spec = #sharding.spec<[R, R]>, dst_spec = #sharding.spec<[S0, R]>}
  func.func @stage0_forward(%w: tensor<2x4xf32>, %x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) attributes {mesh.mesh = @mesh0} {
    func.return %x, %x : tensor<2x4xf32>, tensor<2x4xf32>
  }
  func.func @stage1_forward(%h: tensor<2x4xf32>, %w: tensor<2x4xf32>, %y: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) attributes {mesh.mesh = @mesh1} {
    func.return %h, %y : tensor<2x4xf32>, tensor<2x4xf32>
  }
  func.func @stage1_backward(%a: tensor<2x4xf32>, %h: tensor<2x4xf32>, %w: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) attributes {mesh.mesh = @mesh1} {
    func.return %a, %h : tensor<2x4xf32>, tensor<2x4xf32>
  }
  func.func @stage0_backward(%g: tensor<2x4xf32>, %x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) attributes {mesh.mesh = @mesh0} {
    func.return %g, %x : tensor<2x4xf32>, tensor<2x4xf32>
  }
  func.func @stage0_apply_grad(%w: tensor<2x4xf32>, %g: tensor<2x4xf32>) -> tensor<2x4xf32> attributes {mesh.mesh = @mesh0} {
    func.return %g : tensor<2x4xf32>
  }
  func.func @stage1_apply_grad(%w: tensor<2x4xf32>, %g: tensor<2x4xf32>, %tied: tensor<2x4xf32>) -> tensor<2x4xf32> attributes {mesh.mesh = @mesh1} {
    func.return %g : tensor<2x4xf32>
  }
  func.func @main(%w0: tensor<2x4xf32>, %w1: tensor<2x4xf32>, %x: tensor<2x4xf32>, %y: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) {
    %a, %a_1 = func.call @stage0_forward(%w0, %x) : (tensor<2x4xf32>, tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>)
    %b, %b_1 = func.call @stage1_forward(%a, %w1, %y) : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>)
    %c, %c_1 = func.call @stage1_backward(%b_1, %a, %w1) : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>)
    %d, %d_1 = func.call @stage0_backward(%c, %a_1) : (tensor<2x4xf32>, tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>)
    %e = func.call @stage0_apply_grad(%w0, %d) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %f = func.call @stage1_apply_grad(%w1, %c_1, %d_1) : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    func.return %e, %f, %b : tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
  }
  pipeline.program {mesh = @mesh0} {
    pipeline.run {function = @stage0_forward, micro_batch = 0}
    pipeline.send {transfer = @t0, micro_batch = 0}
    pipeline.free {buffers = ["stage0_forward:0"], micro_batch = 0}
    pipeline.run {function = @stage0_forward, micro_batch = 1}
    pipeline.send {transfer = @t0, micro_batch = 1}
    pipeline.free {buffers = ["stage0_forward:0"], micro_batch = 1}
    pipeline.recv {transfer = @t1, micro_batch = 0}
    pipeline.run {function = @stage0_backward, micro_batch = 0}
    pipeline.free {buffers = ["stage0_forward:1", "t1"], micro_batch = 0}
    pipeline.recv {transfer = @t1, micro_batch = 1}
    pipeline.run {function = @stage0_backward, micro_batch = 1}
    pipeline.free {buffers = ["stage0_forward:1", "t1"], micro_batch = 1}
    pipeline.send {transfer = @t2}
    pipeline.free {buffers = ["stage0_backward:1"]}
    pipeline.run {function = @stage0_apply_grad}
    pipeline.free {buffers = ["stage0_backward:0"]}
  }
  pipeline.program {mesh = @mesh1} {
    pipeline.recv {transfer = @t0, micro_batch = 0}
    pipeline.broadcast {transfer = @t0, micro_batch = 0}
    pipeline.run {function = @stage1_forward, micro_batch = 0}
    pipeline.run {function = @stage1_backward, micro_batch = 0}
    pipeline.free {buffers = ["t0", "stage1_forward:1"], micro_batch = 0}
    pipeline.send {transfer = @t1, micro_batch = 0}
    pipeline.free {buffers = ["stage1_backward:0"], micro_batch = 0}
    pipeline.recv {transfer = @t0, micro_batch = 1}
    pipeline.broadcast {transfer = @t0, micro_batch = 1}
    pipeline.run {function = @stage1_forward, micro_batch = 1}
    pipeline.run {function = @stage1_backward, micro_batch = 1}
    pipeline.free {buffers = ["t0", "stage1_forward:1"], micro_batch = 1}
    pipeline.send {transfer = @t1, micro_batch = 1}
    pipeline.free {buffers = ["stage1_backward:0"], micro_batch = 1}
    pipeline.recv {transfer = @t2}
    pipeline.run {function = @stage1_apply_grad}
    pipeline.free {buffers = ["stage1_backward:1", "t2"]}
  }
}

// CHECK:      builtin.module {
// CHECK-NEXT: mesh.logical_mesh @mesh0 {shape = array<i64: 1, 2>, devices = array<i64: 0, 1>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 1.0>}
// CHECK-NEXT: mesh.logical_mesh @mesh1 {shape = array<i64: 2, 1>, devices = array<i64: 2, 3>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 1.0>}
// CHECK-NEXT: pipeline.plan @plan {stages = [@stage0, @stage1], num_micro_batches = 2, schedule = "1f1b"}
// CHECK-NEXT: pipeline.stage @stage0 {layers = array<i64: 0, 0>, mesh = @mesh0, forward = @stage0_forward, backward = @stage0_backward, apply_grad = @stage0_apply_grad}
// CHECK-NEXT: pipeline.stage @stage1 {layers = array<i64: 1, 1>, mesh = @mesh1, forward = @stage1_forward, backward = @stage1_backward, apply_grad = @stage1_apply_grad}
// CHECK-NEXT: pipeline.transfer @t0 {value = "stage0_forward:0", src_mesh = @mesh0, dst_mesh = @mesh1, src_spec = #sharding.spec<[S1, R]>, dst_spec = #sharding.spec<[R, R]>}
// CHECK-NEXT: pipeline.transfer @t1 {value = "stage1_backward:0", src_mesh = @mesh1, dst_mesh = @mesh0, src_spec = #sharding.spec<[S0, R]>, dst_spec = #sharding.spec<[S1, R]>}
// CHECK-NEXT: pipeline.transfer @t2 {value = "stage0_backward:1", src_mesh = @mesh0, dst_mesh = @mesh1, src_spec = #sharding.spec<[R, R]>, dst_spec = #sharding.spec<[S0, R]>}
// CHECK-NEXT: func.func @stage0_forward(%w: tensor<2x4xf32>, %x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) attributes {mesh.mesh = @mesh0} {
// CHECK-NEXT: func.return %x, %x : tensor<2x4xf32>, tensor<2x4xf32>
// CHECK-NEXT: }
// CHECK-NEXT: func.func @stage1_forward(%h: tensor<2x4xf32>, %w: tensor<2x4xf32>, %y: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) attributes {mesh.mesh = @mesh1} {
// CHECK-NEXT: func.return %h, %y : tensor<2x4xf32>, tensor<2x4xf32>
// CHECK-NEXT: }
// CHECK-NEXT: func.func @stage1_backward(%a: tensor<2x4xf32>, %h: tensor<2x4xf32>, %w: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) attributes {mesh.mesh = @mesh1} {
// CHECK-NEXT: func.return %a, %h : tensor<2x4xf32>, tensor<2x4xf32>
// CHECK-NEXT: }
// CHECK-NEXT: func.func @stage0_backward(%g: tensor<2x4xf32>, %x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) attributes {mesh.mesh = @mesh0} {
// CHECK-NEXT: func.return %g, %x : tensor<2x4xf32>, tensor<2x4xf32>
// CHECK-NEXT: }
// CHECK-NEXT: func.func @stage0_apply_grad(%w: tensor<2x4xf32>, %g: tensor<2x4xf32>) -> tensor<2x4xf32> attributes {mesh.mesh = @mesh0} {
// CHECK-NEXT: func.return %g : tensor<2x4xf32>
// CHECK-NEXT: }
// CHECK-NEXT: func.func @stage1_apply_grad(%w: tensor<2x4xf32>, %g: tensor<2x4xf32>, %tied: tensor<2x4xf32>) -> tensor<2x4xf32> attributes {mesh.mesh = @mesh1} {
// CHECK-NEXT: func.return %g : tensor<2x4xf32>
// CHECK-NEXT: }
// CHECK-NEXT: func.func @main(%w0: tensor<2x4xf32>, %w1: tensor<2x4xf32>, %x: tensor<2x4xf32>, %y: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) {
// CHECK-NEXT: %a, %a_1 = func.call @stage0_forward(%w0, %x) : (tensor<2x4xf32>, tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>)
// CHECK-NEXT: %b, %b_1 = func.call @stage1_forward(%a, %w1, %y) : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>)
// CHECK-NEXT: %c, %c_1 = func.call @stage1_backward(%b_1, %a, %w1) : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>)
// CHECK-NEXT: %d, %d_1 = func.call @stage0_backward(%c, %a_1) : (tensor<2x4xf32>, tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>)
// CHECK-NEXT: %e = func.call @stage0_apply_grad(%w0, %d) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: %f = func.call @stage1_apply_grad(%w1, %c_1, %d_1) : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: func.return %e, %f, %b : tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
// CHECK-NEXT: }
// CHECK-NEXT: pipeline.program {mesh = @mesh0} {
// CHECK-NEXT: pipeline.run {function = @stage0_forward, micro_batch = 0}
// CHECK-NEXT: pipeline.send {transfer = @t0, micro_batch = 0}
// CHECK-NEXT: pipeline.free {buffers = ["stage0_forward:0"], micro_batch = 0}
// CHECK-NEXT: pipeline.run {function = @stage0_forward, micro_batch = 1}
// CHECK-NEXT: pipeline.send {transfer = @t0, micro_batch = 1}
// CHECK-NEXT: pipeline.free {buffers = ["stage0_forward:0"], micro_batch = 1}
// CHECK-NEXT: pipeline.recv {transfer = @t1, micro_batch = 0}
// CHECK-NEXT: pipeline.run {function = @stage0_backward, micro_batch = 0}
// CHECK-NEXT: pipeline.free {buffers = ["stage0_forward:1", "t1"], micro_batch = 0}
// CHECK-NEXT: pipeline.recv {transfer = @t1, micro_batch = 1}
// CHECK-NEXT: pipeline.run {function = @stage0_backward, micro_batch = 1}
// CHECK-NEXT: pipeline.free {buffers = ["stage0_forward:1", "t1"], micro_batch = 1}
// CHECK-NEXT: pipeline.send {transfer = @t2}
// CHECK-NEXT: pipeline.free {buffers = ["stage0_backward:1"]}
// CHECK-NEXT: pipeline.run {function = @stage0_apply_grad}
// CHECK-NEXT: pipeline.free {buffers = ["stage0_backward:0"]}
// CHECK-NEXT: }
// CHECK-NEXT: pipeline.program {mesh = @mesh1} {
// CHECK-NEXT: pipeline.recv {transfer = @t0, micro_batch = 0}
// CHECK-NEXT: pipeline.broadcast {transfer = @t0, micro_batch = 0}
// CHECK-NEXT: pipeline.run {function = @stage1_forward, micro_batch = 0}
// CHECK-NEXT: pipeline.run {function = @stage1_backward, micro_batch = 0}
// CHECK-NEXT: pipeline.free {buffers = ["t0", "stage1_forward:1"], micro_batch = 0}
// CHECK-NEXT: pipeline.send {transfer = @t1, micro_batch = 0}
// CHECK-NEXT: pipeline.free {buffers = ["stage1_backward:0"], micro_batch = 0}
// CHECK-NEXT: pipeline.recv {transfer = @t0, micro_batch = 1}
// CHECK-NEXT: pipeline.broadcast {transfer = @t0, micro_batch = 1}
// CHECK-NEXT: pipeline.run {function = @stage1_forward, micro_batch = 1}
// CHECK-NEXT: pipeline.run {function = @stage1_backward, micro_batch = 1}
// CHECK-NEXT: pipeline.free {buffers = ["t0", "stage1_forward:1"], micro_batch = 1}
// CHECK-NEXT: pipeline.send {transfer = @t1, micro_batch = 1}
// CHECK-NEXT: pipeline.free {buffers = ["stage1_backward:0"], micro_batch = 1}
// CHECK-NEXT: pipeline.recv {transfer = @t2}
// CHECK-NEXT: pipeline.run {function = @stage1_apply_grad}
// CHECK-NEXT: pipeline.free {buffers = ["stage1_backward:1", "t2"]}
// CHECK-NEXT: }
// CHECK-NEXT: }
