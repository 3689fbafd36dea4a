// RUN: rm -rf %t && mkdir -p %t
// RUN: not alpa-opt %s --load-plugin=alpa_testing_passes -p 'test-rename-funcs,test-fail{message="no plan"}' --reproducer-dir=%t 2>&1 | filecheck %s
// RUN: cat %t/test-fail-*.reproducer.mlir | filecheck %s --check-prefix=FILE
// RUN: not alpa-opt %t/test-fail-*.reproducer.mlir --run-reproducer --load-plugin=alpa_testing_passes --reproducer-dir=%t/again 2>&1 | filecheck %s

// A failing pass names itself, its error and the reproducer, which holds the
// input of that pass and re-runs with --run-reproducer.

builtin.module {
  func.func @f() {
    func.return
  }
}

// CHECK: alpa-opt: error: pass 'test-fail' failed: RuntimeError: no plan (reproducer: {{.*}}test-fail-{{.*}}.reproducer.mlir)

// FILE:      // alpa_ir reproducer: pass 'test-fail' failed: RuntimeError: no plan
// FILE-NEXT: // Run it again with: alpa-opt {{.*}} --run-reproducer
// FILE-NEXT: // alpa-opt-reproducer: --pass-pipeline='builtin.module(test-fail{message="no plan"})' --load-plugin=alpa_testing_passes
// FILE-NEXT: builtin.module {
// FILE-NEXT:   func.func @renamed_f() {
