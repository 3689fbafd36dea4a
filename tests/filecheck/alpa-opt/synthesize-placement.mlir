// RUN: alpa-opt %s -p 'synthesize-placement{system=custom-2x4}' | filecheck %s
// RUN: not alpa-opt %s -p 'synthesize-placement{system=gcp-a100-16x2}' 2>&1 | filecheck %s --check-prefix=SIZE
// RUN: not alpa-opt %s -p 'synthesize-placement{system=custom-2x4 max-size=0}' 2>&1 | filecheck %s --check-prefix=LIMIT
// RUN: not alpa-opt %s -p 'synthesize-placement' 2>&1 | filecheck %s --check-prefix=NOSYS

// An all-reduce of 4 MB per device over mesh axis 0 (2 devices), on 2 nodes of 4 devices
// with a 10x slower network: the row-major order puts axis 0 across the nodes; the chosen
// placement keeps it inside a node (axis 0 on the device level, axis 1 split 2 x 2).
builtin.module {
  mesh.logical_mesh @mesh {shape = array<i64: 2, 4>, devices = array<i64: 0, 1, 2, 3, 4, 5, 6, 7>, alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}
  func.func @main(%x: tensor<8192x1024xf32> {sharding.spec = #sharding.spec<[S01, R]>}) -> (tensor<8192x1024xf32> {sharding.spec = #sharding.spec<[S01, R]>}) attributes {mesh.mesh = @mesh} {
    %0 = sharding.all_reduce %x {axes = array<i64: 0>, sharding.specs = [#sharding.spec<[S01, R]>]} : tensor<8192x1024xf32>
    func.return %0 : tensor<8192x1024xf32>
  }
}

// CHECK:      mesh.logical_mesh @mesh {shape = array<i64: 2, 4>, devices = array<i64: 0, 1, 4, 5, 2, 3, 6, 7>
// CHECK-SAME:   placement = [array<i64: 1, 2>, array<i64: 2, 2>], p2.system = "custom-2x4", p2.predicted_time = {{[0-9.e+-]+}}}
// CHECK:      sharding.all_reduce %x {axes = array<i64: 0>

// SIZE: alpa-opt: error: synthesize-placement: mesh @mesh of shape [2, 4] has 8 devices but system 'gcp-a100-16x2' has 32
// LIMIT: alpa-opt: error: synthesize-placement: max-size 0 must be between 1 and 10
// NOSYS: alpa-opt: error: synthesize-placement: no system for mesh @mesh; give the option system=PRESET (e.g. gcp-a100-16x4) or a mesh.cluster
