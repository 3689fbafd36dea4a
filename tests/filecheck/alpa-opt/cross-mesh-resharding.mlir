// RUN: alpa-opt %s -p 'cross-mesh-resharding' | filecheck %s
// RUN: alpa-opt %s -p 'cross-mesh-resharding{local-all-gather=false}' | filecheck %s --check-prefix=PLAIN

// An activation split over the columns of a 1x2 mesh, needed replicated on the
// next stage's 1x2 mesh. Plain: each destination device receives the whole
// tensor (a half from each source device), 512 bytes cross. Rewritten: each
// destination device receives one half of the rows (from both source devices),
// 256 bytes cross, then the destination mesh all-gathers over its axis 1.
// The @main argument needs no transfer.
builtin.module {
  mesh.logical_mesh @mesh0 {shape = array<i64: 1, 2>, devices = array<i64: 0, 1>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}
  mesh.logical_mesh @mesh1 {shape = array<i64: 1, 2>, devices = array<i64: 2, 3>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}
  func.func @stage0_forward(%x: tensor<8x8xf32>) -> (tensor<8x8xf32> {sharding.spec = #sharding.spec<[R, S1]>}) attributes {mesh.mesh = @mesh0} {
    func.return %x : tensor<8x8xf32>
  }
  func.func @stage1_forward(%a: tensor<8x8xf32>, %b: tensor<8x8xf32>) -> tensor<8x8xf32> attributes {mesh.mesh = @mesh1} {
    func.return %a : tensor<8x8xf32>
  }
  func.func @main(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %0 = func.call @stage0_forward(%arg0) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %1 = func.call @stage1_forward(%0, %arg0) : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    func.return %1 : tensor<8x8xf32>
  }
}

// CHECK:      pipeline.transfer @t0 {value = "stage0_forward:0", src_mesh = @mesh0, dst_mesh = @mesh1,
// CHECK-SAME:   src_spec = #sharding.spec<[R, S1]>, dst_spec = #sharding.spec<[R, R]>,
// CHECK-SAME:   tiles = [{src = 0 : i64, dst = array<i64: 2>, slice = [array<i64: 0, 4>, array<i64: 0, 4>], bytes = 64 : i64},
// CHECK-SAME:            {src = 1 : i64, dst = array<i64: 2>, slice = [array<i64: 0, 4>, array<i64: 4, 8>], bytes = 64 : i64},
// CHECK-SAME:            {src = 0 : i64, dst = array<i64: 3>, slice = [array<i64: 4, 8>, array<i64: 0, 4>], bytes = 64 : i64},
// CHECK-SAME:            {src = 1 : i64, dst = array<i64: 3>, slice = [array<i64: 4, 8>, array<i64: 4, 8>], bytes = 64 : i64}],
// CHECK-SAME:   pipeline.cross_bytes = 256, pipeline.recv_spec = #sharding.spec<[S1, R]>}
// CHECK-NOT:  pipeline.transfer
// CHECK:      func.func @stage0_forward

// PLAIN:      pipeline.transfer @t0 {{.*}} tiles = [
// PLAIN-SAME:   {src = 0 : i64, dst = array<i64: 2>, slice = [array<i64: 0, 8>, array<i64: 0, 4>], bytes = 128 : i64},
// PLAIN-SAME:   {src = 1 : i64, dst = array<i64: 2>, slice = [array<i64: 0, 8>, array<i64: 4, 8>], bytes = 128 : i64},
// PLAIN-SAME:   {src = 0 : i64, dst = array<i64: 3>, slice = [array<i64: 0, 8>, array<i64: 0, 4>], bytes = 128 : i64},
// PLAIN-SAME:   {src = 1 : i64, dst = array<i64: 3>, slice = [array<i64: 0, 8>, array<i64: 4, 8>], bytes = 128 : i64}],
// PLAIN-SAME:   pipeline.cross_bytes = 512}
// PLAIN-NOT:  pipeline.transfer
