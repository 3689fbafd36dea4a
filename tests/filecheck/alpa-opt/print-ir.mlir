// RUN: alpa-opt %s --load-plugin=alpa_testing_passes -p 'test-rename-funcs{prefix=a_},test-rename-funcs{prefix=b_}' --print-ir-before=test-rename-funcs --print-ir-after=test-rename-funcs 2>&1 | filecheck %s
// RUN: alpa-opt %s --load-plugin=alpa_testing_passes --pass-pipeline='builtin.module(test-rename-funcs)' --print-ir-after-all 2>&1 | filecheck %s --check-prefix=ALL

builtin.module {
  func.func @f() {
    func.return
  }
}

// CHECK:      // -----// IR Dump Before test-rename-funcs //----- //
// CHECK-NEXT: builtin.module {
// CHECK-NEXT:   func.func @f() {
// CHECK:      // -----// IR Dump After test-rename-funcs //----- //
// CHECK-NEXT: builtin.module {
// CHECK-NEXT:   func.func @a_f() {
// CHECK:      // -----// IR Dump Before test-rename-funcs //----- //
// CHECK:        func.func @a_f() {
// CHECK:      // -----// IR Dump After test-rename-funcs //----- //
// CHECK:        func.func @b_a_f() {
// The final output comes last, on stdout.
// CHECK:      builtin.module {
// CHECK-NEXT:   func.func @b_a_f() {
// CHECK-NOT:  IR Dump

// ALL:      // -----// IR Dump After test-rename-funcs //----- //
// ALL-NEXT: builtin.module {
// ALL-NEXT:   func.func @renamed_f() {
// ALL-NOT:  IR Dump Before
