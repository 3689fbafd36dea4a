// RUN: alpa-opt %s --mlir-print-debuginfo | filecheck %s
// RUN: alpa-opt %s --load-plugin=alpa_sample_plugin -p sample-count-ops --timing 2>&1 >/dev/null | filecheck %s --check-prefix=TIMING
// RUN: alpa-opt %s --load-plugin=alpa_sample_plugin -p 'sample-count-ops,sample-count-ops{prefix="two words"}' --print-pipeline | filecheck %s --check-prefix=PIPELINE

builtin.module {
  func.func @f() {
    func.return
  }
}

// CHECK:      func.func @f() {
// CHECK-NEXT:   func.return loc("{{.*}}debuginfo-timing.mlir":[[# @LINE - 5]]:5)
// CHECK-NEXT: } loc("{{.*}}debuginfo-timing.mlir":[[# @LINE - 7]]:3)

// TIMING:      Execution time report
// TIMING:      ----Wall Time----  ----Name----
// TIMING-NEXT: {{[0-9.]+}} ({{ *[0-9.]+}}%)  Parser
// TIMING-NEXT: {{[0-9.]+}} ({{ *[0-9.]+}}%)  sample-count-ops
// TIMING-NEXT: {{[0-9.]+}} ({{ *[0-9.]+}}%)  (verifier)
// TIMING-NEXT: {{[0-9.]+}} ({{ *[0-9.]+}}%)  Output
// TIMING-NEXT: {{[0-9.]+}} (100.0%)  Total

// PIPELINE: builtin.module(sample-count-ops{prefix=sample},sample-count-ops{prefix="two words"})
