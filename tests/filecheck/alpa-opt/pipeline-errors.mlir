// RUN: not alpa-opt %s -p merge-trivial-op 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not alpa-opt %s --load-plugin=alpa_sample_plugin -p 'sample-count-ops{prefx=a}' 2>&1 | filecheck %s --check-prefix=OPTION
// RUN: not alpa-opt %s --load-plugin=alpa_testing_passes -p 'test-rename-funcs{prefix=a,b}' 2>&1 | filecheck %s --check-prefix=TYPED
// RUN: not alpa-opt %s --pass-pipeline='builtin.module(merge-trivial-ops' 2>&1 | filecheck %s --check-prefix=MALFORMED
// RUN: not alpa-opt %s --pass-pipeline='builtin.module(func.func(merge-trivial-ops))' 2>&1 | filecheck %s --check-prefix=NESTED

builtin.module {
}

// UNKNOWN: alpa-opt: error: unknown pass 'merge-trivial-op' (did you mean 'merge-trivial-ops'?); known passes: {{.*}}merge-trivial-ops
// OPTION: alpa-opt: error: unknown option 'prefx' of pass 'sample-count-ops'; its options: prefix
// TYPED: alpa-opt: error: option 'prefix' of pass 'test-rename-funcs' expects str, got 'a,b'
// MALFORMED: alpa-opt: error: malformed pipeline at column 33: expected ')', found the end of the pipeline
// NESTED: alpa-opt: error: malformed pipeline at column 16: nested pipeline 'func.func(...)' is not supported
