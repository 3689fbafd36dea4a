// RUN: alpa-opt --list-passes --load-plugin=alpa_sample_plugin --load-plugin=alpa_testing_passes | filecheck %s

// Passes are listed by name with their summary and options (type and default);
// plugin passes name their plugin.

// CHECK:      Available passes
// CHECK:      merge-trivial-ops
// CHECK:      sample-count-ops  [plugin alpa_sample_plugin]
// CHECK-NEXT:     Count the ops nested in the module into the module attribute
// CHECK-NEXT:     prefix: str = sample  -- prefix of the attribute name
// CHECK:      test-fail  [plugin alpa_testing_passes]
// CHECK-NEXT:     Raise a RuntimeError (an internal bug of a pass).
// CHECK-NEXT:     message: str = boom
