// RUN: not alpa-opt %s --split-input-file --load-plugin=alpa_testing_passes -p test-rename-funcs 2>&1 | filecheck %s

// Each chunk is processed on its own; an error is reported at its line in
// this file, and the chunks after it are still processed.

builtin.module {
  func.func @first() {
    func.return
  }
}

// CHECK:      builtin.module {
// CHECK-NEXT:   func.func @renamed_first() {
// CHECK-NEXT:     func.return
// CHECK-NEXT:   }
// CHECK-NEXT: }
// CHECK-NEXT: // -----

// -----

builtin.module {
  func.func @second() {
    func.return %
  }
}

// CHECK-NEXT: alpa-opt: error: {{.*}}split-input-file.mlir:[[# @LINE - 4]]:17: Expected suffix identifier after '%'
// CHECK-NEXT: // -----

// -----

func.func @third() {
  func.return
}

// CHECK-NEXT: builtin.module {
// CHECK-NEXT:   func.func @renamed_third() {
