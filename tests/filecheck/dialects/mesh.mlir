// RUN: alpa-opt %s | alpa-opt | filecheck %s

// The mesh dialect round-trips: a cluster of levels (its device memory, peak
// FLOPs and discardable attributes), logical meshes with and without axis
// names, and a function placed on a mesh.
builtin.module {
  mesh.cluster @"two-hosts" {levels = [#mesh.level<"host" x 2, bandwidth = 12500000000.0, latency = 5.0e-06>, #mesh.level<"device" x 4, bandwidth = 150000000000.0, latency = 1.0e-06>], device_memory = 17179869184.0, peak_flops = 125000000000000.0, device_name = "v100", mesh.hbm_bandwidth = 900000000000.0}
  mesh.logical_mesh @mesh0 {shape = array<i64: 2, 2>, devices = array<i64: 0, 1, 2, 3>, alpha = array<f64: 1.0e-05, 1.0e-05>, beta = array<f64: 1.0e-10, 1.0e-10>, axis_names = ["m0", "m1"]}
  mesh.logical_mesh @mesh1 {shape = array<i64: 1, 4>, devices = array<i64: 4, 5, 6, 7>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}
  func.func @main(%x: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {mesh.mesh = @mesh0} {
    func.return %x : tensor<4x4xf32>
  }
}

// CHECK:      builtin.module {
// CHECK-NEXT: mesh.cluster @"two-hosts" {levels = [#mesh.level<"host" x 2, bandwidth = 12500000000.0, latency = 5.0e-06>, #mesh.level<"device" x 4, bandwidth = 150000000000.0, latency = 1.0e-06>], device_memory = 17179869184.0, peak_flops = 125000000000000.0, device_name = "v100", mesh.hbm_bandwidth = 900000000000.0}
// CHECK-NEXT: mesh.logical_mesh @mesh0 {shape = array<i64: 2, 2>, devices = array<i64: 0, 1, 2, 3>, alpha = array<f64: 1.0e-05, 1.0e-05>, beta = array<f64: 1.0e-10, 1.0e-10>, axis_names = ["m0", "m1"]}
// CHECK-NEXT: mesh.logical_mesh @mesh1 {shape = array<i64: 1, 4>, devices = array<i64: 4, 5, 6, 7>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}
// CHECK-NEXT: func.func @main(%x: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {mesh.mesh = @mesh0} {
// CHECK-NEXT: func.return %x : tensor<4x4xf32>
// CHECK-NEXT: }
// CHECK-NEXT: }
