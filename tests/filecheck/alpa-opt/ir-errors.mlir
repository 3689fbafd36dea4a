// RUN: not alpa-opt %s --split-input-file --load-plugin=alpa_testing_passes 2>&1 | filecheck %s

// One located line per bad chunk: syntax, unknown dialect, unknown op, verifier.

builtin.module {
  func.func @f() {
    func.return %
  }
}
// CHECK: ir-errors.mlir:[[# @LINE - 3]]:17: Expected suffix identifier after '%'

// -----
builtin.module {
  foo.bar
}
// CHECK: ir-errors.mlir:[[# @LINE - 2]]:3: unknown dialect 'foo' in operation 'foo.bar'

// -----
builtin.module {
  %0 = arith.frobnicate
}
// CHECK: ir-errors.mlir:[[# @LINE - 2]]:8: unknown operation 'arith.frobnicate'

// -----
builtin.module {
  func.func @g(%a: i32) -> i64 {
    func.return %a : i32
  }
}
// CHECK: ir-errors.mlir:[[# @LINE - 3]]:5: operation 'func.return' does not verify: Expected arguments to have the same types as the function output types
// CHECK-NOT: Traceback
