// RUN: alpa-opt %s --split-input-file -p split-conditionals | filecheck %s

// A cond whose two results are computed apart (an update of a and one of b,
// as two stages' states would be): one cond each, on the same predicate.
builtin.module {
  func.func @main(%a: tensor<2xf32>, %b: tensor<3xf32>, %p: tensor<f32>) -> (tensor<2xf32>, tensor<3xf32>) {
    %0 = lax.constant 0.0 : tensor<f32>
    %1 = lax.gt %p, %0 : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %2 = lax.convert_element_type %1 {new_dtype = i32, weak_type = false} : (tensor<i1>) -> tensor<i32>
    %3, %4 = lax.cond %2, %a, %b ({
    ^bb0(%5: tensor<2xf32>, %6: tensor<3xf32>):
      lax.return %5, %6 : tensor<2xf32>, tensor<3xf32>
    }, {
    ^bb0(%7: tensor<2xf32>, %8: tensor<3xf32>):
      %9 = lax.constant 2.0 : tensor<f32>
      %10 = lax.mul %7, %9 : (tensor<2xf32>, tensor<f32>) -> tensor<2xf32>
      %11 = lax.constant 1.0 : tensor<f32>
      %12 = lax.add %8, %11 : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32>
      lax.return %10, %12 : tensor<2xf32>, tensor<3xf32>
    }) : (tensor<i32>, tensor<2xf32>, tensor<3xf32>) -> (tensor<2xf32>, tensor<3xf32>)
    func.return %3, %4 : tensor<2xf32>, tensor<3xf32>
  }
}

// CHECK:      %[[PRED:.*]] = lax.convert_element_type
// CHECK:      %[[A:.*]] = lax.cond %[[PRED]], %a ({
// CHECK-NEXT:   ^bb0(%[[X:.*]]: tensor<2xf32>):
// CHECK-NEXT:     lax.return %[[X]] : tensor<2xf32>
// CHECK:          lax.mul
// CHECK-NOT:      lax.add
// CHECK:        }) : (tensor<i32>, tensor<2xf32>) -> tensor<2xf32>
// CHECK:      %[[B:.*]] = lax.cond %[[PRED]], %b ({
// CHECK:          lax.add
// CHECK:        }) : (tensor<i32>, tensor<3xf32>) -> tensor<3xf32>
// CHECK:      func.return %[[A]], %[[B]] : tensor<2xf32>, tensor<3xf32>

// -----

// Results that share a value computed under the cond (a global norm, say)
// stay in one cond.
builtin.module {
  func.func @main(%a: tensor<2xf32>, %b: tensor<2xf32>, %p: tensor<i32>) -> (tensor<2xf32>, tensor<2xf32>) {
    %0, %1 = lax.cond %p, %a, %b ({
    ^bb0(%2: tensor<2xf32>, %3: tensor<2xf32>):
      lax.return %2, %3 : tensor<2xf32>, tensor<2xf32>
    }, {
    ^bb0(%4: tensor<2xf32>, %5: tensor<2xf32>):
      %6 = lax.add %4, %5 : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
      %7 = lax.mul %4, %6 : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
      %8 = lax.mul %5, %6 : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
      lax.return %7, %8 : tensor<2xf32>, tensor<2xf32>
    }) : (tensor<i32>, tensor<2xf32>, tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>)
    func.return %0, %1 : tensor<2xf32>, tensor<2xf32>
  }
}

// CHECK:      %{{.*}}, %{{.*}} = lax.cond %p, %a, %b ({
// CHECK:      }) : (tensor<i32>, tensor<2xf32>, tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>)
// CHECK-NOT:  lax.cond
